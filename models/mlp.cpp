#include "cumulus/models/mlp.h"

#include "cumulus/core/error.h"
#include "cumulus/nn/activation_layers.h"
#include "cumulus/ops/fused_mlp.h"

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

SeedMLP& SeedMLP::set_kernels(KernelChoice choice) {
  kernels_ = choice;
  return *this;
}

bool SeedMLP::fuses(Device device, DType dtype, int64_t batch) const {
  switch (kernels_) {
    case KernelChoice::fused: return true;
    case KernelChoice::generic: return false;
    case KernelChoice::automatic: break;
  }
  return ops::kFusedMlpMeasuredOnGpu && device.is_cuda() && dtype == DType::f32 && batch <= kFusedAutoMaxBatch &&
         !recompute();
}

Tensor SeedMLP::loss(const Tensor& x, const Tensor& labels, ops::Reduction reduction) {
  if (!fuses(x)) return ops::cross_entropy(forward(x), labels, reduction);
  CUMULUS_CHECK(!recompute(), InvalidArgument,
                "SeedMLP: the fused kernels keep every activation; turn recompute off or use the generic kernels");
  std::vector<Tensor> weights, biases;
  for (std::size_t i = 0; i < linear_relu_stack_->size(); i += 2) {
    const auto& layer = dynamic_cast<const nn::Linear&>((*linear_relu_stack_)[i]);
    weights.push_back(layer.weight());
    biases.push_back(layer.bias());
  }
  return ops::mlp_cross_entropy(flatten_->forward(x), labels, weights, biases, reduction);
}

}  // namespace cumulus::models
