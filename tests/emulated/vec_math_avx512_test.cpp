// kernels/cpu/vec_math.h's AVX-512 functions (vec_math_avx512.cpp) against what they promise:
// GELU-tanh with the AVX2 functions' bits (the same operations per element), the tile product with
// each output summed in order by fused multiply-adds (so a plain loop of std::fma gives the same
// bits), layer norm's parameter-gradient sums with the scalar loop's bits. Skipped on a CPU without AVX-512F (or AVX2
// and FMA, for the comparison).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/vec_math.h"
#include "tests/emulated/emulated.h"

namespace cumulus::testing {
namespace {

namespace vec = kernels::vec;
namespace vec512 = kernels::vec512;

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

std::vector<float> host_values(int64_t n, float lo, float hi, uint64_t seed) {
  const DeviceVector<float> v = random_values(n, lo, hi, seed);
  return std::vector<float>(v.begin(), v.end());
}

TEST(VecMathAvx512, GeluTanhGivesTheAvx2Bits) {
  if (!vec512::available() || !vec::available()) GTEST_SKIP() << "no AVX-512F, or no AVX2 and FMA";
  for (int64_t n : {int64_t{1}, int64_t{15}, int64_t{17}, int64_t{1000}}) {
    SCOPED_TRACE("n " + std::to_string(n));
    std::vector<float> x = host_values(n, -12.0f, 12.0f, 7), dy = host_values(n, -2.0f, 2.0f, 8);
    x[0] = 0.0f;
    if (n > 3) x[1] = -INFINITY, x[2] = INFINITY, x[3] = NAN;
    std::vector<float> y2(n), y5(n), g2(n), g5(n);
    vec::gelu_tanh_f32(x.data(), y2.data(), n);
    vec512::gelu_tanh_f32(x.data(), y5.data(), n);
    vec::gelu_tanh_grad_f32(x.data(), dy.data(), g2.data(), n);
    vec512::gelu_tanh_grad_f32(x.data(), dy.data(), g5.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_TRUE(same_bits(y2[i], y5[i])) << "forward at x = " << x[i] << ": " << y2[i] << " vs " << y5[i];
      EXPECT_TRUE(same_bits(g2[i], g5[i])) << "gradient at x = " << x[i] << ": " << g2[i] << " vs " << g5[i];
    }
  }
}

TEST(VecMathAvx512, GemmIsAnOrderedFmaSum) {
  if (!vec512::available()) GTEST_SKIP() << "no AVX-512F";
  struct Shape {
    int64_t m, n, k;
    bool transposed_a, accumulate;
  };
  const Shape shapes[] = {{1, 1, 1, false, false},  {16, 64, 32, false, false}, {13, 37, 9, false, true},
                          {32, 32, 64, true, true}, {7, 100, 5, true, false},   {9, 16, 0, false, true}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE("m " + std::to_string(s.m) + " n " + std::to_string(s.n) + " k " + std::to_string(s.k) +
                 (s.transposed_a ? " a transposed" : "") + (s.accumulate ? " accumulating" : ""));
    const int64_t lda = s.transposed_a ? s.m + 3 : s.k + 2, ldb = s.n + 5, ldc = s.n + 1;
    const std::vector<float> a = host_values((s.transposed_a ? s.k : s.m) * lda + 1, -1.0f, 1.0f, 11);
    const std::vector<float> b = host_values(s.k * ldb + 1, -1.0f, 1.0f, 12);
    std::vector<float> c = host_values(s.m * ldc, -1.0f, 1.0f, 13), expected = c;
    const int64_t a_rs = s.transposed_a ? 1 : lda, a_cs = s.transposed_a ? lda : 1;
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j) {
        float v = s.accumulate ? expected[i * ldc + j] : 0.0f;
        for (int64_t l = 0; l < s.k; ++l) v = std::fma(a[i * a_rs + l * a_cs], b[l * ldb + j], v);
        expected[i * ldc + j] = v;
      }
    vec512::gemm_f32(s.m, s.n, s.k, a.data(), a_rs, a_cs, b.data(), ldb, c.data(), ldc, s.accumulate);
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < ldc; ++j)  // the padding past n is left alone
        ASSERT_TRUE(same_bits(c[i * ldc + j], expected[i * ldc + j]))
            << "c[" << i << "][" << j << "] " << c[i * ldc + j] << " vs " << expected[i * ldc + j];
  }
}

TEST(VecMathAvx512, LayerNormParameterGradientsGiveTheScalarBits) {
  if (!vec512::available()) GTEST_SKIP() << "no AVX-512F";
  const int64_t rows = 5, n = 37;
  const std::vector<float> x = host_values(rows * n, -3.0f, 3.0f, 21), dy = host_values(rows * n, -1.0f, 1.0f, 22);
  std::vector<double> sw(n + 1, 0.0), sb(n + 1, 0.0), ew(n + 1, 0.0), eb(n + 1, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double mean = 0.1 * static_cast<double>(r) - 0.2, rstd = 1.5f;
    vec512::layer_norm_param_grads_row_f32(x.data() + r * n, dy.data() + r * n, mean, rstd, n, sw.data(), sb.data());
    for (int64_t c = 0; c < n; ++c) {
      const float g = dy[r * n + c];
      ew[c] += g * ((static_cast<double>(x[r * n + c]) - mean) * rstd);
      eb[c] += g;
    }
  }
  for (int64_t c = 0; c <= n; ++c) {  // the one past n is left alone
    EXPECT_EQ(sw[c], ew[c]) << "column " << c;
    EXPECT_EQ(sb[c], eb[c]) << "column " << c;
  }
}

}  // namespace
}  // namespace cumulus::testing
