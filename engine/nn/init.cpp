#include "cumulus/nn/init.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cumulus/core/error.h"

namespace cumulus::nn::init {

namespace {

void check_tensor(const Tensor& t, const char* function) {
  CUMULUS_CHECK(t.defined(), InvalidArgument, "nn::init::", function, ": t is undefined");
  CUMULUS_CHECK(t.dtype() == DType::f32, InvalidArgument, "nn::init::", function, ": t must be f32, got ",
                dtype_name(t.dtype()), " (", t.str(), ")");
}

void check_finite(float v, const char* function, const char* name) {
  CUMULUS_CHECK(std::isfinite(v), InvalidArgument, "nn::init::", function, ": ", name, " must be finite, got ", v);
}

// Values are made on the host and copied in, whatever the device: the same seed then gives the
// same bits everywhere (random.h), and copy_from writes the values without recording a graph.
template <typename Fill>
Tensor fill_host(const Tensor& t, Fill fill) {
  std::vector<float> host(static_cast<std::size_t>(t.numel()));
  fill(host.data(), t.numel());
  Tensor target = t;
  target.copy_from(Tensor::from_vector(host, t.shape()));
  return t;
}

Tensor draw_uniform(const Tensor& t, float a, float b, Generator& gen) {
  return fill_host(t, [&](float* out, int64_t n) { gen.fill_uniform(out, n, a, b); });
}

Tensor draw_normal(const Tensor& t, float mean, float std, Generator& gen) {
  return fill_host(t, [&](float* out, int64_t n) { gen.fill_normal(out, n, mean, std); });
}

Tensor fill_constant(const Tensor& t, float value, const char* function) {
  check_tensor(t, function);
  return fill_host(t, [&](float* out, int64_t n) { std::fill(out, out + n, value); });
}

int64_t correct_fan(const Tensor& t, FanMode mode, const char* function) {
  const Fans fans = calculate_fan_in_and_fan_out(t.shape(), function);
  return mode == FanMode::fan_in ? fans.fan_in : fans.fan_out;
}

// Xavier's and Kaiming's std (the arguments checked first, so a tensor with no element, left as
// it is, is refused where another would be).
float xavier_std(const Tensor& t, float gain, const char* function) {
  check_tensor(t, function);
  check_finite(gain, function, "gain");
  // PyTorch refuses it too, in the uniform_ or normal_ it calls with the negative bound or std.
  CUMULUS_CHECK(gain >= 0.0f, InvalidArgument, "nn::init::", function, ": gain must be >= 0, got ", gain);
  const Fans fans = calculate_fan_in_and_fan_out(t.shape(), (std::string("nn::init::") + function).c_str());
  if (t.numel() == 0) return 0.0f;
  return gain * std::sqrt(2.0f / static_cast<float>(fans.fan_in + fans.fan_out));
}

float kaiming_std(const Tensor& t, float a, FanMode mode, Nonlinearity nonlinearity, const char* function) {
  check_tensor(t, function);
  check_finite(a, function, "a");
  const int64_t fan = correct_fan(t, mode, (std::string("nn::init::") + function).c_str());
  if (t.numel() == 0) return 0.0f;
  return calculate_gain(nonlinearity, a) / std::sqrt(static_cast<float>(fan));
}

}  // namespace

float calculate_gain(Nonlinearity nonlinearity, std::optional<float> param) {
  switch (nonlinearity) {
    case Nonlinearity::linear:
    case Nonlinearity::sigmoid: return 1.0f;
    case Nonlinearity::tanh: return 5.0f / 3.0f;
    case Nonlinearity::relu: return std::sqrt(2.0f);
    case Nonlinearity::leaky_relu: {
      const float slope = param.value_or(0.01f);
      check_finite(slope, "calculate_gain", "param (the negative slope)");
      return std::sqrt(2.0f / (1.0f + slope * slope));
    }
    case Nonlinearity::selu: return 0.75f;
  }
  return 1.0f;
}

Fans calculate_fan_in_and_fan_out(const Shape& shape, const char* function) {
  CUMULUS_CHECK(shape.ndim() >= 2, InvalidArgument, function,
                ": t must have at least 2 dimensions ([out, in, ...]) for fan_in and fan_out, got shape ", shape.str());
  int64_t receptive_field = 1;
  for (int d = 2; d < shape.ndim(); ++d) receptive_field *= shape[d];
  return {shape[1] * receptive_field, shape[0] * receptive_field};
}

Tensor uniform_(const Tensor& t, float a, float b, Generator& gen) {
  check_tensor(t, "uniform_");
  check_finite(a, "uniform_", "a");
  check_finite(b, "uniform_", "b");
  CUMULUS_CHECK(a <= b, InvalidArgument, "nn::init::uniform_: a must be <= b, got a = ", a, ", b = ", b);
  return draw_uniform(t, a, b, gen);
}

Tensor normal_(const Tensor& t, float mean, float std, Generator& gen) {
  check_tensor(t, "normal_");
  check_finite(mean, "normal_", "mean");
  check_finite(std, "normal_", "std");
  CUMULUS_CHECK(std >= 0.0f, InvalidArgument, "nn::init::normal_: std must be >= 0, got ", std);
  return draw_normal(t, mean, std, gen);
}

Tensor constant_(const Tensor& t, float value) { return fill_constant(t, value, "constant_"); }
Tensor zeros_(const Tensor& t) { return fill_constant(t, 0.0f, "zeros_"); }
Tensor ones_(const Tensor& t) { return fill_constant(t, 1.0f, "ones_"); }

Tensor xavier_uniform_(const Tensor& t, float gain, Generator& gen) {
  const float bound = std::sqrt(3.0f) * xavier_std(t, gain, "xavier_uniform_");
  return draw_uniform(t, -bound, bound, gen);
}

Tensor xavier_normal_(const Tensor& t, float gain, Generator& gen) {
  return draw_normal(t, 0.0f, xavier_std(t, gain, "xavier_normal_"), gen);
}

Tensor kaiming_uniform_(const Tensor& t, float a, FanMode mode, Nonlinearity nonlinearity, Generator& gen) {
  const float bound = std::sqrt(3.0f) * kaiming_std(t, a, mode, nonlinearity, "kaiming_uniform_");
  return draw_uniform(t, -bound, bound, gen);
}

Tensor kaiming_normal_(const Tensor& t, float a, FanMode mode, Nonlinearity nonlinearity, Generator& gen) {
  return draw_normal(t, 0.0f, kaiming_std(t, a, mode, nonlinearity, "kaiming_normal_"), gen);
}

// ---- the seeded overloads ----

Tensor uniform_(const Tensor& t, float a, float b, uint64_t seed) {
  Generator gen(seed);
  return uniform_(t, a, b, gen);
}
Tensor normal_(const Tensor& t, float mean, float std, uint64_t seed) {
  Generator gen(seed);
  return normal_(t, mean, std, gen);
}
Tensor xavier_uniform_(const Tensor& t, float gain, uint64_t seed) {
  Generator gen(seed);
  return xavier_uniform_(t, gain, gen);
}
Tensor xavier_normal_(const Tensor& t, float gain, uint64_t seed) {
  Generator gen(seed);
  return xavier_normal_(t, gain, gen);
}
Tensor kaiming_uniform_(const Tensor& t, float a, FanMode mode, Nonlinearity nonlinearity, uint64_t seed) {
  Generator gen(seed);
  return kaiming_uniform_(t, a, mode, nonlinearity, gen);
}
Tensor kaiming_normal_(const Tensor& t, float a, FanMode mode, Nonlinearity nonlinearity, uint64_t seed) {
  Generator gen(seed);
  return kaiming_normal_(t, a, mode, nonlinearity, gen);
}

}  // namespace cumulus::nn::init
