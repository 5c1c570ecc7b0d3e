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

void Optimizer::restore_tensor(const std::vector<std::pair<std::string, Tensor>>& state,
                               const std::string& name, Tensor& into) const {
  for (const auto& [n, t] : state) {
    if (n != name) continue;
    CUMULUS_CHECK(t.dtype() == DType::f32 && t.numel() == params_->size(), ShapeError, "optimizer state '", name,
                  "' has ", t.numel(), " elements (", dtype_name(t.dtype()), "), expected ", params_->size(),
                  " f32 (was the checkpoint written for this model?)");
    if (!into.defined()) {
      MemoryCategoryScope scope(MemoryCategory::optimizer_state);
      into = Tensor::empty(params_->values().shape(), DType::f32, params_->device());
    }
    copy_bytes(into.raw_data(), into.device(), t.raw_data(), t.device(), into.nbytes());
    return;
  }
  throw InvalidArgument("optimizer state '" + name + "' is missing from the checkpoint");
}

void Optimizer::update(float grad_scale, float lr) {
  CUMULUS_CHECK(std::isfinite(grad_scale), InvalidArgument, "optimizer: gradient scale ", grad_scale);
  NoGradGuard no_grad;
  params_->zero_stale_gradients();
  apply(grad_scale, lr);
  ++updates_;
}

}  // namespace cumulus::optim
