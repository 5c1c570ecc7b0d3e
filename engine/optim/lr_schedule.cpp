#include "cumulus/optim/lr_schedule.h"

#include <cmath>

#include "cumulus/core/error.h"

namespace cumulus::optim {

StepLR::StepLR(float lr, int64_t step_size, float gamma) : lr_(lr), step_size_(step_size), gamma_(gamma) {
  CUMULUS_CHECK(step_size > 0, InvalidArgument, "StepLR: step_size must be > 0, got ", step_size);
}

float StepLR::lr_at(int64_t step) const {
  return static_cast<float>(static_cast<double>(lr_) *
                            std::pow(static_cast<double>(gamma_), static_cast<double>(step / step_size_)));
}

CosineWarmupLR::CosineWarmupLR(float lr, int64_t warmup_steps, int64_t total_steps, float min_lr)
    : lr_(lr), warmup_(warmup_steps), total_(total_steps), min_lr_(min_lr) {
  CUMULUS_CHECK(warmup_steps >= 0 && total_steps > warmup_steps, InvalidArgument,
                "CosineWarmupLR: need 0 <= warmup_steps < total_steps, got ", warmup_steps, " and ", total_steps);
}

// In double and rounded once, as PyTorch's schedules compute in Python floats: the rate is the
// float nearest the exact one, not the sum of several float roundings.
float CosineWarmupLR::lr_at(int64_t step) const {
  const double lr = lr_, min_lr = min_lr_;
  if (step < warmup_) return static_cast<float>(lr * static_cast<double>(step + 1) / static_cast<double>(warmup_));
  if (step >= total_) return min_lr_;
  const double progress = static_cast<double>(step - warmup_) / static_cast<double>(total_ - warmup_);
  return static_cast<float>(min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(3.141592653589793 * progress)));
}

}  // namespace cumulus::optim
