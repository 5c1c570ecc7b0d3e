// The normalization layers, with PyTorch's parameter and buffer names and initialization, so state
// dicts move between cumulus and PyTorch: LayerNorm (weight, bias), RMSNorm (weight), BatchNorm2d (weight, bias;
// buffers running_mean, running_var, num_batches_tracked).
#pragma once

#include <cstdint>
#include <optional>

#include "cumulus/nn/module.h"

namespace cumulus::nn {

// PyTorch's nn.LayerNorm over the last dimension: "weight" (ones) and "bias" (zeros), f32, when
// elementwise_affine; none otherwise. The input may be f32, bf16 or f16.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t normalized_size, float eps = 1e-5f, bool elementwise_affine = true,
                     Device device = Device::cpu());
  Tensor forward(const Tensor& x) override;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  int64_t normalized_size_;
  float eps_;
  Tensor weight_, bias_;
};

// PyTorch's nn.RMSNorm over the last normalized_shape.ndim() dimensions (ops::rms_norm): "weight"
// (ones, f32, of normalized_shape) when elementwise_affine; none otherwise. eps unset: PyTorch's
// default, the float epsilon. The input may be f32, bf16 or f16.
class RMSNorm : public Module {
 public:
  explicit RMSNorm(Shape normalized_shape, std::optional<float> eps = std::nullopt, bool elementwise_affine = true,
                   Device device = Device::cpu());
  Tensor forward(const Tensor& x) override;
  const Tensor& weight() const { return weight_; }

 private:
  Shape normalized_shape_;
  std::optional<float> eps_;
  Tensor weight_;
};

// Batch normalization over the channels of [N, C, H, W], as PyTorch's nn.BatchNorm2d (affine,
// tracking running statistics): weight 1, bias 0, running_mean 0, running_var 1,
// num_batches_tracked 0. In training mode (Module::train()) each forward normalizes with the
// micro-batch's statistics and updates the running ones (momentum 0.1, unbiased variance) and
// num_batches_tracked; in evaluation mode (Module::eval()) it normalizes with the running ones.
// num_batches_tracked is an i32 scalar here; PyTorch keeps an int64 scalar (the checkpoint code
// converts; only the dtype differs).
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t num_features, Device device = Device::cpu(), float eps = 1e-5f, float momentum = 0.1f);
  Tensor forward(const Tensor& x) override;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  const Tensor& running_mean() const { return running_mean_; }
  const Tensor& running_var() const { return running_var_; }
  const Tensor& num_batches_tracked() const { return num_batches_tracked_; }
  int64_t num_features() const { return num_features_; }
  float eps() const { return eps_; }
  float momentum() const { return momentum_; }

 private:
  int64_t num_features_;
  float eps_, momentum_;
  Tensor weight_, bias_, running_mean_, running_var_, num_batches_tracked_;
};

}  // namespace cumulus::nn
