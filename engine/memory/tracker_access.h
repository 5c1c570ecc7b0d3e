// The MemoryTracker's calls only the Trainer makes, around its CUDA graphs. Not installed: a loop of
// the user's own runs eagerly and makes the tracker's public calls.
#pragma once

#include <cstdint>

#include "cumulus/memory/tracker.h"

namespace cumulus::memory {

struct MemoryTrackerAccess {
  // A micro-batch or step replayed as a CUDA graph: a replay allocates nothing, so its memory is
  // what the capture measured (`captured`, its epoch and index set); it counts in the summary like
  // any other, without times.
  static void add_graph_micro_batch(MemoryTracker& tracker, const MicroBatchRecord& captured);
  static void add_graph_step(MemoryTracker& tracker, int64_t step, int64_t optimizer_state_bytes);
  // Whether the first optimizer steps are being recorded as a timeline (graphs stay off then).
  static bool timeline_active(const MemoryTracker& tracker);
};

}  // namespace cumulus::memory
