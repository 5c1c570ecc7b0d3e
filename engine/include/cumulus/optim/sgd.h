// SGD with PyTorch's semantics (torch.optim.SGD): weight decay added to the gradient, momentum
// buffer initialized to the first gradient, dampening, Nesterov.
//   g = s*grad + wd*w;  b = g (first update) or mu*b + (1-dampening)*g;
//   d = nesterov ? g + mu*b : b (or g when mu = 0);  w -= lr*d
// With state_bits = 8 the momentum buffer is kept block-wise quantized (Note [8-bit optimizer
// state] in kernels/quantized_state.h): 8 bits per element and one f32 per 64.
#pragma once

#include "cumulus/optim/optimizer.h"

namespace cumulus::optim {

struct SGDOptions {
  float lr = 1e-3f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  bool nesterov = false;
  float weight_decay = 0.0f;
  int state_bits = 32;  // 32: an f32 momentum buffer; 8: block-wise 8-bit (see above)
};

class SGD final : public Optimizer {
 public:
  SGD(std::shared_ptr<nn::FlatParameters> params, const SGDOptions& options);
  const SGDOptions& options() const { return options_; }
  int state_bits() const override { return options_.state_bits; }
  void set_state_bits(int bits) override;
  // The state "momentum_buffer" (with momentum only): undefined until the first update. With 8-bit
  // state it holds the codes (u8), and "momentum_buffer_absmax" (state_tensor) the blocks' scales.
  const Tensor& momentum_buffer() const { return state_tensor("momentum_buffer"); }

 protected:
  std::vector<StateSpec> state_specs() const override;
  void update(const UpdateScalars* scalars, const UpdateSpan& span) override;

 private:
  SGDOptions options_;
};

}  // namespace cumulus::optim
