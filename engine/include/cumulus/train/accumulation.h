// What a run's accumulation is configured with (AccumulationOptions, in TrainerOptions) and the
// Trainer's counters; the policy itself: Note [Exact normalization] in engine/train/trainer_step.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <memory>

namespace cumulus::dist {
class Communicator;
}

namespace cumulus::train {

enum class Normalization {
  // Default. Losses are summed over units the caller names (samples, tokens, pixels); the update
  // divides by the units actually in the group, so a partial or uneven group is exactly the mean.
  units,
  // The classic mean loss / N: each micro-batch's summed loss divided by its units times N. Inexact
  // for a group of fewer than N micro-batches (an epoch's last: its weight is their count / N) and
  // for uneven micro-batches (a shorter one's units weigh more).
  micro_batches,
  none,  // the gradient is used as accumulated
};

// Dynamic loss scaling (Note [Loss scaling] in engine/train/trainer_step.cpp) for 16-bit gradients:
// backward's seed is the scale, fixed within a group; a group with a non-finite gradient is skipped
// and halves it, down to min_scale; growth_interval clean groups in a row double it. Every factor is
// a power of two, so unscaling is exact.
struct LossScaling {
  bool dynamic = false;
  float initial_scale = 65536.0f;  // 2^16, torch.amp.GradScaler's default
  int growth_interval = 2000;      // clean steps in a row before the scale grows
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  // The floor: a power of two from 2^-126 to initial_scale. Below 1 a scale only shrinks gradients
  // that overflow unscaled (torch.amp.GradScaler has no floor: give 2^-126 for its behaviour).
  float min_scale = 1.0f;
};

struct AccumulationOptions {
  int accum_steps = 1;
  std::map<int, int> schedule;  // {first_epoch: steps} from key 0, instead of accum_steps when given
  Normalization normalization = Normalization::units;
  float clip_grad_norm = 0.0f;  // > 0: clip the normalized gradient's global L2 norm to this
  bool skip_non_finite = true;  // a NaN/Inf in the normalized gradient skips the step
  // Data parallel (Note [Data parallel accumulation] in engine/dist/communicator.cpp): with more than
  // one rank, accum_steps counts the micro-batches of all ranks together (a multiple of the world
  // size); each rank trains its own and calls skip_micro_batch() for the others'. Null: one process.
  std::shared_ptr<dist::Communicator> communicator;
  int64_t bucket_bytes = 1 << 20;  // gradient bytes per bucket reduced while backward still runs
  // 1: each rank keeps and updates its shard's optimizer state (Note [ZeRO]); 2: and keeps only its
  // shard of the gradient, reduced every micro-batch (Note [ZeRO stage 2]; its CUDA path, NCCL's,
  // has not run on a GPU).
  int zero_stage = 0;
  // Data parallel: each micro-batch's gradient reduced across the ranks as its backward finishes,
  // the order stage 2 must sum in, not each rank's micro-batches first and the ranks once a step:
  // an all-reduce's traffic a micro-batch, open buckets besides the whole gradient (which the
  // planner's peaks leave out: it does not weigh this), and stage 2's bits at any number of ranks
  // (Note [ZeRO stage 2]). Stage 2 always reduces so.
  bool reduce_every_micro_batch = false;
  LossScaling loss_scaling;        // needs Normalization::units and skip_non_finite
  bool weighted_loss = false;  // a loss weighted on purpose: taken as is, units unchecked (loss_checks.cpp)
};

// Where the loop stands, kept on the host: Trainer::position() is free to read at every micro-batch.
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
  // Dynamic loss scaling's state, restored where it is on: the next group's seed (1 without).
  float loss_scale = 1.0f;
  int32_t loss_scale_clean_steps = 0;
  float last_lr = 0.0f;  // restored, so a run resumed before its first step reports the same lr
  // The last step's global L2 norm of the normalized gradient before clipping (NaN when the step
  // did not compute it: no clipping and no non-finite guard), and its clip factor.
  float last_grad_norm = 0.0f;
  float last_clip_factor = 1.0f;
  // Summed loss and units of the groups stepped since begin_epoch(): the epoch's mean loss per unit.
  double epoch_loss_sum = 0.0;
  double epoch_units_stepped = 0.0;
  // Data parallel: the gradient buckets each step reduces, and how many of all steps' buckets so
  // far started while a backward still ran (the rest started at the step).
  int64_t gradient_buckets = 0;
  int64_t buckets_started_in_backward = 0;
};

// The steps a per-epoch schedule {first_epoch: steps} gives `epoch`.
int accum_steps_for_epoch(const std::map<int, int>& schedule, int epoch);

// The optimizer steps of epochs 0 .. epochs - 1 of `micro_batches` each under `schedule` (a short
// last group is a step too): what a schedule over the whole run, such as CosineWarmupLR's, counts.
int64_t optimizer_steps_in_epochs(const std::map<int, int>& schedule, int64_t micro_batches, int epochs);

}  // namespace cumulus::train
