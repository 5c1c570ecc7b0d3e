#include "cumulus/nn/conv_layers.h"

#include <cmath>

namespace cumulus::nn {

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, Generator& gen, Device device,
               int64_t stride, int64_t padding, bool bias) {
  CUMULUS_CHECK(in_channels > 0 && out_channels > 0 && kernel_size > 0, InvalidArgument, "Conv2d(", in_channels,
                ", ", out_channels, ", kernel ", kernel_size, "): sizes must be positive");
  CUMULUS_CHECK(stride > 0 && padding >= 0, InvalidArgument, "Conv2d: stride ", stride, " must be positive and padding ",
                padding, " not negative");
  options_.stride_h = options_.stride_w = stride;
  options_.pad_h = options_.pad_w = padding;
  // PyTorch: kaiming_uniform_(W, a = sqrt(5)) has bound sqrt(6 / ((1 + a^2) fan_in)) = 1/sqrt(fan_in);
  // the bias is uniform in the same bound. Drawn on the host, so every device gets the same values.
  const int64_t fan_in = in_channels * kernel_size * kernel_size;
  const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
  register_parameter("weight", weight_,
                     uniform(Shape{out_channels, in_channels, kernel_size, kernel_size}, -bound, bound, gen), device);
  if (bias) register_parameter("bias", bias_, uniform(Shape{out_channels}, -bound, bound, gen), device);
}

Tensor Conv2d::forward(const Tensor& x) { return ops::conv2d(x, weight_, bias_, options_); }

MaxPool2d::MaxPool2d(int64_t kernel_size, int64_t stride, int64_t padding) {
  CUMULUS_CHECK(kernel_size > 0 && stride >= 0 && padding >= 0, InvalidArgument, "MaxPool2d(kernel ", kernel_size,
                ", stride ", stride, ", padding ", padding, "): invalid sizes");
  options_.kernel_h = options_.kernel_w = kernel_size;
  options_.stride_h = options_.stride_w = stride == 0 ? kernel_size : stride;
  options_.pad_h = options_.pad_w = padding;
}

Tensor MaxPool2d::forward(const Tensor& x) { return ops::max_pool2d(x, options_); }

}  // namespace cumulus::nn
