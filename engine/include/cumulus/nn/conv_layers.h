// The convolutional layers, with PyTorch's parameter and buffer names, so state dicts move between
// cumulus and PyTorch: Conv2d (weight, bias), BatchNorm2d (weight, bias; buffers running_mean,
// running_var, num_batches_tracked), MaxPool2d (none).
#pragma once

#include <cstdint>

#include "cumulus/nn/module.h"
#include "cumulus/ops/conv_ops.h"

namespace cumulus::nn {

// y = conv2d(x, weight) + bias; weight [out, in, k, k], bias [out]. Initialized as PyTorch's
// nn.Conv2d: kaiming_uniform with a = sqrt(5), i.e. weight and bias uniform in +-1/sqrt(fan_in),
// fan_in = in * k * k (weight first, then bias, from `gen`).
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, Generator& gen,
         Device device = Device::cpu(), int64_t stride = 1, int64_t padding = 0, bool bias = true);
  Tensor forward(const Tensor& x) override;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  const ops::Conv2dOptions& options() const { return options_; }

 private:
  ops::Conv2dOptions options_;
  Tensor weight_, bias_;
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
  explicit BatchNorm2d(int64_t num_features, Device device = Device::cpu(), float eps = 1e-5f,
                       float momentum = 0.1f);
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

// Max over kernel x kernel windows; stride 0 means stride = kernel (PyTorch's default).
class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0);
  Tensor forward(const Tensor& x) override;
  const ops::MaxPool2dOptions& options() const { return options_; }

 private:
  ops::MaxPool2dOptions options_;
};

}  // namespace cumulus::nn
