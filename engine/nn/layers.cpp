#include "cumulus/nn/layers.h"

#include <cmath>

#include "cumulus/ops/ops.h"

namespace cumulus::nn {

Linear::Linear(int64_t in_features, int64_t out_features, Generator& gen, Device device, bool bias)
    : in_features_(in_features), out_features_(out_features) {
  CUMULUS_CHECK(in_features > 0 && out_features > 0, InvalidArgument, "Linear(", in_features, ", ",
                out_features, "): feature counts must be positive");
  // PyTorch: kaiming_uniform_(W, a = sqrt(5)) has bound sqrt(6 / ((1 + a^2) fan_in)) = 1/sqrt(fan_in);
  // the bias is uniform in the same bound. Values are drawn on the host (see tensor/random.h).
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_features));
  weight_ = register_parameter("weight", uniform(Shape{out_features, in_features}, -bound, bound, gen), device);
  if (bias) bias_ = register_parameter("bias", uniform(Shape{out_features}, -bound, bound, gen), device);
}

Tensor Linear::forward(const Tensor& x) { return ops::linear(x, weight_, bias_); }

Tensor ReLU::forward(const Tensor& x) { return ops::relu(x); }

Tensor Flatten::forward(const Tensor& x) { return ops::flatten(x, 1); }

Sequential& Sequential::add(std::shared_ptr<Module> module) {
  register_module(std::to_string(layers_.size()), module);
  layers_.push_back(std::move(module));
  return *this;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (auto& layer : layers_) h = layer->forward(h);
  return h;
}

}  // namespace cumulus::nn
