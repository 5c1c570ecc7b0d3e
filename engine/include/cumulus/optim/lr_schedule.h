// Learning-rate schedules, indexed by the optimizer step (never by micro-batch): with 4
// accumulation steps, a warmup of 100 steps lasts 400 micro-batches.
#pragma once

#include <cstdint>
#include <memory>

namespace cumulus::optim {

class LRSchedule {
 public:
  virtual ~LRSchedule() = default;
  // The learning rate for optimizer step `step` (0 for the first step).
  virtual float lr_at(int64_t step) const = 0;
};

class ConstantLR final : public LRSchedule {
 public:
  explicit ConstantLR(float lr) : lr_(lr) {}
  float lr_at(int64_t) const override { return lr_; }

 private:
  float lr_;
};

// lr * gamma^(step / step_size), as torch.optim.lr_scheduler.StepLR.
class StepLR final : public LRSchedule {
 public:
  StepLR(float lr, int64_t step_size, float gamma);
  float lr_at(int64_t step) const override;

 private:
  float lr_;
  int64_t step_size_;
  float gamma_;
};

// Linear warmup from lr/warmup_steps to lr over `warmup_steps` steps, then cosine decay to
// `min_lr` at `total_steps` (held at min_lr after).
class CosineWarmupLR final : public LRSchedule {
 public:
  CosineWarmupLR(float lr, int64_t warmup_steps, int64_t total_steps, float min_lr = 0.0f);
  float lr_at(int64_t step) const override;

 private:
  float lr_;
  int64_t warmup_, total_;
  float min_lr_;
};

}  // namespace cumulus::optim
