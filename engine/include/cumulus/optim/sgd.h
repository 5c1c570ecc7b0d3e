// Plain SGD (w -= lr * grad), enough for a training loop. The accumulation-aware optimizers
// (momentum, AdamW, exact normalization per group) come with the Accumulator.
#pragma once

#include <vector>

#include "cumulus/tensor/tensor.h"

namespace cumulus::optim {

class SGD {
 public:
  SGD(std::vector<Tensor> params, float lr);
  // Updates every parameter that has an accumulated (non-stale) gradient.
  void step();
  // Marks every gradient stale: the next backward overwrites instead of adding. Costs nothing.
  void zero_grad();
  float lr() const { return lr_; }
  void set_lr(float lr);

 private:
  std::vector<Tensor> params_;
  float lr_;
};

}  // namespace cumulus::optim
