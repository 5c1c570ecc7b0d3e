#include "cumulus/optim/optimizer.h"

#include <cmath>

#include "cumulus/autograd/grad_mode.h"

namespace cumulus::optim {

Optimizer::Optimizer(std::shared_ptr<nn::FlatParameters> params, float lr) : params_(std::move(params)) {
  CUMULUS_CHECK(params_ != nullptr, InvalidArgument, "optimizer: no parameters");
  set_lr(lr);
}

void Optimizer::set_lr(float lr) {
  CUMULUS_CHECK(std::isfinite(lr) && lr >= 0.0f, InvalidArgument,
                "optimizer: learning rate must be finite and >= 0, got ", lr);
  lr_ = lr;
}

void Optimizer::update(float grad_scale, float lr) {
  CUMULUS_CHECK(std::isfinite(grad_scale), InvalidArgument, "optimizer: gradient scale ", grad_scale);
  NoGradGuard no_grad;
  params_->zero_stale_gradients();
  apply(grad_scale, lr);
  ++updates_;
}

}  // namespace cumulus::optim
