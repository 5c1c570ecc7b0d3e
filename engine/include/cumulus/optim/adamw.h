// AdamW (Loshchilov & Hutter) with PyTorch's semantics (torch.optim.AdamW):
//   w *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2;
//   w -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)          (t: updates applied, from 1)
// With state_bits = 8 the moments are kept block-wise quantized (Note [8-bit optimizer state] in
// kernels/quantized_state.h): 8 bits per element and one f32 per 64, 26.6% of the fp32 moments'
// bytes; each update dequantizes, applies the rule above in fp32 and requantizes.
#pragma once

#include "cumulus/optim/optimizer.h"

namespace cumulus::optim {

struct AdamWOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;
  int state_bits = 32;  // 32: f32 moments; 8: block-wise 8-bit moments (see above)
};

class AdamW final : public Optimizer {
 public:
  AdamW(std::shared_ptr<nn::FlatParameters> params, const AdamWOptions& options);
  const AdamWOptions& options() const { return options_; }
  int state_bits() const override { return options_.state_bits; }
  void set_state_bits(int bits) override;
  // The states "exp_avg" and "exp_avg_sq": undefined until the first update. With 8-bit state they
  // hold the codes (u8), and "exp_avg_absmax", "exp_avg_sq_absmax" (state_tensor) the blocks' scales.
  const Tensor& exp_avg() const { return state_tensor("exp_avg"); }
  const Tensor& exp_avg_sq() const { return state_tensor("exp_avg_sq"); }

 protected:
  std::vector<StateSpec> state_specs() const override;
  void update(const UpdateScalars* scalars, const UpdateSpan& span) override;

 private:
  AdamWOptions options_;
};

}  // namespace cumulus::optim
