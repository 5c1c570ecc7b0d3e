// PyTorch's torch.nn.init: in-place initializers for f32 tensors on any device, each drawing from a
// seeded Generator (or a seed), so the same seed gives the same values bit for bit on CPU and CUDA:
// values are computed on the host and copied (cumulus/tensor/random.h), which costs one host buffer
// and one copy per call, nothing at training time. They write the values only: autograd records
// nothing (a parameter that requires grad can be initialized), and the gradient is untouched.
//
//   nn::init::normal_(linear.weight(), 0.0f, 0.02f, /*seed=*/42);
//   nn::init::kaiming_normal_(conv.weight(), 0.0f, nn::init::FanMode::fan_out,
//                             nn::init::Nonlinearity::relu, gen);
//
// Errors (InvalidArgument) name the function and the argument: "nn::init::normal_: std must be
// >= 0, got -1". A tensor with no element is left as it is (PyTorch's no-op), even where its fans
// would be 0.
#pragma once

#include <cstdint>
#include <optional>

#include "cumulus/tensor/random.h"
#include "cumulus/tensor/tensor.h"

namespace cumulus::nn::init {

// PyTorch's nonlinearity names for calculate_gain (the conv and transposed-conv names all have gain
// 1, as linear and sigmoid do).
enum class Nonlinearity { linear, sigmoid, tanh, relu, leaky_relu, selu };
enum class FanMode { fan_in, fan_out };

// PyTorch's calculate_gain: linear, sigmoid 1; tanh 5/3; relu sqrt(2); leaky_relu
// sqrt(2 / (1 + slope^2)) with `param` the negative slope (PyTorch's default 0.01 when absent);
// selu 3/4.
float calculate_gain(Nonlinearity nonlinearity, std::optional<float> param = std::nullopt);

struct Fans {
  int64_t fan_in, fan_out;
};
// PyTorch's _calculate_fan_in_and_fan_out: for a weight [out, in, k...] (Linear [out, in], Conv2d
// [out, in, kh, kw]), fan_in = in * prod(k), fan_out = out * prod(k). Fewer than 2 dimensions
// throws, naming `function`.
Fans calculate_fan_in_and_fan_out(const Shape& shape, const char* function = "nn::init::calculate_fan_in_and_fan_out");

// Each returns `t` (the same handle). The uint64_t overloads draw from Generator(seed).
Tensor uniform_(const Tensor& t, float a, float b, Generator& gen);  // [a, b); a <= b
Tensor uniform_(const Tensor& t, float a, float b, uint64_t seed);
Tensor normal_(const Tensor& t, float mean, float std, Generator& gen);  // std >= 0
Tensor normal_(const Tensor& t, float mean, float std, uint64_t seed);
Tensor constant_(const Tensor& t, float value);
Tensor zeros_(const Tensor& t);
Tensor ones_(const Tensor& t);

// Glorot & Bengio (2010): std = gain * sqrt(2 / (fan_in + fan_out)), gain >= 0; uniform in
// +-sqrt(3) * std.
Tensor xavier_uniform_(const Tensor& t, float gain, Generator& gen);
Tensor xavier_uniform_(const Tensor& t, float gain, uint64_t seed);
Tensor xavier_normal_(const Tensor& t, float gain, Generator& gen);
Tensor xavier_normal_(const Tensor& t, float gain, uint64_t seed);

// He et al. (2015): std = calculate_gain(nonlinearity, a) / sqrt(fan), fan per `mode`; uniform
// in +-sqrt(3) * std. `a` is leaky_relu's negative slope (PyTorch's defaults: a = 0, fan_in,
// leaky_relu, which is relu's gain sqrt(2)).
Tensor kaiming_uniform_(const Tensor& t, float a, FanMode mode, Nonlinearity nonlinearity, Generator& gen);
Tensor kaiming_uniform_(const Tensor& t, float a, FanMode mode, Nonlinearity nonlinearity, uint64_t seed);
Tensor kaiming_normal_(const Tensor& t, float a, FanMode mode, Nonlinearity nonlinearity, Generator& gen);
Tensor kaiming_normal_(const Tensor& t, float a, FanMode mode, Nonlinearity nonlinearity, uint64_t seed);

}  // namespace cumulus::nn::init
