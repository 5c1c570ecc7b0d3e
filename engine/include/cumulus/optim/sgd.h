// SGD with PyTorch's semantics (torch.optim.SGD): weight decay added to the gradient, momentum
// buffer initialized to the first gradient, dampening, Nesterov.
//   g = s*grad + wd*w;  b = g (first update) or mu*b + (1-dampening)*g;
//   d = nesterov ? g + mu*b : b (or g when mu = 0);  w -= lr*d
#pragma once

#include "cumulus/optim/optimizer.h"

namespace cumulus::optim {

struct SGDOptions {
  float lr = 1e-3f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  bool nesterov = false;
  float weight_decay = 0.0f;
};

class SGD final : public Optimizer {
 public:
  SGD(std::shared_ptr<nn::FlatParameters> params, const SGDOptions& options);
  int64_t state_bytes() const override;
  std::vector<int64_t> state_to_allocate() const override;  // the momentum buffer, if momentum != 0
  // "momentum_buffer" (and "frozen_missed_updates" once a parameter was frozen).
  std::vector<std::pair<std::string, Tensor>> state() const override;
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t updates) override;
  const SGDOptions& options() const { return options_; }
  const Tensor& momentum_buffer() const { return momentum_; }  // undefined until the first update

 private:
  void apply(const kernels::StepState& host) override;
  std::vector<std::string> moment_names() const override;
  SGDOptions options_;
  Tensor momentum_;
};

}  // namespace cumulus::optim
