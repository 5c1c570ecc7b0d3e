// What a Trainer holds: the options, the optimizer and its schedule, where the loop stands
// (GroupPosition), the device-side step state, the learning-rate window, the backward seeds, the
// gradient buckets (data parallel), the tracker and the CUDA graphs; and the step's parts that need
// nothing else (trainer_step.cpp). Internal to the engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "cumulus/optim/lr_schedule.h"
#include "cumulus/optim/optimizer.h"
#include "cumulus/train/trainer.h"
#include "engine/dist/gradient_buckets.h"
#include "engine/dist/sharded_gradients.h"
#include "engine/memory/tracker_access.h"
#include "learning_rate_window.h"
#include "step_state.h"

#if CUMULUS_WITH_CUDA
#include "engine/core/cuda_context.h"
#endif

namespace cumulus::train {

using optim::LRSchedule;
using optim::Optimizer;
using optim::UpdateScalars;

// Where the loop stands, on the host: the epoch, the micro-batch, the group in progress.
struct GroupPosition {
  int epoch = 0;
  int accum_steps = 1;          // N for the current group
  int accum_override = 0;       // set_accum_steps' value (0: none); accum_steps takes it at a boundary
  int64_t in_epoch = 0;         // micro-batches done this epoch
  int64_t epoch_length = 0;     // 0: unknown
  int64_t total = 0;            // micro-batches done in the run
  int64_t attempted_steps = 0;  // steps attempted (taken or skipped)
  int64_t group_units = 0;      // this rank's units in the group
  int group_micro_batches = 0;  // every rank's
  bool ready() const {
    const bool group_full = group_micro_batches >= accum_steps;
    const bool epoch_done = epoch_length > 0 && in_epoch == epoch_length;
    return group_micro_batches > 0 && (group_full || epoch_done);
  }
  // One micro-batch of `units` units (0: another rank's).
  void count(int64_t units) {
    group_units += units;
    group_micro_batches += 1;
    in_epoch += 1;
    total += 1;
  }
  // After a step attempt: a new group starts, of set_accum_steps' size if one was asked for.
  void end_group() {
    ++attempted_steps;
    group_units = 0;
    group_micro_batches = 0;
    if (accum_override > 0) accum_steps = accum_override;
  }
};

// The backward seeds the Trainer keeps, by value (Trainer::backward's Normalization::micro_batches
// seeds 1 / (units * N)): each made once and never written again, so a graph captured with one
// reads the right value at every replay, and never freed under one. Past kMax values a seed is
// made per call.
class BackwardSeeds {
 public:
  Tensor get(float value, const Tensor& loss);

 private:
  static constexpr std::size_t kMax = 8;
  std::vector<std::pair<float, Tensor>> seeds_;
};

// A graph of a micro-batch or of the step's device part (Note [Captured training]).
struct Trainer::Captured {
  int64_t seen = 0;
#if CUMULUS_WITH_CUDA
  cuda::Graph graph;
#endif
  std::vector<bool> stale_after;      // the slots' stale flags after the micro-batch
  const void* frozen_mask = nullptr;  // the step graph: the frozen mask it was captured with
  memory::MicroBatchRecord memory;    // measured while capturing
  bool captured() const {
#if CUMULUS_WITH_CUDA
    return graph.valid();
#else
    return false;
#endif
  }
};

struct Trainer::Parts {
  Parts(std::shared_ptr<Optimizer> optimizer_in, const TrainerOptions& options_in,
        std::shared_ptr<const LRSchedule> schedule)
      : optimizer(std::move(optimizer_in)),
        options(options_in),
        state(optimizer->parameters().device()),
        lr_window(*optimizer, std::move(schedule)),
        use_graphs(options_in.use_graphs),
        tracker(options_in.tracker),
        on_step(options_in.on_step) {}

  // Graphs stay off while the tracker records its timeline, so the trace shows true phases.
  bool graphs_now() const { return use_graphs && !(tracker && memory::MemoryTrackerAccess::timeline_active(*tracker)); }
  std::vector<bool> stale_pattern() const;
  std::vector<bool> frozen_pattern() const;
  enum class Ran { eagerly, captured, replayed };
  // `work` eagerly where `graph` is null or new, captured into it the second time (then launched),
  // replayed after that (Note [Captured training]).
  Ran run_or_replay(Captured* graph, const std::function<void()>& work);
  Captured* step_graph();             // null when the step runs eagerly
  void check_graphs_allowed() const;  // InvalidArgument when graphs meet a host-placed optimizer state
  // The step's parts.
  void reduce_across_ranks();
  // ZeRO-2 (Note [ZeRO stage 2]): a rank with fewer micro-batches in the group reduces zeros.
  void reduce_missing_rounds();
  // The squared norm of the accumulated gradient: of the flat gradient, or all ranks' shards.
  double gradient_sum_of_squares() const;
  // ZeRO (Note [ZeRO]): the optimizer keeps this rank's shard; after an update, the shards gathered.
  void keep_shard();
  void gather_shards();
  void decide_step();
  void decide_sharded_step_cuda(const kernels::StepConfig& config);
  const float* own_shard_gradient() const;
  kernels::StepConfig step_config() const;
  void end_group();
  void log_step();  // on_step, when set
  // The step state and the optimizer's scalars, read with one wait for the device.
  struct Readings {
    kernels::StepState state;
    UpdateScalars scalars;
  };
  Readings read_step() const;

  std::shared_ptr<Optimizer> optimizer;
  AccumulationOptions options;
  GroupPosition position;
  StepStateMemory state;
  LearningRateWindow lr_window;
  BackwardSeeds seeds;
  std::unique_ptr<dist::GradientBuckets> buckets;   // data parallel, ZeRO stage 0 and 1
  std::unique_ptr<dist::ShardedGradients> sharded;  // data parallel reducing every micro-batch (ZeRO stage 2)
  std::vector<dist::Shard> shards;                  // ZeRO: every rank's part of the flat arrays
  int64_t steps_offset = 0;                         // optimizer updates made before this Trainer's run (before restore)

  bool use_graphs;
  memory::MemoryTracker* tracker;  // may be null
  std::function<void(const StepLog&)> on_step;
  double logged_loss = 0.0, logged_units = 0.0;  // the epoch's sums at the last log_step()
  // A micro-batch graph's key: the unit count, the stale pattern of the gradient slots, the frozen
  // pattern of the parameters (which gradients are computed at all), and the backward seed's
  // accumulation steps (Normalization::micro_batches only; 0 otherwise). The sinks' modes (overwrite
  // or accumulate), the gradients computed and the seed are part of the captured work. Seen once:
  // eager; twice: captured, then replayed.
  using GraphKey = std::tuple<int64_t, std::vector<bool>, std::vector<bool>, int>;
  std::map<GraphKey, std::unique_ptr<Captured>> micro_batch_graphs;
  std::unique_ptr<Captured> captured_step;  // made by step_graph()
  Stats stats;
  // The call a loss refusal names: "micro_batch" while one runs (EntryPoint), else "backward".
  const char* caller = "backward";
  // The unit counts whose loss was checked against its positions (Note [Units checked against the
  // loss] in loss_checks.cpp): on a GPU only the first micro-batch of each count reads the device.
  std::set<int64_t> units_checked;
};

// Names `call` in the loss checks' messages while it runs (Trainer::Parts::caller).
class EntryPoint {
 public:
  EntryPoint(const char*& caller, const char* call) : caller_(caller), previous_(caller) { caller_ = call; }
  ~EntryPoint() { caller_ = previous_; }
  EntryPoint(const EntryPoint&) = delete;
  EntryPoint& operator=(const EntryPoint&) = delete;

 private:
  const char*& caller_;
  const char* previous_;
};

}  // namespace cumulus::train
