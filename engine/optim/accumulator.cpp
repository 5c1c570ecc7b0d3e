// Note [Exact normalization]
// Each micro-batch's loss is a sum over its samples, and backward adds its gradient into the
// persistent buffers unscaled. At a group boundary the update multiplies the accumulated gradient
// by 1 / (samples in the group), inside the fused optimizer pass. So a group of any shape (16 x 4,
// 64 x 1, 8 + 8 + 16 + 32, or the 40-sample tail of an epoch) is exactly the mean gradient over its
// samples, and 16 x 4 reproduces 64 x 1 up to float rounding. Lightning and Accelerate divide every
// micro-batch by N instead, which under-weights a short last group by (its micro-batches) / N;
// Normalization::micro_batches reproduces that convention for comparison.
//
// Clipping uses the global L2 norm of the normalized, accumulated gradient, computed once at step
// time (never per micro-batch) and folded into the same scale: g_eff = g * (1/samples) * clip.
// A non-finite norm means a NaN/Inf somewhere in the gradient: the step is skipped and counted,
// the gradients are discarded (marked stale) and training goes on with the next group.
#include "cumulus/optim/accumulator.h"

#include <cmath>
#include <iterator>
#include <limits>

#include "cumulus/autograd/node.h"

namespace cumulus::optim {

Accumulator::Accumulator(std::shared_ptr<Optimizer> optimizer, const AccumulatorOptions& options,
                         std::shared_ptr<const LRSchedule> schedule)
    : optimizer_(std::move(optimizer)), options_(options), schedule_(std::move(schedule)) {
  CUMULUS_CHECK(optimizer_ != nullptr, InvalidArgument, "Accumulator: no optimizer");
  CUMULUS_CHECK(options.accum_steps > 0, InvalidArgument, "Accumulator: accum_steps must be > 0, got ",
                options.accum_steps);
  if (!options.schedule.empty()) {
    CUMULUS_CHECK(options.schedule.begin()->first == 0, InvalidArgument,
                  "Accumulator: the accumulation schedule must start at epoch 0");
    for (const auto& [epoch, steps] : options.schedule)
      CUMULUS_CHECK(epoch >= 0 && steps > 0, InvalidArgument, "Accumulator: bad schedule entry ", epoch,
                    ":", steps, " (epochs >= 0, steps > 0)");
  }
  CUMULUS_CHECK(options.clip_grad_norm >= 0.0f && std::isfinite(options.clip_grad_norm), InvalidArgument,
                "Accumulator: clip_grad_norm must be finite and >= 0, got ", options.clip_grad_norm);
  begin_epoch(0, 0);
}

int Accumulator::steps_for_epoch(const std::map<int, int>& schedule, int epoch) {
  auto it = schedule.upper_bound(epoch);  // first entry after `epoch`; the one before applies
  return it == schedule.begin() ? 1 : std::prev(it)->second;
}

void Accumulator::begin_epoch(int epoch, int64_t micro_batches, int64_t first) {
  CUMULUS_CHECK(micro_batches >= 0, InvalidArgument, "Accumulator: negative epoch length");
  CUMULUS_CHECK(first >= 0 && (micro_batches == 0 || first <= micro_batches), InvalidArgument,
                "Accumulator: first micro-batch ", first, " outside an epoch of ", micro_batches);
  CUMULUS_CHECK(group_mbs_ == 0, InvalidArgument, "Accumulator: begin_epoch(", epoch, ") with ", group_mbs_,
                " micro-batch(es) of the previous epoch not stepped; call flush() first");
  epoch_ = epoch;
  accum_steps_ = options_.schedule.empty() ? options_.accum_steps : steps_for_epoch(options_.schedule, epoch);
  mb_in_epoch_ = first;
  mb_epoch_len_ = micro_batches;
}

void Accumulator::backward(const Tensor& loss, int64_t samples) {
  CUMULUS_CHECK(samples > 0, InvalidArgument, "Accumulator::backward: samples must be > 0, got ", samples);
  CUMULUS_CHECK(mb_epoch_len_ == 0 || mb_in_epoch_ < mb_epoch_len_, InvalidArgument,
                "Accumulator::backward: more micro-batches than the ", mb_epoch_len_, " announced for epoch ", epoch_);
  // micro_batches: each micro-batch contributes mean loss / N, whatever the group turns out to be.
  const float seed = options_.normalization == Normalization::micro_batches
                         ? 1.0f / (static_cast<float>(samples) * static_cast<float>(accum_steps_))
                         : 1.0f;
  run_backward(loss, seed);
  group_samples_ += samples;
  group_mbs_ += 1;
  mb_in_epoch_ += 1;
  mb_total_ += 1;
}

bool Accumulator::ready() const {
  const bool group_full = group_mbs_ >= accum_steps_;
  const bool epoch_done = mb_epoch_len_ > 0 && mb_in_epoch_ == mb_epoch_len_;
  return group_mbs_ > 0 && (group_full || epoch_done);
}

bool Accumulator::step_if_ready() { return ready() && do_step(); }

Accumulator::Counters Accumulator::counters() const {
  return {epoch_, mb_in_epoch_, mb_total_, steps_, skipped_};
}

void Accumulator::restore(const Counters& c) {
  CUMULUS_CHECK(group_mbs_ == 0, InvalidArgument, "Accumulator::restore with micro-batches accumulated");
  CUMULUS_CHECK(c.epoch >= 0 && c.micro_batch_index >= 0 && c.micro_batches_total >= 0 && c.optimizer_steps >= 0 &&
                    c.skipped_steps >= 0,
                InvalidArgument, "Accumulator::restore: negative counter");
  epoch_ = c.epoch;
  mb_in_epoch_ = c.micro_batch_index;
  mb_total_ = c.micro_batches_total;
  steps_ = c.optimizer_steps;
  skipped_ = c.skipped_steps;
}

bool Accumulator::flush() { return group_mbs_ > 0 && do_step(); }

bool Accumulator::do_step() {
  const float scale = options_.normalization == Normalization::samples
                          ? 1.0f / static_cast<float>(group_samples_)
                          : 1.0f;
  const bool need_norm = options_.clip_grad_norm > 0.0f || options_.skip_non_finite;
  float clip = 1.0f;
  last_norm_ = std::numeric_limits<float>::quiet_NaN();
  if (need_norm) {
    // One host synchronization per optimizer step (never per micro-batch) to read the norm.
    const double norm = std::sqrt(optimizer_->parameters().gradient_sum_of_squares()) * scale;
    last_norm_ = static_cast<float>(norm);
    if (!std::isfinite(norm) && options_.skip_non_finite) {
      ++skipped_;
      optimizer_->zero_grad();
      group_samples_ = 0;
      group_mbs_ = 0;
      return true;
    }
    if (options_.clip_grad_norm > 0.0f && norm > options_.clip_grad_norm)
      clip = static_cast<float>(options_.clip_grad_norm / (norm + 1e-6));
  }
  last_clip_ = clip;
  last_lr_ = schedule_ ? schedule_->lr_at(steps_) : optimizer_->lr();
  optimizer_->update(scale * clip, last_lr_);
  optimizer_->zero_grad();
  ++steps_;
  group_samples_ = 0;
  group_mbs_ = 0;
  return true;
}

}  // namespace cumulus::optim
