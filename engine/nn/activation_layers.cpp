#include "cumulus/nn/activation_layers.h"

#include "cumulus/autograd/checkpoint.h"
#include "cumulus/core/error.h"

namespace cumulus::nn {

Dropout::Dropout(float p, uint64_t seed) : p_(p), seed_(seed) {
  CUMULUS_CHECK(p >= 0.0f && p < 1.0f, InvalidArgument, "Dropout: p must be in [0, 1), got ", p);
}

Tensor Dropout::forward(const Tensor& x) {
  if (!is_training() || p_ == 0.0f) return ops::dropout(x, p_, false, seed_, 0);
  if (!recomputing()) last_offset_ = calls_++;  // a recomputation replays the first run's mask
  return ops::dropout(x, p_, true, seed_, last_offset_);
}

}  // namespace cumulus::nn
