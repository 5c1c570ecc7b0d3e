// The cumulus version, for reports (memory.json's "versions") and banners.
#pragma once

// Must match project(cumulus VERSION ...) in the root CMakeLists.txt (configuring fails if not),
// so a version bump changes both.
#define CUMULUS_VERSION "0.1.0"
