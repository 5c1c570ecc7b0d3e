#include "cumulus/nn/activation_layers.h"

#include "cumulus/autograd/checkpoint.h"
#include "cumulus/core/error.h"
#include "cumulus/memory/category.h"
#include "cumulus/ops/pointwise.h"

namespace cumulus::nn {

Tensor ReLU::forward(const Tensor& x) { return ops::relu(x); }

Dropout::Dropout(float p, uint64_t seed) : p_(p), seed_(seed) {
  CUMULUS_CHECK(p >= 0.0f && p <= 1.0f, InvalidArgument, "Dropout: p must be in [0, 1], got ", p);
}

Tensor Dropout::forward(const Tensor& x) {
  if (!is_training() || p_ == 0.0f) return ops::dropout(x, p_, false, seed_, 0);
  if (!recomputing()) {  // a recomputation replays the first run's mask
    const auto next = counter_.defined() && counter_.device() == x.device() ? -1 : static_cast<int64_t>(calls());
    MemoryCategoryScope scope(MemoryCategory::other);  // bookkeeping of 8 bytes, not an activation
    if (next >= 0) counter_ = Tensor::from_vector(std::vector<int64_t>{next}, Shape{1}, x.device());
    last_offset_ = ops::take_dropout_offset(counter_);
  }
  return ops::dropout(x, p_, true, seed_, last_offset_);
}

uint64_t Dropout::calls() const {
  return counter_.defined() ? static_cast<uint64_t>(counter_.to_vector<int64_t>()[0]) : initial_calls_;
}

void Dropout::set_calls(uint64_t calls) {
  initial_calls_ = calls;
  counter_ = Tensor();
}

}  // namespace cumulus::nn
