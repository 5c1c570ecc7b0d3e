// What a training run's accumulation is configured with (AccumulationOptions, inherited by
// train::TrainerOptions) and the counters a checkpoint carries to resume it (TrainingCounters).
// The policy itself (normalization, clipping, the LR schedule, loss scaling, data parallel
// buckets) runs inside train::Trainer: Note [Exact normalization] in engine/train/trainer_step.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace cumulus::dist {
class Communicator;
}

namespace cumulus::train {

enum class Normalization {
  // Default. Losses are summed over units the caller names (samples, tokens, pixels:
  // Reduction::Sum over them); the update divides by the number of units actually in the group. A
  // partial or uneven group is exactly the mean per unit over its units.
  units,
  // The classic convention: each micro-batch's summed loss is divided by its size times the
  // configured accumulation steps N (mean loss / N; its size: the units backward() is given).
  // Inexact when a group holds fewer than N micro-batches (the last of an epoch): its total weight
  // is (micro-batches in it) / N instead of 1, and a shorter micro-batch's units weigh more than the
  // others'.
  micro_batches,
  // The gradient is used as accumulated.
  none,
};

// Dynamic loss scaling (Note [Loss scaling] in engine/train/trainer_step.cpp), for gradients that
// would underflow in 16 bits: backward's seed is the current scale, fixed within a group; a group
// with a non-finite gradient is skipped and halves it, but never below min_scale (it holds there);
// growth_interval clean groups in a row double it. Every factor is a power of two, so unscaling
// (folded into the update) is exact.
struct LossScaling {
  bool dynamic = false;
  float initial_scale = 65536.0f;  // 2^16, torch.amp.GradScaler's default
  int growth_interval = 2000;      // clean steps in a row before the scale grows
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  // The floor: a power of two from 2^-126 (the smallest normal f32) to initial_scale. Below 1 the
  // scale no longer keeps small gradients from underflowing: it only shrinks gradients that
  // overflow unscaled, which a diverging run has (torch.amp.GradScaler, without a floor, goes on
  // down; give 2^-126 for that).
  float min_scale = 1.0f;
};

struct AccumulationOptions {
  int accum_steps = 1;
  // Per-epoch accumulation steps {first_epoch: steps}, as Lightning's
  // GradientAccumulationScheduler; when non-empty it overrides accum_steps. Must have key 0.
  std::map<int, int> schedule;
  Normalization normalization = Normalization::units;
  float clip_grad_norm = 0.0f;  // > 0: clip the normalized gradient's global L2 norm to this
  bool skip_non_finite = true;  // a NaN/Inf in the normalized gradient skips the step
  // Data parallel (Note [Data parallel accumulation] in engine/dist/communicator.cpp): null or a
  // world of one trains alone. With more ranks, accum_steps (and the schedule's steps) count the
  // micro-batches of a global group, all ranks together, and must be a multiple of the world size;
  // every rank calls backward() for its own micro-batches and skip_micro_batch() for the others'.
  std::shared_ptr<dist::Communicator> communicator;
  // Gradient bytes per bucket reduced while backward still runs (whole parameter slots, so a slot
  // larger than this is a bucket of its own).
  int64_t bucket_bytes = 1 << 20;
  // Needs Normalization::units and skip_non_finite.
  LossScaling loss_scaling;
};

// Where the loop stands, kept on the host: Trainer::position() reads it without waiting for the
// device, so a loop may read it at every micro-batch.
struct TrainingPosition {
  int epoch = 0;
  int64_t micro_batch_index = 0;  // micro-batches done this epoch
  int64_t micro_batches_total = 0;
  int accum_steps_override = 0;    // set_accum_steps' value; 0: the options' steps or schedule apply
  int accum_steps = 0;             // N for the group in progress (every rank's micro-batches)
  int micro_batches_in_group = 0;  // every rank's; 0 at a group boundary
  int64_t units_in_group = 0;      // this rank's units so far in the group
  int64_t attempted_steps = 0;     // taken or skipped
};

// Where a run stands, in one read (Trainer::counters(): on CUDA one wait for the queued work): the
// position and the step's counters. restore() takes what a checkpoint needs to resume at a group
// boundary (epoch, micro_batch_index, micro_batches_total, accum_steps_override and the first five
// below); the rest is what a report quotes.
struct TrainingCounters : TrainingPosition {
  int64_t optimizer_steps = 0;  // steps taken
  int64_t skipped_steps = 0;    // steps skipped for a non-finite gradient
  // Dynamic loss scaling's state (restored only where it is on): the scale the next group's
  // backward uses (1 without scaling).
  float loss_scale = 1.0f;
  int32_t loss_scale_clean_steps = 0;
  // The learning rate of the last step: a run resumed before its first step, as in an
  // interrupted test pass, reports the lr the uninterrupted run reports.
  float last_lr = 0.0f;
  // The last step's global L2 norm of the normalized gradient before clipping (NaN when the step
  // did not compute it: no clipping and no non-finite guard), and its clip factor.
  float last_grad_norm = 0.0f;
  float last_clip_factor = 1.0f;
  // Summed training loss, and units, of the groups stepped since begin_epoch(): their ratio is the
  // epoch's mean loss per unit.
  double epoch_loss_sum = 0.0;
  double epoch_units_stepped = 0.0;
  // Data parallel: the gradient buckets each step reduces, and how many of all steps' buckets so
  // far started while a backward still ran (the rest started at the step).
  int64_t gradient_buckets = 0;
  int64_t buckets_started_in_backward = 0;
};

// The accumulation steps a per-epoch schedule {first_epoch: steps} gives `epoch` (the entry with
// the largest first epoch not after it; the schedule must have key 0).
int accum_steps_for_epoch(const std::map<int, int>& schedule, int epoch);

// A per-epoch schedule as text, "EPOCH:STEPS,...": "0:8,4:2" is {{0, 8}, {4, 2}}, 8 micro-batches a
// step from epoch 0 and 2 from epoch 4 (Lightning's GradientAccumulationScheduler({0: 8, 4: 2})).
// Epochs from 0 to 1000000, each once, the first 0; steps from 1 to 1000000. Throws InvalidArgument
// whose message starts with the quoted text and says what is wrong.
std::map<int, int> parse_accum_schedule(const std::string& text);
// The schedule as parse_accum_schedule reads it: {{0, 8}, {4, 2}} is "0:8,4:2".
std::string accum_schedule_text(const std::map<int, int>& schedule);

// The optimizer steps of epochs 0 .. epochs - 1, each of `micro_batches` micro-batches in groups of
// that epoch's steps by `schedule` (a short last group is a step too): what a schedule over the
// whole run, such as CosineWarmupLR's, counts.
int64_t optimizer_steps_in_epochs(const std::map<int, int>& schedule, int64_t micro_batches, int epochs);

}  // namespace cumulus::train
