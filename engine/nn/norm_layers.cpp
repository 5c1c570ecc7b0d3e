#include "cumulus/nn/norm_layers.h"

#include "cumulus/ops/normalization.h"

namespace cumulus::nn {

LayerNorm::LayerNorm(int64_t normalized_size, float eps, bool elementwise_affine, Device device)
    : normalized_size_(normalized_size), eps_(eps) {
  CUMULUS_CHECK(normalized_size > 0, InvalidArgument, "LayerNorm(", normalized_size, "): the size must be positive");
  if (!elementwise_affine) return;
  register_parameter("weight", weight_, Tensor::full(Shape{normalized_size}, 1.0f), device);
  register_parameter("bias", bias_, Tensor::zeros(Shape{normalized_size}), device);
}

Tensor LayerNorm::forward(const Tensor& x) { return ops::layer_norm(x, normalized_size_, weight_, bias_, eps_); }

RMSNorm::RMSNorm(Shape normalized_shape, std::optional<float> eps, bool elementwise_affine, Device device)
    : normalized_shape_(std::move(normalized_shape)), eps_(eps) {
  CUMULUS_CHECK(normalized_shape_.ndim() >= 1 && normalized_shape_.numel() > 0, InvalidArgument, "RMSNorm(",
                normalized_shape_.str(), "): the shape must have a dimension and no size 0");
  if (elementwise_affine) register_parameter("weight", weight_, Tensor::full(normalized_shape_, 1.0f), device);
}

Tensor RMSNorm::forward(const Tensor& x) { return ops::rms_norm(x, normalized_shape_, weight_, eps_); }

BatchNorm2d::BatchNorm2d(int64_t num_features, Device device, float eps, float momentum)
    : num_features_(num_features), eps_(eps), momentum_(momentum) {
  CUMULUS_CHECK(num_features > 0, InvalidArgument, "BatchNorm2d(", num_features, "): must be positive");
  const Shape s{num_features};
  register_parameter("weight", weight_, Tensor::full(s, 1.0f), device);
  register_parameter("bias", bias_, Tensor::zeros(s), device);
  running_mean_ = register_buffer("running_mean", Tensor::zeros(s), device);
  running_var_ = register_buffer("running_var", Tensor::full(s, 1.0f), device);
  // PyTorch: an int64 0-d tensor; i32 here (see the header).
  num_batches_tracked_ = register_buffer("num_batches_tracked", Tensor::zeros(Shape{}, DType::i32), device);
}

Tensor BatchNorm2d::forward(const Tensor& x) {
  ops::BatchNormOptions o;
  o.training = is_training();
  o.momentum = momentum_;
  o.eps = eps_;
  return ops::batch_norm2d(x, weight_, bias_, running_mean_, running_var_, num_batches_tracked_, o);
}

}  // namespace cumulus::nn
