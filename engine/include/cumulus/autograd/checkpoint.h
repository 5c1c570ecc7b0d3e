// Activation checkpointing (recompute): a segment of the forward that keeps only its input for
// backward and runs again, recording its graph, when backward reaches it. Memory falls by what the
// segment would have saved; time grows by one more forward of the segment. Gradients, running
// statistics included, are bit for bit those of the stored run (Note [Recompute] in
// engine/autograd/checkpoint.cpp). nn::Sequential::set_recompute() is the usual way in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "cumulus/core/timer.h"
#include "cumulus/tensor/tensor.h"

namespace cumulus {

using SegmentFunction = std::function<Tensor(const Tensor&)>;

// Runs `segment(input)` and returns its output. When grad mode is on and `input` or one of
// `parameters` requires grad, the segment runs without recording, and one node ("checkpoint") is
// recorded that holds `input` alone; its backward runs `segment` again from `input` with the graph
// recorded and back-propagates through it, writing parameter gradients into their persistent
// buffers as a stored run would. Otherwise it is just `segment(input)`.
// `parameters`: every tensor requiring grad that `segment` uses other than `input` (a module's
// parameters()); a gradient reaches only these and `input`. `segment` must compute the same
// values when called twice on the same input: ops that update state in a training forward check
// recomputing() (batch norm's running statistics, nn::Dropout's call count).
Tensor checkpoint(const SegmentFunction& segment, const Tensor& input, const std::vector<Tensor>& parameters);

// Whether this thread is recomputing a segment in backward: state a forward updates (running
// statistics, counters) was updated by the first run and must not be updated again.
bool recomputing();

// What recomputation did on this thread, for MemoryTracker (which drains it per micro-batch with
// take_recompute_log()). Bytes are the allocator's (rounded to 512 B), category activations.
struct RecomputeLog {
  int64_t segments_recorded = 0;    // checkpointed forwards (nodes recorded)
  int64_t segments_recomputed = 0;  // recomputations run in backward
  // Per recomputation, the activations its recorded forward held at its end (what the segment
  // would have saved in a stored run, its output included), summed; and the largest one.
  int64_t recomputed_bytes = 0;
  int64_t largest_recomputed_bytes = 0;
  // What the checkpointed forwards held beyond their inputs (their outputs), summed. A stored run
  // would have held recomputed_bytes for these segments: the difference is the saving.
  int64_t kept_bytes = 0;
  // Time of the recomputed forwards (inside backward). On CPU it is resolved as it happens; on
  // CUDA each recomputation leaves a pair of device time points, resolved when read.
  double resolved_ms = 0.0;
  std::vector<std::pair<TimePoint, TimePoint>> pending;
  // Host-clock spans of the recomputations (steady clock, ms since its epoch) with the bytes each
  // held, for the trace; the first kMaxIntervals only.
  struct Interval {
    double host_start_ms = 0.0, host_end_ms = 0.0;
    int64_t bytes = 0;
  };
  static constexpr std::size_t kMaxIntervals = 4096;
  std::vector<Interval> intervals;

  int64_t avoided_bytes() const { return recomputed_bytes - kept_bytes; }
  double recompute_ms();  // resolves `pending` (waits for the device on CUDA)
};

// This thread's log, emptied.
RecomputeLog take_recompute_log();

}  // namespace cumulus
