#include "cumulus/models/mlp.h"

namespace cumulus::models {

SeedMLP::SeedMLP(Generator& gen, Device device) {
  flatten_ = register_module("flatten", std::make_shared<nn::Flatten>());
  linear_relu_stack_ = register_module("linear_relu_stack", std::make_shared<nn::Sequential>());
  // Layers are created in PyTorch's order, so one seed gives one model on every device.
  linear_relu_stack_->add(std::make_shared<nn::Linear>(kInputs, kHidden, gen, device))
      .add(std::make_shared<nn::ReLU>())
      .add(std::make_shared<nn::Linear>(kHidden, kHidden, gen, device))
      .add(std::make_shared<nn::ReLU>())
      .add(std::make_shared<nn::Linear>(kHidden, kClasses, gen, device));
}

Tensor SeedMLP::forward(const Tensor& x) { return linear_relu_stack_->forward(flatten_->forward(x)); }

SeedMLP& SeedMLP::set_recompute(bool on) {
  linear_relu_stack_->set_recompute(on ? std::vector<nn::LayerRange>{{0, 4}} : std::vector<nn::LayerRange>{});
  return *this;
}

}  // namespace cumulus::models
