// AdamW (Loshchilov & Hutter) with PyTorch's semantics (torch.optim.AdamW):
//   w *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2;
//   w -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)          (t: updates applied, from 1)
#pragma once

#include "cumulus/optim/optimizer.h"

namespace cumulus::optim {

struct AdamWOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;
};

class AdamW final : public Optimizer {
 public:
  AdamW(std::shared_ptr<nn::FlatParameters> params, const AdamWOptions& options);
  int64_t state_bytes() const override;
  std::vector<int64_t> state_to_allocate() const override;  // exp_avg and exp_avg_sq
  // "exp_avg", "exp_avg_sq" (and "frozen_missed_updates" once a parameter was frozen).
  std::vector<std::pair<std::string, Tensor>> state() const override;
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t updates) override;
  const AdamWOptions& options() const { return options_; }
  const Tensor& exp_avg() const { return m_; }     // undefined until the first update
  const Tensor& exp_avg_sq() const { return v_; }

 private:
  void apply(const kernels::StepState& host) override;
  std::vector<std::string> moment_names() const override;
  AdamWOptions options_;
  Tensor m_, v_;
};

}  // namespace cumulus::optim
