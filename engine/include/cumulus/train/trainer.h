// Trainer: the training API, the one driver of a training loop. One object runs a user's
// micro-batches and optimizer steps (normalization, clipping, the LR schedule, loss scaling),
// records the memory tracker itself, replays CUDA graphs when asked, exposes its counters for
// checkpoints and changes the accumulation steps mid-run without restarting the schedule or the
// step count: what Lightning's Trainer(accumulate_grad_batches=...) gives a PyTorch user, around
// the user's own loop. See Note [Training API] and Note [Captured training] in engine/train/trainer.cpp.
//
//   train::TrainerOptions options;
//   options.accum_steps = 4;              // or options.schedule = {{0, 8}, {4, 2}} (per epoch)
//   options.clip_grad_norm = 1.0f;
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
// Or, for the common loop over a DataLoader, one call per epoch (the same calls, made for you):
//   auto loss = [&](const data::Batch& b) { return ops::cross_entropy(model(b.x), b.y, ops::Reduction::Sum); };
//   for each epoch: trainer.train_epoch(loader, epoch, loss);
// and with EpochOptions, a resume inside an epoch, progress and step hooks, and a stop at a group
// boundary (for a checkpoint there): trainer.train_epoch(loader, epoch, loss, {first, stop, ...}).
// evaluate_classifier(model, test_loader) is a test pass, plan_request(...) a planner's request.
//
// Units (Note [Units] in engine/train/trainer.cpp): the closure returns the loss summed over the
// `units` units it is given, units the user names: samples for a classifier (the default, one per
// dataset row), tokens for a language model whose loss sums over B x T tokens
// (TensorDataset::set_units_per_row(T); DataLoader::units(i) and Batch::units count them). Every
// step divides by the units of its group, so the update is the mean gradient per unit, and the
// planner's request (plan_request) and the memory tracker count the same units. With use_graphs
// the closure must queue the same work every time for a given unit count: its inputs come from device-side state
// (DataLoader::next), never from host values that change between calls. On the CPU, or with
// use_graphs false, everything runs eagerly through the same calls, with the same bits as a loop
// that computes each loss itself and calls backward(loss, units) (tests/test_trainer.cpp checks it).
#pragma once

#include <cstddef>
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

// A batch's loss summed over its units (ops::Reduction::Sum over batch.units: its samples, or its
// tokens), as the Trainer's closures return it.
using BatchLoss = std::function<Tensor(const data::Batch& batch)>;

// What TrainerOptions::on_step is told after each optimizer step.
struct StepLog {
  int64_t step = 0;  // optimizer steps taken so far (this one included)
  int epoch = 0;
  // The group's training loss as a mean per unit: its summed loss divided by its units (the
  // micro-batches' unit counts, samples or tokens, added up). Not a sum.
  double loss = 0.0;
  float lr = 0.0f;  // the step's learning rate
};

// What train_epoch's hooks (EpochOptions) are told after micro-batch `index` and its step_if_ready.
struct MicroBatchDone {
  int64_t index = 0;         // the micro-batch just done, from 0 in the epoch
  int64_t units = 0;         // its units (DataLoader::units(index)), whichever rank trained it
  int64_t units_done = 0;    // the units of the micro-batches this call has done, it included (every rank's)
  bool trained_here = true;  // data parallel: false for another rank's micro-batch (skip_micro_batch)
  bool stepped = false;      // a step was attempted after it: the next micro-batch starts a group
};

// train_epoch's options beyond the plain loop: a resume inside the epoch, hooks for progress and
// checkpoints, and a stop at a group boundary (Lightning's callbacks and should_stop, for one epoch).
struct EpochOptions {
  // The micro-batch to start at: 0, or a group boundary a checkpoint recorded (TrainingCounters::
  // micro_batch_index) when resuming inside the epoch, with restore() called before.
  int64_t first = 0;
  // Asked at every group boundary before micro-batch `next` (from `first` on; not after the epoch's
  // last): true ends the call there, the group in flight stepped, so what a checkpoint written then
  // holds is exactly what was trained. A request made mid-group thus waits for the group's end.
  // Data parallel: asked on every rank at the same boundaries (it may be a collective).
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
  // The mean training loss per unit of the groups stepped since begin_epoch (this call's: one
  // device read).
  double loss = 0.0;
};

struct TrainerOptions : AccumulationOptions {
  // Replays each micro-batch and the step's device part as CUDA graphs (needs the parameters on a
  // CUDA device and a single rank); off, every call runs eagerly.
  bool use_graphs = false;
  // Records every micro-batch and optimizer step (MemoryTracker's calls, made by the Trainer). Not
  // owned; may be null (no records), or attached later with set_tracker().
  memory::MemoryTracker* tracker = nullptr;
  // Called after every optimizer step taken (step_if_ready, flush, train_epoch), as a per-step log
  // (Lightning's log every step). Reads the device (the group's loss): one synchronization per step,
  // so leave it empty where steps should not wait.
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

  // Starts an epoch of `micro_batches` micro-batches (0: unknown; call flush() at its end), from
  // micro-batch `first` (> 0 when resuming inside an epoch, at a group boundary).
  void begin_epoch(int epoch, int64_t micro_batches = 0, int64_t first = 0);
  // Forward (the closure returns the loss summed over `units` units: samples, tokens), backward
  // into the gradient buffers, the accumulation's bookkeeping and the tracker's record (of `units`).
  void micro_batch(int64_t units, const std::function<Tensor()>& forward_loss);
  // The eager form, for a loss computed by the caller: backward of a loss summed over `units` units,
  // accumulated into the gradient buffers; the unit count and the loss value are added to the step
  // state on the device (no host read). No tracker record, no graph. Normalization units and
  // micro_batches divide by the units themselves, so a loss known to be a mean (cross_entropy with
  // Reduction::Mean, ops::mean) is refused with InvalidArgument (Note [Mean-reduced losses] in
  // engine/train/trainer_accumulation.cpp); Normalization::none takes any loss.
  void backward(const Tensor& loss, int64_t units);
  // Data parallel: counts a micro-batch another rank processes (dist::owner_of_micro_batch).
  void skip_micro_batch();
  // Whether step_if_ready() would step now (the group is complete: N micro-batches, or the epoch's last).
  bool ready() const;
  // Steps if the group is complete; returns whether a step was attempted (taken, or skipped on the
  // device for a non-finite gradient).
  bool step_if_ready();
  // Steps on whatever the group holds (a partial group); returns false if it is empty.
  bool flush();
  // One epoch of `loader`'s batches as micro-batches, in the order set_epoch(epoch) draws:
  // begin_epoch, then per batch micro_batch with loss(next(i)) (host-resident data staged before
  // it, outside the closure a graph replays) and step_if_ready, so the last group of the epoch
  // steps too; each micro-batch counts its batch's units (Batch::units, DataLoader::units(i)). Data
  // parallel: this rank's micro-batches (dist::owner_of_micro_batch), the others counted by
  // skip_micro_batch. Returns the epoch's mean training loss per unit (TrainingCounters::
  // epoch_loss_sum / epoch_units_stepped: one device read).
  double train_epoch(data::DataLoader& loader, int epoch, const BatchLoss& loss);
  // The same from micro-batch options.first, with options' hooks, stopping early at a group
  // boundary where options.stop asks to (then finished is false and next_micro_batch is where a
  // resumed call starts: EpochOptions::first). A stopped epoch resumed from there (in this Trainer,
  // or in a new one after restore) trains the same bits as one never stopped.
  EpochResult train_epoch(data::DataLoader& loader, int epoch, const BatchLoss& loss, const EpochOptions& options);
  // Groups of `steps` micro-batches from the next group boundary on, for the rest of the run
  // (replacing accum_steps and the per-epoch schedule). Called mid-group it is deferred, never
  // refused: the group in progress keeps its size. The optimizer's step count, the LR schedule's
  // position and the loss scale continue.
  void set_accum_steps(int steps);

  // Where the loop stands: host values only, free to read at any time.
  TrainingPosition position() const;
  // Every counter in one read (on CUDA one wait for the queued work, so read it at a progress
  // refresh or an epoch's end, not per step): everything a checkpoint needs to resume at a group
  // boundary (set_accum_steps' value included) and what a report quotes. The restoration: the
  // optimizer's state (Optimizer::load_state) first, then restore(), then
  // begin_epoch(counters.epoch, micro_batches, counters.micro_batch_index).
  TrainingCounters counters() const;
  void restore(const TrainingCounters& counters);

  dist::Communicator* communicator() const;  // TrainerOptions::communicator (null: one process)
  optim::Optimizer& optimizer();
  // The blocks a Trainer makes at its first step and holds beside every later micro-batch (bytes
  // requested, category other: its learning-rate table), for a planner's PlanRequest::loop_state.
  static std::vector<int64_t> state_to_allocate();

  // Attaches a tracker made after the Trainer (between micro-batches; null detaches).
  void set_tracker(memory::MemoryTracker* tracker);
  memory::MemoryTracker* tracker() const;

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

// A classifier's test pass: every batch of `loader` (x the inputs, y i32 labels) through `model` in
// evaluation mode without gradients (its mode is restored after), PyTorch's `with torch.no_grad()`
// loop. The batches are read with seek(0) and next(i): the loader's cursor is left past the last.
// The totals stay on the device until one read at the end.
struct Evaluation {
  double accuracy = 0.0;  // correct / samples (top-1, ops::argmax's rule)
  double loss = 0.0;      // the mean over batches of each batch's mean cross-entropy ("Avg loss")
  int64_t correct = 0, samples = 0;
};
// `before_batch`, when set, is called with each batch's index before it runs (a progress or an
// interrupt check: an exception it throws ends the pass, the model's mode restored).
Evaluation evaluate_classifier(nn::Module& model, data::DataLoader& loader,
                               const std::function<void(int64_t batch)>& before_batch = {});

// A ready-made planner request (cumulus/plan/planner.h) for training `optimizer`'s parameters with `loss`
// on `dataset`, in the dataset's units (TensorDataset::units_per_row: samples by default, tokens
// for sequences): `effective_batch` is in units (a multiple of units_per_row), the request's
// units_per_row is the dataset's, so every micro-batch it weighs is whole rows, and a probe of u
// units is batch 0 of a loader of batch u / units_per_row rows (the dataset's first rows, made in
// `batch_dtype` on the parameters' device, staged when the dataset is on the host), its loss
// backward into the gradient buffers, the gradients then discarded. Device, optimizer, effective
// batch, budget (reserved bytes; 0: none) and the limit (the dataset's units) are filled in,
// and require_fit (plan_batch throws OutOfMemory with its reason when nothing fits). Its apply
// puts a setting's precision in place as the batches' dtype (setting.precision is batch_dtype's),
// so opting into another is one line (`r.precisions = {Precision::bf16}`); for recompute, set
// recompute_segments and wrap apply. Set model, budget_name or on_table when they apply, or
// require_fit = false.
plan::PlanRequest plan_request(optim::Optimizer& optimizer, const data::TensorDataset& dataset, BatchLoss loss,
                               int64_t effective_batch, int64_t budget = 0, DType batch_dtype = DType::f32);
// The same for a caller whose own apply moves its data (PlanSetting::data, a lever plan_request
// leaves to it): each probe reads the dataset `dataset()` returns then, so it finds the data where
// the last setting put it. The sample limit and the units per row are those of `dataset()` now.
plan::PlanRequest plan_request(optim::Optimizer& optimizer, std::function<data::TensorDataset()> dataset, BatchLoss loss,
                               int64_t effective_batch, int64_t budget = 0, DType batch_dtype = DType::f32);

}  // namespace cumulus::train
