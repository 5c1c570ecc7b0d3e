// The kernels of our own beside cuDNN's convolution (kernels/cuda/conv.cu: the f32 bias of a 16-bit
// conv and its gradient) on the CPU emulation, against double-precision references (the CPU conv
// sums its bias gradient in another order, in double):
//  - add_bias: one f32 add and one rounding to T per element, which the exact sum rounded to f32
//    then to T gives bit for bit (a NaN matching any NaN), with NaN and +-Inf in y and the bias;
//  - bias_grad: each channel's f32 sum within 1e-6 relative and 2e-5 absolute of the double sum
//    (up to 600 terms of order 1, summed in a fixed but different order), overwriting NaN with
//    beta 0 and adding with beta 1, NaN and Inf propagated per channel.
// Shapes (n, k, hw): 21 values per channel (one partial pass of a 256-thread block), 600 (two full
// passes and a partial one), zero n and zero k; the bias add over one partial block and over 8.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/cuda/kernels.h"
#include "tests/emulated/emulated.h"

namespace cumulus::testing {
namespace {

struct Dims {
  int64_t n, k, hw;
  std::size_t size() const { return static_cast<std::size_t>(n * k * hw); }
  std::string name() const { return std::to_string(n) + " x " + std::to_string(k) + " x " + std::to_string(hw); }
};

const std::vector<Dims> kShapes = {{3, 2, 7}, {2, 3, 300}, {0, 3, 4}};

template <typename T>
void check_add_bias(const Dims& d) {
  SCOPED_TRACE(std::string(dtype_name(dtype_of<T>::value)) + ", " + d.name());
  auto yv = random_values(static_cast<int64_t>(d.size()), -1.0f, 1.0f, 50);
  auto bias = random_values(d.k, -1.0f, 1.0f, 51);
  if (d.size() > 20) yv[3] = kNaN, yv[4] = kInf, yv[d.hw] = kInf;  // channel 0: NaN, Inf; channel 1: Inf
  bias[1] = -kInf;                                                 // Inf + -Inf: NaN
  const DeviceVector<T> y0 = stored_as<T>(yv);
  DeviceVector<T> y = y0, want(d.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double exact = static_cast<double>(kernels::to_f32(y0[i])) + bias[(static_cast<int64_t>(i) / d.hw) % d.k];
    want[i] = kernels::from_f32<T>(static_cast<float>(exact));
  }
  kernels::conv2d_add_bias_cuda(bias.data(), d.n, d.k, d.hw, y.data(), nullptr);
  expect_same_values(y, want, "y + bias");
}

TEST(ConvKernelsEmulated, AddBiasRoundsTheExactSumOnce) {
  for (const Dims& d : kShapes) {
    check_add_bias<float>(d);
    check_add_bias<BFloat16>(d);
    check_add_bias<Half>(d);
  }
}

template <typename T>
void check_bias_grad(const Dims& d, float beta) {
  SCOPED_TRACE(std::string(dtype_name(dtype_of<T>::value)) + ", " + d.name() + ", beta " + std::to_string(beta));
  auto dyv = random_values(static_cast<int64_t>(d.size()), -1.0f, 1.0f, 52);
  if (d.size() > 0) dyv[d.hw + 2] = kNaN, dyv[1] = kInf;  // channel 1 NaN, channel 0 Inf
  const DeviceVector<T> dy = stored_as<T>(dyv);
  const DeviceVector<float> old = beta == 0.0f ? DeviceVector<float>(d.k, kNaN) : random_values(d.k, -1.0f, 1.0f, 53);
  std::vector<double> want(d.k, 0.0);
  for (std::size_t i = 0; i < dy.size(); ++i) want[(static_cast<int64_t>(i) / d.hw) % d.k] += kernels::to_f32(dy[i]);
  if (beta != 0.0f)
    for (int64_t ch = 0; ch < d.k; ++ch) want[ch] += beta * old[ch];
  DeviceVector<float> dbias = old;
  kernels::conv2d_bias_grad_cuda(dy.data(), d.n, d.k, d.hw, beta, dbias.data(), nullptr);
  expect_within(dbias, want, 1e-6, 2e-5, "dbias");
}

TEST(ConvKernelsEmulated, BiasGradientMatchesTheDoubleSum) {
  for (const Dims& d : kShapes)
    for (float beta : {0.0f, 1.0f}) check_bias_grad<BFloat16>(d, beta);
  for (float beta : {0.0f, 1.0f}) check_bias_grad<float>(kShapes[1], beta);
  check_bias_grad<Half>(kShapes[1], 0.0f);
  float poison = kNaN;
  kernels::conv2d_bias_grad_cuda<BFloat16>(nullptr, 2, 0, 4, 0.0f, &poison, nullptr);  // k = 0: no launch
  EXPECT_TRUE(std::isnan(poison));
}

}  // namespace
}  // namespace cumulus::testing
