// The convolutional layers, with PyTorch's parameter names, so state dicts move between cumulus and
// PyTorch: Conv2d (weight, bias), MaxPool2d (none). BatchNorm2d is with the normalizations
// (cumulus/nn/norm_layers.h).
#pragma once

#include <cstdint>

#include "cumulus/nn/module.h"
#include "cumulus/ops/convolution.h"

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
