// MemoryTracker: per micro-batch, the activation footprint (bytes held for backward at the end of
// forward), the peak during forward + backward with its split by category, reserved bytes and
// times; per optimizer step its time and the optimizer-state bytes; a summary with the fixed costs,
// the activation bytes per unit and the peak of micro-batch B x N against batch B*N. It reads
// the caching allocator's counters, which the engine keeps by category anyway, so tracking costs
// a few counter reads per phase (docs/ARCHITECTURE.md, "Memory accounting").
//
// Sizes are in units: what the training loss is summed over and the Trainer is given (samples by
// default, tokens for a language model; Note [Units] in engine/train/trainer.cpp). A tracker told
// micro-batches of N units (Options::micro_batch_size) checks what it is fed: a micro-batch of more
// than N units warns once on stderr naming both counts (or throws InvalidArgument with
// strict_units), and a summary without a micro-batch of N units says so (MemorySummary::warning,
// printed by print_memory_table) instead of reporting zeros.
//
// The Trainer makes its calls (TrainerOptions::tracker); a loop of the user's own makes them
// itself:
//   tracker.begin_micro_batch(epoch, index, units); forward; tracker.end_forward();
//   backward; tracker.end_backward();
//   if stepping: tracker.begin_step(); step; tracker.end_step(step, optimizer.state_bytes());
// begin_micro_batch and begin_step reset the allocator's peak counters.
//
// For the first `timeline_steps` optimizer steps it also records a timeline (every allocation and
// free, and the phases) for the Chrome trace and the SVG plot; during that window it synchronizes
// the device at phase boundaries so the phase times are true on CUDA too.
//
// Epochs are passed and kept as the Trainer counts them, from 0; every report prints them from 1,
// as the apps' screen output and metrics do.
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
  // Live bytes by category when the micro-batch began: what it found, not what it made.
  std::array<int64_t, kNumMemoryCategories> start_by_category{};
  int64_t reserved_bytes = 0;
  double forward_ms = 0.0;
  double backward_ms = 0.0;
  // Activation checkpointing (Note [Recompute] in engine/autograd/checkpoint.cpp); all 0 without.
  int64_t recompute_segments = 0;  // segments recomputed during this micro-batch's backward
  // Activations the recomputations held at the end of their forwards, summed (what a stored run
  // keeps for these segments, their outputs included).
  int64_t recomputed_bytes = 0;
  // What the stored run would have kept in addition at the end of forward: activation_bytes +
  // recompute_avoided_bytes is the footprint without recompute.
  int64_t recompute_avoided_bytes = 0;
  double recompute_ms = 0.0;  // the recomputed forwards' time, part of backward_ms
};

struct StepRecord {
  int64_t step = 0;
  int epoch = 0;  // of the micro-batch before it, from 0
  double ms = 0.0;
  int64_t optimizer_state_bytes = 0;
  int64_t peak_bytes = 0;
  // Data parallel: the time of the step's gradient reductions (0 alone): MPI's host wait, NCCL's
  // device time (Note [Communication time] in engine/dist/communicator.cpp).
  double communication_ms = 0.0;
};

struct MemorySummary {
  int64_t parameters_bytes = 0;
  int64_t gradients_bytes = 0;
  int64_t optimizer_state_bytes = 0;
  int64_t workspace_bytes = 0;
  int64_t data_bytes = 0;  // live now: the datasets (batches come and go)
  // The data a micro-batch of micro_batch_size units made at its peak: its batch (gathered by a
  // loader, or built in the Trainer's closure: Note [A user's tensors in a micro-batch]).
  int64_t batch_data_bytes = 0;
  double activation_bytes_per_unit = 0.0;  // least-squares slope of activation bytes on units
  int64_t peak_bytes = 0;                  // highest peak of any micro-batch or step
  int64_t reserved_peak_bytes = 0;
  // The accumulation comparison: peak at micro-batch B (x N steps) against one batch of B*N.
  int64_t micro_batch_size = 0;
  int accum_steps = 1;
  int64_t peak_at_micro_batch = 0;
  int64_t peak_at_effective_batch = 0;
  // false: predicted from the micro-batch's growth per unit (Note [One batch's peak] in
  // engine/memory/tracker.cpp), as the planner predicts.
  bool effective_batch_measured = false;
  // Why the per-micro-batch figures may not be what they seem, naming the counts: micro-batches of
  // more units than micro_batch_size were fed, or none of micro_batch_size units was (so the peak
  // at the micro-batch is not measured). Empty when the sizes agree.
  std::string warning;
};

// An out-of-memory the allocator threw while this tracker ran (its last), with what the tracker
// was doing then: the micro-batch (or step) in progress and its phase.
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
    // Micro-batch and step records kept in detail (the first ones); every micro-batch still counts
    // in the summary. Bounds the report: a 20-epoch run has 75,000 micro-batches of 16.
    std::size_t max_records = 10000;
    // Free-form facts for the report's "annotations" object (e.g. where batch norm took its
    // statistics from).
    std::map<std::string, std::string> annotations;
    // The run's settings (optimizer, learning rate, epochs, ...), written in this order as the
    // report's "settings" object.
    std::vector<std::pair<std::string, std::string>> settings;
    // A micro-batch of more units than micro_batch_size throws InvalidArgument naming both (the
    // default warns once on stderr and in the summary: trackers may measure several sizes). Last,
    // so positional initializers {model, micro_batch_size, accum_steps} keep their meaning.
    bool strict_units = false;
  };

  MemoryTracker(Device device, Options options);
  ~MemoryTracker();
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  // `units`: what the micro-batch's loss sums over (samples, tokens), checked against
  // micro_batch_size (see above).
  void begin_micro_batch(int epoch, int64_t index, int64_t units);
  void end_forward();
  void end_backward();
  void begin_step();
  // `communication`: data parallel, the spans of the step's gradient reductions
  // (dist::Communicator::take_recent_spans), read with the step's other device times.
  void end_step(int64_t step, int64_t optimizer_state_bytes, TimeSpans communication = {});
  // A micro-batch or step that ran as a CUDA graph replay (train::Trainer): nothing is
  // allocated during a replay, so its memory is what the capture measured (`captured`, with its
  // epoch and index set); it counts in the summary like any other, without times.
  void add_graph_micro_batch(const MicroBatchRecord& captured);
  void add_graph_step(int64_t step, int64_t optimizer_state_bytes);
  // Whether the first optimizer steps are being recorded as a timeline (graphs stay off then).
  bool timeline_active() const { return in_timeline_window(); }

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
  // Recomputations of checkpointed segments inside the backward slices (host clock; each with
  // the activations it held), over the timeline window.
  const std::vector<TimelineSlice>& recompute_slices() const;
  MemorySummary summary();
  // The allocator's last out-of-memory, if it happened after this tracker was created. The
  // summary's peak_bytes counts the peak reached up to it.
  std::optional<TrackedOutOfMemory> out_of_memory() const;

  // The planner's prediction for the plan this run trains with (cumulus/plan/plan_check.h): the memory
  // report writes it as its "planner" object, after "summary". None until given; giving it again
  // replaces it.
  void set_plan_check(plan::PlanCheck check);
  // The measurement that checks it: `epoch` from 0, its training seconds and allocated peak.
  // Throws InvalidArgument when no plan check was given.
  void measure_plan(int epoch, double epoch_seconds, int64_t peak_bytes);
  const std::optional<plan::PlanCheck>& plan_check() const;

 private:
  struct State;  // what the tracker keeps (engine/memory/tracker.cpp)
  class Observer;
  double host_ms() const;
  bool in_timeline_window() const;
  void resolve_times();
  void check_units(int64_t units);
  void count_micro_batch(const MicroBatchRecord& r, const TimePoint* times,
                         std::vector<std::pair<TimePoint, TimePoint>> recompute_times = {});
  void count_step(const StepRecord& s, const TimePoint* times, TimeSpans communication = {});
  void sample_timeline();

  std::unique_ptr<State> s_;
};

}  // namespace cumulus::memory
