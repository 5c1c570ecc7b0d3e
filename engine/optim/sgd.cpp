#include "cumulus/optim/sgd.h"

#include <cmath>

#include "cumulus/autograd/grad_mode.h"
#include "cumulus/ops/ops.h"

namespace cumulus::optim {

SGD::SGD(std::vector<Tensor> params, float lr) : params_(std::move(params)), lr_(lr) {
  set_lr(lr);
  for (const Tensor& p : params_)
    CUMULUS_CHECK(p.defined() && p.requires_grad() && p.is_leaf(), InvalidArgument,
                  "SGD: every parameter must be a leaf that requires grad");
}

void SGD::set_lr(float lr) {
  CUMULUS_CHECK(std::isfinite(lr) && lr >= 0.0f, InvalidArgument, "SGD: learning rate must be finite and >= 0, got ", lr);
  lr_ = lr;
}

void SGD::step() {
  NoGradGuard no_grad;
  for (const Tensor& p : params_) {
    const Tensor g = p.grad();
    if (g.defined()) ops::sgd_update_(p, g, lr_);
  }
}

void SGD::zero_grad() {
  for (const Tensor& p : params_) p.mark_grad_stale();
}

}  // namespace cumulus::optim
