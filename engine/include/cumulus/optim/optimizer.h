// Optimizers over FlatParameters. An update is one fused pass over the flat arrays (one launch on
// CUDA): the gradient is multiplied by `grad_scale` inside the pass (the Accumulator folds the
// normalization 1/samples and the clipping factor into it), then the rule is applied. State is
// allocated at the first update, in category optimizer_state.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cumulus/nn/flat_parameters.h"

namespace cumulus::optim {

class Optimizer {
 public:
  explicit Optimizer(std::shared_ptr<nn::FlatParameters> params, float lr);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update with g_eff = grad_scale * gradient, at learning rate `lr`. Stale slots count as zero
  // gradient. Does not mark gradients stale (the caller does, or zero_grad()).
  void update(float grad_scale, float lr);
  // Plain use without an Accumulator: update(1, lr()).
  void step() { update(1.0f, lr_); }
  void zero_grad() { params_->mark_gradients_stale(); }

  float lr() const { return lr_; }
  void set_lr(float lr);
  int64_t updates() const { return updates_; }  // updates applied so far
  // Bytes of optimizer state held now, as the allocator counts them (0 before the first update).
  virtual int64_t state_bytes() const = 0;
  // The state as named flat tensors (for checkpoints); empty before the first update.
  virtual std::vector<std::pair<std::string, Tensor>> state() const = 0;
  // Restores what state() returned (copied into this optimizer's own buffers, allocated if needed)
  // and the number of updates applied, so training resumes exactly. Throws on missing or
  // mis-shaped tensors, naming them.
  virtual void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t updates) = 0;
  const nn::FlatParameters& parameters() const { return *params_; }
  nn::FlatParameters& parameters() { return *params_; }

 protected:
  virtual void apply(float grad_scale, float lr) = 0;
  // Finds `name` in `state` and copies it into `into` (allocated in category optimizer_state
  // with the flat size when undefined).
  void restore_tensor(const std::vector<std::pair<std::string, Tensor>>& state, const std::string& name,
                      Tensor& into) const;
  std::shared_ptr<nn::FlatParameters> params_;
  float lr_;
  int64_t updates_ = 0;
};

}  // namespace cumulus::optim
