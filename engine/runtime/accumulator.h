// Accumulator: the gradient-accumulation policy around an optimizer. See Note [Exact
// normalization] in engine/runtime/accumulator.cpp and docs/ARCHITECTURE.md, "Gradients and accumulation".
//
//   acc.begin_epoch(epoch, micro_batches_in_epoch);
//   for each micro-batch:
//     acc.backward(cross_entropy(model(x), y, Reduction::Sum), x.size(0));  // units: here samples
//     acc.step_if_ready();     // steps at each group boundary and after the epoch's last micro-batch
//
// Internal to the runtime: optim::Trainer (cumulus/runtime/trainer.h), the public driver, owns one
// and adds the memory tracker's records, CUDA graphs and the closure-per-micro-batch form. The
// tests check this policy directly and the benchmarks time its parts; nothing installed declares it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "cumulus/optim/lr_schedule.h"
#include "cumulus/optim/optimizer.h"
#include "cumulus/runtime/accumulation.h"

namespace cumulus::optim {

class Accumulator {
 public:
  // `schedule` may be null: the optimizer's own lr is used.
  Accumulator(std::shared_ptr<Optimizer> optimizer, const AccumulationOptions& options,
              std::shared_ptr<const LRSchedule> schedule = nullptr);

  // Starts an epoch of `micro_batches` micro-batches (0: unknown; call flush() at its end), from
  // micro-batch `first` (> 0 when resuming inside an epoch, at a group boundary).
  void begin_epoch(int epoch, int64_t micro_batches = 0, int64_t first = 0);
  // Backward of a loss summed over `units` units (samples, tokens: whatever the loss sums over),
  // accumulating into the gradient buffers; the unit count and the loss value are added to the
  // step state on the device (no host read). Normalization units and micro_batches divide by the
  // units themselves, so a loss known to be
  // a mean (cross_entropy with Reduction::Mean, ops::mean) is refused with InvalidArgument (Note
  // [Mean-reduced losses] in engine/runtime/accumulator.cpp); Normalization::none takes any loss.
  void backward(const Tensor& loss, int64_t units);
  // Data parallel: counts a micro-batch that another rank processes (dist::owner_of_micro_batch),
  // so every rank sees the same group boundaries.
  void skip_micro_batch();
  // Steps if the group is complete (N micro-batches, or the epoch's last); returns whether a step
  // was attempted (taken or skipped as non-finite).
  bool step_if_ready();
  // Whether step_if_ready() would step now (for callers that time or trace the step).
  bool ready() const;
  // Steps on whatever the group holds (a partial group); returns false if it is empty.
  bool flush();
  // Groups of `steps` micro-batches from the next group boundary on (at once when the group is
  // empty; mid-group the group in progress keeps its size), for the rest of the run: it replaces
  // accum_steps and the per-epoch schedule, and counters() carries it. The optimizer's step count,
  // the LR schedule's position and the loss scale go on (a new Accumulator would restart them).
  void set_accum_steps(int steps);

  // ---- counters a report can quote ----
  // Host-side ones are free. Those marked (device) read the step state: on CUDA they wait for the
  // queued work (one host synchronization), so read them at a progress refresh or an epoch end,
  // not per step.
  int epoch() const { return epoch_; }
  int accum_steps() const { return accum_steps_; }            // N for the current epoch
  int64_t micro_batch_index() const { return mb_in_epoch_; }  // micro-batches done this epoch
  int64_t micro_batches_total() const { return mb_total_; }
  int64_t attempted_steps() const { return attempted_; }     // steps attempted (taken or skipped)
  int64_t optimizer_steps() const;                           // (device) steps taken
  int64_t skipped_steps() const;                             // (device) steps skipped as non-finite
  int64_t units_in_group() const { return group_samples_; }  // this rank's units (backward's counts)
  int micro_batches_in_group() const { return group_mbs_; }  // every rank's
  // (device) Global L2 norm of the normalized gradient before clipping, at the last step; NaN when
  // the step did not compute it (no clipping and no non-finite guard).
  float last_grad_norm() const;
  float last_clip_factor() const;
  float last_lr() const;
  // (device) The loss scale the next group's backward uses (1 without dynamic loss scaling).
  float loss_scale() const;
  // (device) Summed training loss, and units, of the groups stepped since begin_epoch(): their
  // ratio is the epoch's mean loss per unit.
  double epoch_loss_sum() const;
  double epoch_units_stepped() const;
  Optimizer& optimizer() { return *optimizer_; }
  // Whether a communicator of more than one rank is attached (data parallel).
  bool distributed() const;
  // Data parallel: the gradient buckets each step reduces, and how many of all steps' buckets so far
  // started while a backward was still running (the rest started at the step).
  std::size_t gradient_buckets() const { return buckets_.size(); }
  // Not part of the Accumulator's state: collectives and timing change it, not the accumulation.
  dist::Communicator* communicator() const { return options_.communicator.get(); }
  int64_t buckets_started_in_backward() const { return buckets_in_backward_; }

  TrainingCounters counters() const;
  // Restores counters at a group boundary (nothing accumulated); begin_epoch() follows. The
  // optimizer's own state (load_state) is restored first.
  void restore(const TrainingCounters& counters);
  // The blocks an Accumulator makes at its first step and holds beside every later micro-batch
  // (bytes requested, category other): its learning-rate table. A planner holds them in every
  // prediction, as it holds the optimizer's state (PlanRequest::loop_state).
  static std::vector<int64_t> state_to_allocate();

  // ---- the step in three parts, for Trainer's CUDA graphs (engine/runtime/trainer.cpp) ----
  // Host work before the device part: zeroes stale gradient slots and keeps the learning-rate
  // table valid (rarely a host read, never during a capture: it runs eagerly before every step).
  void prepare_step_host();
  // The device part: the norm, the decision and the update (two launches on CUDA). Capturable.
  void launch_step();
  // Host bookkeeping after it: marks gradients stale and clears the group.
  void finish_step_host();

 private:
  friend class Trainer;
  // The host side of backward(), alone (for a replayed micro-batch): the checks, the counters.
  void check_micro_batch(int64_t units) const;
  // Refuses a loss known to be mean-reduced (Note [Mean-reduced losses]).
  static void check_summed_loss(const Tensor& loss);
  void check_accum_steps(int steps, const char* caller) const;
  void count_micro_batch(int64_t units);
  bool do_step();
  kernels::StepState read_state() const;
  // Whether the micro-batch being counted next is this rank's last in its group.
  bool last_own_micro_batch_in_group() const;
  void plan_buckets();
  void start_bucket(std::size_t bucket);
  // Sums the gradient (the buckets not started yet) and the group's sample and loss sums across
  // ranks: the step's one reduction.
  void reduce_across_ranks();
  void write_lr_table(int64_t base_update);
  // The backward seed tensor holding `value`, on the loss's device: kept, so an eager backward
  // launches no fill and a captured one reads it from memory that outlives the graph.
  Tensor backward_seed(float value, const Tensor& loss);

  std::shared_ptr<Optimizer> optimizer_;
  AccumulationOptions options_;
  std::shared_ptr<const LRSchedule> schedule_;
  int epoch_ = 0;
  int accum_steps_ = 1;
  int accum_override_ = 0;  // set_accum_steps' value (0: none); accum_steps_ takes it at a boundary
  int64_t mb_in_epoch_ = 0, mb_epoch_len_ = 0, mb_total_ = 0;
  int64_t attempted_ = 0;
  int64_t group_samples_ = 0;  // units
  int group_mbs_ = 0;
  // The learning-rate table the device reads (Note [Learning-rate table] in accumulator.cpp).
  Tensor lr_table_;
  int64_t lr_table_size_ = 0;
  int64_t lr_table_base_ = 0;        // the update count lr_table_[0] is for
  float lr_table_constant_ = -1.0f;  // without a schedule: the lr the one-entry table holds
  static constexpr std::size_t kMaxSeeds = 8;
  std::vector<std::pair<float, Tensor>> seeds_;  // backward_seed's tensors, by value
  // What the host knows of the device's update count: as of the last read, plus the attempts
  // since (each may have updated or not).
  mutable int64_t known_updates_ = 0;
  mutable int64_t attempts_since_read_ = 0;
  int64_t steps_offset_ = 0;  // optimizer updates not made by this accumulator (before restore)
  // Data parallel buckets: slot ranges [first_slot, end_slot), in reverse slot order (backward's).
  struct Bucket {
    std::size_t first_slot, end_slot;
    int64_t offset, count;  // elements of the flat gradient
    int slots_pending = 0;  // slots the current backward has not finished
  };
  std::vector<Bucket> buckets_;
  std::size_t next_bucket_ = 0;  // buckets [0, next_bucket_) are started for this step
  int64_t buckets_in_backward_ = 0;
  std::vector<std::size_t> bucket_of_slot_;
  std::map<const void*, std::size_t> slot_of_leaf_;
};

class Trainer;
// The Trainer's own Accumulator, for tests and benchmarks that drive its parts (defined in trainer.cpp).
Accumulator& accumulator_of(Trainer& trainer);

}  // namespace cumulus::optim
