// max_pool2d's CUDA kernels (kernels/cuda/pool.cu: bf16's path on CUDA, Note [bf16 on cuDNN];
// templated, so f32 and f16 too) on the CPU emulation, against the CPU kernels (kernels/cpu/pool.cpp).
// Both pick each window's element by the one rule (kernels/pool_rules.h) and the backward makes the
// CPU's additions in the CPU's order, so they agree bit for bit (a NaN matching any NaN): forward and
// backward with beta 0 over NaN, 1 adding and 0.5 scaling, over inputs with many ties (values in
// steps of 1/4, and -0 beside +0: the first wins), NaN, +-Inf, and geometries that take each of
// the CPU's paths: 2x2 stride 2 on even planes (its tiled path) and odd ones, overlapping 3x3
// windows with padding, a 2x3 kernel with strides (1, 2); 432 to 700 elements (two and three
// blocks of 256, the last partial), and zero size.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/conv_kernels.h"
#include "kernels/cuda/kernels.h"
#include "tests/emulated/emulated.h"

namespace cumulus::testing {
namespace {

using kernels::Pool2dGeometry;

Pool2dGeometry geometry(int64_t n, int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                        int64_t ph, int64_t pw) {
  Pool2dGeometry g;
  g.n = n, g.c = c, g.h = h, g.w = w, g.kernel_h = kh, g.kernel_w = kw, g.stride_h = sh, g.stride_w = sw;
  g.pad_h = ph, g.pad_w = pw;
  g.out_h = (h + 2 * ph - kh) / sh + 1;
  g.out_w = (w + 2 * pw - kw) / sw + 1;
  return g;
}

std::string name(const Pool2dGeometry& g) {
  return std::to_string(g.n) + "x" + std::to_string(g.c) + "x" + std::to_string(g.h) + "x" + std::to_string(g.w) +
         ", kernel " + std::to_string(g.kernel_h) + "x" + std::to_string(g.kernel_w) + ", stride " +
         std::to_string(g.stride_h) + "x" + std::to_string(g.stride_w) + ", pad " + std::to_string(g.pad_h) + "x" +
         std::to_string(g.pad_w);
}

const std::vector<Pool2dGeometry> kGeometries = {
    geometry(2, 3, 6, 6, 2, 2, 2, 2, 0, 0),   // the CPU's tiled 2x2 path
    geometry(4, 5, 7, 5, 2, 2, 2, 2, 0, 0),   // 2x2 on odd planes: the last row and column in no window
    geometry(2, 3, 9, 8, 3, 3, 2, 2, 1, 1),   // overlapping windows, padding
    geometry(1, 2, 5, 9, 2, 3, 1, 2, 1, 1)};  // a 2x3 kernel, strides (1, 2)

// x in steps of 1/4 (many ties), with -0 and +0 side by side, NaN, +Inf and -Inf sprinkled in.
DeviceVector<float> pool_input(const Pool2dGeometry& g) {
  DeviceVector<float> x = random_values(g.n * g.c * g.h * g.w, -2.0f, 2.0f, 40);
  for (float& v : x) v = std::round(v * 4) / 4;
  for (std::size_t i = 0; i + 1 < x.size(); i += 23) x[i] = -0.0f, x[i + 1] = 0.0f;
  for (std::size_t i = 7; i < x.size(); i += 97) x[i] = kNaN;
  for (std::size_t i = 31; i < x.size(); i += 89) x[i] = kInf;
  for (std::size_t i = 50; i < x.size(); i += 71) x[i] = -kInf;
  return x;
}

template <typename T>
void check_pool(const Pool2dGeometry& g) {
  SCOPED_TRACE(std::string(dtype_name(dtype_of<T>::value)) + ", " + name(g));
  const DeviceVector<T> x = stored_as<T>(pool_input(g));
  const std::size_t outputs = static_cast<std::size_t>(g.n * g.c * g.out_h * g.out_w);
  DeviceVector<T> cpu_y(outputs), y(outputs, kernels::from_f32<T>(kNaN));
  kernels::max_pool2d_forward_cpu(g, x.data(), cpu_y.data());
  kernels::max_pool2d_forward_cuda(g, x.data(), y.data(), nullptr);
  expect_same_values(y, cpu_y, "y");

  auto dyv = random_values(static_cast<int64_t>(outputs), -1.0f, 1.0f, 41);
  if (outputs > 5) dyv[5] = kNaN;
  const DeviceVector<T> dy = stored_as<T>(dyv);
  for (float beta : {0.0f, 1.0f, 0.5f}) {
    SCOPED_TRACE("beta " + std::to_string(beta));
    const DeviceVector<T> old = beta == 0.0f
                                    ? DeviceVector<T>(x.size(), kernels::from_f32<T>(kNaN))
                                    : stored_as<T>(random_values(static_cast<int64_t>(x.size()), -1.0f, 1.0f, 42));
    DeviceVector<T> cpu_dx = old, dx = old;
    kernels::max_pool2d_backward_cpu(g, x.data(), dy.data(), beta, cpu_dx.data());
    kernels::max_pool2d_backward_cuda(g, x.data(), dy.data(), beta, dx.data(), nullptr);
    expect_same_values(dx, cpu_dx, "dx");
  }
}

TEST(PoolKernelsEmulated, MatchTheCpuBitForBit) {
  for (const Pool2dGeometry& g : kGeometries) check_pool<BFloat16>(g);
  check_pool<float>(kGeometries[0]);
  check_pool<float>(kGeometries[2]);
  check_pool<Half>(kGeometries[2]);
}

// The rule's two corners by hand: the last NaN in a window is its maximum (PyTorch's pick), and of
// equal values the first in row-major order is taken (-0 before +0 keeps -0's bits; its gradient
// goes there).
TEST(PoolKernelsEmulated, TheLastNaNWinsAndTiesGoToTheFirst) {
  const Pool2dGeometry g = geometry(1, 1, 2, 4, 2, 2, 2, 2, 0, 0);
  const DeviceVector<float> x = {-0.0f, 0.0f,  kNaN, 1.0f,  //
                                 0.0f,  -1.0f, kNaN, 2.0f};
  DeviceVector<float> y(2, 7.0f), dx(8, kNaN);
  kernels::max_pool2d_forward_cuda(g, x.data(), y.data(), nullptr);
  EXPECT_TRUE(std::signbit(y[0]) && y[0] == 0.0f) << "the first of the tied zeros, -0";
  EXPECT_TRUE(std::isnan(y[1]));
  const DeviceVector<float> dy = {3.0f, 4.0f};
  kernels::max_pool2d_backward_cuda(g, x.data(), dy.data(), 0.0f, dx.data(), nullptr);
  EXPECT_EQ(dx, (DeviceVector<float>{3, 0, 0, 0, 0, 0, 4, 0}));
}

// Zero size: nothing launched, nothing written.
TEST(PoolKernelsEmulated, ZeroSize) {
  const Pool2dGeometry g = geometry(0, 3, 4, 4, 2, 2, 2, 2, 0, 0);
  kernels::max_pool2d_forward_cuda<BFloat16>(g, nullptr, nullptr, nullptr);
  kernels::max_pool2d_backward_cuda<BFloat16>(g, nullptr, nullptr, 0.0f, nullptr, nullptr);
}

}  // namespace
}  // namespace cumulus::testing
