// Trainer: the one driver of a training loop. It runs a user's micro-batches and optimizer steps
// (normalization, clipping, the LR schedule, loss scaling), makes the memory tracker's calls,
// replays CUDA graphs when asked, gives its counters to checkpoints and changes the accumulation
// steps mid-run without restarting the schedule or the step count: Lightning's
// Trainer(accumulate_grad_batches=...) around the user's own loop (Note [Training API], Note
// [Captured training] in engine/train/trainer.cpp).
//
//   train::TrainerOptions options;
//   options.accum_steps = 4;              // or options.schedule = {{0, 8}, {4, 2}} (per epoch)
//   options.tracker = &tracker;           // optional: records every micro-batch and step
//   train::Trainer trainer(optimizer, options, lr_schedule);
//   for each epoch:
//     loader.seek(0);
//     trainer.begin_epoch(epoch, loader.num_batches());
//     for each micro-batch i:
//       trainer.micro_batch(loader.units(i), [&] { data::Batch b = loader.next(i);
//                                                  return ops::cross_entropy(model(b.x), b.y, ops::Reduction::Sum); });
//       trainer.step_if_ready();          // at each group boundary and after the epoch's last micro-batch
//   trainer.set_accum_steps(8);           // any time: from the next group boundary on
//
// The same calls for one epoch over a DataLoader: trainer.train_epoch(loader, epoch, loss), and with
// EpochOptions a resume inside the epoch, hooks and a stop at a group boundary.
//
// Units (Note [Units]): the closure returns the loss summed over the `units` it is given (samples
// by default, tokens with TensorDataset::set_units_per_row(T)); each step divides by its group's
// units. With use_graphs the closure must queue the same work for a given unit count: its inputs
// come from device-side state (DataLoader::next), never from host values that change between calls.
// Eager runs (the CPU, or use_graphs false) give the same bits as a loop calling backward(loss, units).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "cumulus/data/dataset.h"
#include "cumulus/memory/tracker.h"
#include "cumulus/optim/lr_schedule.h"
#include "cumulus/optim/optimizer.h"
#include "cumulus/plan/planner.h"
#include "cumulus/train/accumulation.h"

namespace cumulus::nn {
class Module;
}  // namespace cumulus::nn

namespace cumulus::train {

// A batch's loss summed over its batch.units (ops::Reduction::Sum), as the Trainer's closures return it.
using BatchLoss = std::function<Tensor(const data::Batch& batch)>;

// What TrainerOptions::on_step is told after each optimizer step.
struct StepLog {
  int64_t step = 0;   // optimizer steps taken so far (this one included)
  int epoch = 0;
  double loss = 0.0;  // the group's training loss as a mean per unit, not a sum
  float lr = 0.0f;    // the step's learning rate
};

// What train_epoch's hooks (EpochOptions) are told after micro-batch `index` and its step_if_ready.
struct MicroBatchDone {
  int64_t index = 0;         // the micro-batch just done, from 0 in the epoch
  int64_t units = 0;         // its units (DataLoader::units(index)), whichever rank trained it
  int64_t units_done = 0;    // the units of the micro-batches this call has done, it included (every rank's)
  bool trained_here = true;  // data parallel: false for another rank's micro-batch (skip_micro_batch)
  bool stepped = false;      // a step was attempted after it: the next micro-batch starts a group
};

// train_epoch's resume inside the epoch, hooks and stop (Lightning's callbacks and should_stop).
struct EpochOptions {
  // The micro-batch to start at: 0, or, resuming after restore(), the group boundary a checkpoint
  // recorded (TrainingCounters::micro_batch_index).
  int64_t first = 0;
  // Asked at every group boundary before micro-batch `next` (not after the last): true ends the call
  // there. Data parallel: asked on every rank at the same boundaries (it may be a collective).
  std::function<bool(int64_t next)> stop;
  // After each step attempted (taken, or skipped for a non-finite gradient), then after every
  // micro-batch (its step, if any, included). Neither reads the device.
  std::function<void(const MicroBatchDone&)> on_step;
  std::function<void(const MicroBatchDone&)> on_micro_batch;
};

// What train_epoch(loader, epoch, loss, options) returns.
struct EpochResult {
  bool finished = false;         // every micro-batch done; false: stopped at a group boundary
  int64_t next_micro_batch = 0;  // where it ended: the epoch's micro-batches, or the boundary it stopped at
  double loss = 0.0;             // mean per unit of the groups stepped since begin_epoch (a device read)
};

struct TrainerOptions : AccumulationOptions {
  // Replays micro-batches and the step as CUDA graphs (parameters on a CUDA device, one rank).
  bool use_graphs = false;
  // Records every micro-batch and step. Not owned; may be null, or attached later (set_tracker).
  memory::MemoryTracker* tracker = nullptr;
  // Called after every step attempted, as a per-step log. It reads the device (the group's loss):
  // one synchronization per step, so leave it empty where steps should not wait.
  std::function<void(const StepLog&)> on_step;
};

class Trainer {
 public:
  // `schedule` may be null: the optimizer's own lr is used.
  Trainer(std::shared_ptr<optim::Optimizer> optimizer, const TrainerOptions& options,
          std::shared_ptr<const optim::LRSchedule> schedule = nullptr);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Starts an epoch of `micro_batches` (0: unknown; flush() ends it) at `first` (a resume's boundary).
  void begin_epoch(int epoch, int64_t micro_batches = 0, int64_t first = 0);
  // Forward (the closure's loss, summed over `units`), backward, the counters and the tracker's record.
  void micro_batch(int64_t units, const std::function<Tensor()>& forward_loss);
  // The eager form for a loss the caller computed: no tracker record, no graph. The step divides by
  // the units, so InvalidArgument refuses a loss divided already (a mean, a sum scaled by a constant)
  // and units other than the positions its cross-entropy summed (engine/train/loss_checks.cpp).
  void backward(const Tensor& loss, int64_t units);
  // Data parallel: counts a micro-batch another rank processes (dist::owner_of_micro_batch).
  void skip_micro_batch();
  // Whether step_if_ready() would step now: N micro-batches in the group, or the epoch's last done.
  bool ready() const;
  // Steps if ready(); returns whether a step was attempted (taken, or skipped for a non-finite gradient).
  bool step_if_ready();
  // Steps on whatever the group holds (a partial group); returns false if it is empty.
  bool flush();
  // One epoch of `loader`'s batches in set_epoch(epoch)'s order, each micro_batch(units(i),
  // loss(next(i))) then step_if_ready (host data staged outside a graph; data parallel: this rank's,
  // skip_micro_batch for the others'). Returns the epoch's mean loss per unit (a device read).
  double train_epoch(data::DataLoader& loader, int epoch, const BatchLoss& loss);
  // The same from options.first with its hooks, ending at a boundary where options.stop asks to;
  // resumed from next_micro_batch (after restore, in a new Trainer too), it trains the same bits.
  EpochResult train_epoch(data::DataLoader& loader, int epoch, const BatchLoss& loss, const EpochOptions& options);
  // Groups of `steps` from the next group boundary on, for the rest of the run (replacing the
  // options' steps and schedule); the step count, the LR schedule and the loss scale continue.
  void set_accum_steps(int steps);

  // Where the loop stands: host values only, free to read at any time.
  TrainingPosition position() const;
  // Every counter in one read: on CUDA one wait for the queued work, so not per step. To resume:
  // Optimizer::load_state, restore(), begin_epoch(counters.epoch, n, counters.micro_batch_index).
  TrainingCounters counters() const;
  void restore(const TrainingCounters& counters);

  optim::Optimizer& optimizer();
  // The optimizer's state whole, as a checkpoint holds it. With zero_stage 1 a collective (every
  // rank calls it): the root gets every rank's shard gathered (Note [ZeRO]), the others nothing.
  std::vector<std::pair<std::string, Tensor>> optimizer_state() const;
  // The bytes a Trainer holds from its first step on (its LR table and its step state), for
  // PlanRequest::loop_state.
  static std::vector<int64_t> state_to_allocate();

  // Attaches a tracker made after the Trainer (between micro-batches; null detaches).
  void set_tracker(memory::MemoryTracker* tracker);

  struct Stats {
    int64_t eager_micro_batches = 0, replayed_micro_batches = 0;
    int64_t eager_steps = 0, replayed_steps = 0;
    int64_t captures = 0;
    int64_t kernels_per_micro_batch = 0;  // in the last micro-batch graph captured
    int64_t kernels_per_step = 0;
  };
  const Stats& stats() const;
  // Frees every graph (their memory returns to the general cache). Later calls capture afresh.
  void reset();

 private:
  struct Parts;     // everything else a Trainer holds (engine/train/trainer_parts.h)
  struct Captured;  // a micro-batch's or the step's CUDA graph
  void eager_micro_batch(int64_t units, const std::function<Tensor()>& forward_loss);
  void graph_micro_batch(Captured& c, int64_t units, const std::function<Tensor()>& forward_loss);
  bool step(bool only_if_ready);
  void run_step();
  // The host side of backward(): the checks and the counters (a replayed micro-batch runs only these).
  void check_micro_batch(int64_t units, const char* caller) const;
  void count_micro_batch(int64_t units);
  void check_accum_steps(int steps, const char* caller) const;
  bool distributed() const;

  std::unique_ptr<Parts> parts_;
};

// A classifier's test pass (PyTorch's no_grad loop): `loader`'s batches (x, y i32 labels) read with
// seek(0) and next(i) through `model` in evaluation mode (restored after); one device read at the end.
struct Evaluation {
  double accuracy = 0.0;  // correct / samples (top-1, ops::argmax's rule)
  double loss = 0.0;      // the mean over batches of each batch's mean cross-entropy ("Avg loss")
  int64_t correct = 0, samples = 0;
};
// `before_batch`, when set, is called with each batch's index first (an interrupt check may throw).
Evaluation evaluate_classifier(nn::Module& model, data::DataLoader& loader,
                               const std::function<void(int64_t batch)>& before_batch = {});

// A planner request for training `optimizer`'s parameters with `loss` on `dataset`, in its units
// (`effective_batch` a multiple of units_per_row; micro-batches of whole rows): a probe is the first
// rows in `batch_dtype`, backward, the gradients discarded; budget in reserved bytes (0: none);
// require_fit set. Its apply sets the batches' dtype from a setting's precision, so opting into
// bf16 is `r.precisions = {Precision::bf16}`; for recompute, set recompute_segments and wrap apply.
plan::PlanRequest plan_request(optim::Optimizer& optimizer, const data::TensorDataset& dataset, BatchLoss loss,
                               int64_t effective_batch, int64_t budget = 0, DType batch_dtype = DType::f32);
// The same for a caller whose own apply moves its data (PlanSetting::data): each probe reads the
// dataset `dataset()` returns then; the limit and the units per row are those it returns now.
plan::PlanRequest plan_request(optim::Optimizer& optimizer, std::function<data::TensorDataset()> dataset,
                               BatchLoss loss, int64_t effective_batch, int64_t budget = 0,
                               DType batch_dtype = DType::f32);

}  // namespace cumulus::train
