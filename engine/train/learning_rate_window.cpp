#include "learning_rate_window.h"

#include <cstddef>
#include <vector>

namespace cumulus::train {

using optim::LRSchedule;
using optim::Optimizer;
using optim::UpdateScalars;

void LearningRateWindow::prepare(StepStateMemory& state, int64_t steps_offset) {
  if (!schedule_) {
    if (size_ != 1 || constant_ != optimizer_.lr()) fill(state, 0, steps_offset);
    return;
  }
  // The update count is now at most known_updates_ + attempts_since_read_.
  if (size_ == 0 || known_updates_ + attempts_since_read_ >= base_ + size_) {
    saw_updates(optimizer_.updates());
    fill(state, known_updates_, steps_offset);
  }
}

void LearningRateWindow::fill(StepStateMemory& state, int64_t base_update, int64_t steps_offset) {
  const int64_t size = schedule_ ? kSize : 1;
  std::vector<float> lr(static_cast<std::size_t>(size));
  for (int64_t j = 0; j < size; ++j)
    lr[static_cast<std::size_t>(j)] = schedule_ ? schedule_->lr_at(base_update - steps_offset + j) : optimizer_.lr();
  if (!table_.defined()) {
    MemoryCategoryScope scope(MemoryCategory::other);
    table_ = Tensor::empty(Shape{kSize}, DType::f32, optimizer_.parameters().device());
  }
  copy_bytes(table_.raw_data(), table_.device(), lr.data(), Device::cpu(), lr.size() * sizeof(float));
  state.write(&kernels::StepState::lr_base, base_update);
  size_ = size;
  base_ = base_update;
  constant_ = schedule_ ? -1.0f : optimizer_.lr();
}

}  // namespace cumulus::train
