// MemoryTracker: per micro-batch the activation footprint (bytes held for backward at the end of
// forward), the peak of forward + backward by category, reserved bytes and times; per optimizer
// step its time and the optimizer state; a summary with the fixed costs, the activation bytes per
// unit and the peak of micro-batch B x N against batch B*N. It reads the caching allocator's
// counters, so tracking costs a few counter reads per phase (docs/memory.md).
//
// Sizes are in units, what the loss sums over (Note [Units] in engine/train/trainer.cpp). Told
// micro-batches of N units (Options::micro_batch_size), it checks what it is fed: a larger one warns
// once on stderr naming both counts (throws with strict_units), and a summary without one of N
// units says so (MemorySummary::warning) instead of reporting zeros.
//
// The Trainer makes its calls (TrainerOptions::tracker); a loop of the user's own makes them itself:
//   tracker.begin_micro_batch(epoch, index, units); forward; tracker.end_forward();
//   backward; tracker.end_backward();
//   if stepping: tracker.begin_step(); step; tracker.end_step(step, optimizer.state_bytes());
// begin_micro_batch and begin_step reset the allocator's peak counters.
//
// For the first `timeline_steps` optimizer steps it also records a timeline (every allocation and
// free, and the phases) for the trace and the plot, synchronizing the device at phase boundaries
// so the phase times are true on CUDA too. Epochs count from 0; every report prints them from 1.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cumulus/core/timer.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/plan/plan_check.h"

namespace cumulus::memory {

struct MicroBatchRecord {
  int epoch = 0;                 // from 0 (reports add 1)
  int64_t index = 0;             // within the epoch
  int64_t units = 0;             // what begin_micro_batch was given (samples, tokens)
  int64_t activation_bytes = 0;  // activations at the end of forward, above those at its start
  int64_t peak_bytes = 0;        // allocated peak during forward + backward
  std::array<int64_t, kNumMemoryCategories> peak_by_category{};
  std::array<int64_t, kNumMemoryCategories> start_by_category{};  // live when it began
  int64_t reserved_bytes = 0;
  double forward_ms = 0.0;
  double backward_ms = 0.0;
  // Activation checkpointing (Note [Recompute] in engine/autograd/checkpoint.cpp); all 0 without.
  int64_t recompute_segments = 0;  // segments recomputed during this micro-batch's backward
  int64_t recomputed_bytes = 0;  // activations the recomputations held at the end of their forwards
  // activation_bytes + recompute_avoided_bytes: the footprint without recompute.
  int64_t recompute_avoided_bytes = 0;
  double recompute_ms = 0.0;  // the recomputed forwards' time, part of backward_ms
};

struct StepRecord {
  int64_t step = 0;
  int epoch = 0;  // of the micro-batch before it, from 0
  double ms = 0.0;
  int64_t optimizer_state_bytes = 0;
  int64_t peak_bytes = 0;
  // Data parallel: the step's gradient reductions (Note [Communication time] in engine/dist/communicator.cpp).
  double communication_ms = 0.0;
};

struct MemorySummary {
  int64_t parameters_bytes = 0;
  int64_t gradients_bytes = 0;
  int64_t optimizer_state_bytes = 0;
  // Optimizer state placed on the host (optim::Optimizer::place_state): live now in
  // host_state_allocator()'s pool, outside the device's figures and budget.
  int64_t host_optimizer_state_bytes = 0;
  int64_t workspace_bytes = 0;
  // CUDA, when the summary is taken: device memory the allocator never held (the context, the
  // libraries, another process on the device), and of it the local memory the context reserves
  // for kernels' stack frames, estimated (Note [Memory outside the allocator] in
  // engine/core/cuda_context.cpp; not read under CUMULUS_CUDA_MEMORY_OUTSIDE=0). 0 on the CPU.
  int64_t outside_allocator_bytes = 0;
  int64_t context_local_memory_bytes = 0;
  int64_t data_bytes = 0;  // live now: the datasets (batches come and go)
  int64_t batch_data_bytes = 0;  // data a micro-batch of micro_batch_size made by its peak: its batch
  double activation_bytes_per_unit = 0.0;  // least-squares slope of activation bytes on units
  int64_t peak_bytes = 0;                  // highest peak of any micro-batch or step
  int64_t reserved_peak_bytes = 0;
  // The accumulation comparison: peak at micro-batch B (x N steps) against one batch of B*N.
  int64_t micro_batch_size = 0;
  int accum_steps = 1;
  int64_t peak_at_micro_batch = 0;
  int64_t peak_at_effective_batch = 0;
  bool effective_batch_measured = false;  // false: predicted per unit, as the planner predicts
  // Why the per-micro-batch figures may mislead, naming the counts: larger micro-batches than
  // micro_batch_size were fed, or none of that size (its peak unmeasured). Empty when they agree.
  std::string warning;
};

// The allocator's last out-of-memory while this tracker ran, with the micro-batch or step in progress.
struct TrackedOutOfMemory {
  OutOfMemoryRecord failure;
  bool in_progress = false;  // a micro-batch or an optimizer step had begun and not ended
  const char* phase = "";    // "forward", "backward" or "step" (when in_progress)
  int epoch = 0;             // from 0; of the micro-batch in progress (or the last one, for a step)
  int64_t index = 0;         // the micro-batch's index in its epoch
  int64_t units = 0;
  int64_t step = 0;  // for "step": the step's number
};

struct TimelineSample {
  double ms = 0.0;  // since the tracker started
  std::array<int64_t, kNumMemoryCategories> bytes{};
};

struct TimelineSlice {
  std::string name;  // forward, backward, step; recompute (recompute_slices(), inside a backward)
  double start_ms = 0.0, end_ms = 0.0;
  int epoch = 0;                  // from 0
  int64_t index = 0;              // forward, backward: the micro-batch's index in the epoch; step: the step number
  int64_t bytes = 0;              // recompute: the activations the recomputation held
  double communication_ms = 0.0;  // step: its gradient reductions' time (data parallel)
};

class MemoryTracker {
 public:
  struct Options {
    std::string model = "model";
    int64_t micro_batch_size = 0;  // units (0: not checked)
    int accum_steps = 1;
    int timeline_steps = 8;  // optimizer steps covered by the timeline (0: none)
    // Records kept in detail, the first ones (all count in the summary): 20 epochs are 75,000 of 16.
    std::size_t max_records = 10000;
    // Free-form facts for the report's "annotations" (where batch norm took its statistics, say).
    std::map<std::string, std::string> annotations{};  // {}: {model, size, steps} draws no -Wextra warning
    // The run's settings (optimizer, learning rate, ...), in this order as the report's "settings".
    std::vector<std::pair<std::string, std::string>> settings{};
    // A micro-batch of more units than micro_batch_size throws InvalidArgument instead of warning.
    // Last, so positional initializers {model, micro_batch_size, accum_steps} keep their meaning.
    bool strict_units = false;
  };

  MemoryTracker(Device device, Options options);
  ~MemoryTracker();
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  // `units`: what the micro-batch's loss sums over, checked against micro_batch_size.
  void begin_micro_batch(int epoch, int64_t index, int64_t units);
  void end_forward();
  void end_backward();
  void begin_step();
  // `communication`: data parallel, the step's reductions (dist::Communicator::take_recent_spans).
  void end_step(int64_t step, int64_t optimizer_state_bytes, TimeSpans communication = {});

  const Device& device() const;
  const Options& options() const;
  const std::vector<MicroBatchRecord>& micro_batches();  // the kept records; resolves device times
  const std::vector<StepRecord>& steps();
  // The last micro-batch tracked, kept or not (its times are not resolved).
  const MicroBatchRecord& last_micro_batch() const;
  int64_t micro_batches_seen() const;
  int64_t steps_seen() const;
  const std::vector<TimelineSample>& timeline() const;
  const std::vector<TimelineSlice>& slices() const;
  // Recomputations inside the backward slices, each with the activations it held (host clock).
  const std::vector<TimelineSlice>& recompute_slices() const;
  MemorySummary summary();
  // The allocator's last out-of-memory since this tracker was made (the summary's peak includes it).
  std::optional<TrackedOutOfMemory> out_of_memory() const;

  // The planner's prediction for this run's plan, which the report writes as its "planner" object.
  void set_plan_check(plan::PlanCheck check);
  // The measurement that checks it: `epoch`, its training seconds and allocated peak (InvalidArgument
  // without a plan check).
  void measure_plan(int epoch, double epoch_seconds, int64_t peak_bytes);
  const std::optional<plan::PlanCheck>& plan_check() const;

 private:
  friend struct MemoryTrackerAccess;  // the Trainer's graph replays (engine/memory/tracker_access.h)
  struct State;                       // what the tracker keeps (engine/memory/tracker.cpp)
  std::unique_ptr<State> s_;
};

}  // namespace cumulus::memory
