// The hook through which OpScope (memory/category.h) tells the op time profile
// (cumulus/core/op_profile.h) which op is current: private to the engine.
#pragma once

namespace cumulus::detail {

// The op now current on this thread (`name` nullptr: none), `opened` when a scope opened rather
// than one closing back to it. Does nothing unless an OpProfileScope is open on this thread.
void op_profile_transition(const char* name, bool backward, bool opened);

}  // namespace cumulus::detail
