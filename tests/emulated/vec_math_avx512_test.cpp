// kernels/cpu/vec_math.h's AVX-512 functions (vec_math_avx512.cpp) against what they promise, and
// the AVX2 rows that share their Notes (tests/CMakeLists.txt runs the cases that pick their width
// through the kernels again, capped to AVX2):
// GELU-tanh within 2 ulp with the AVX2 functions' special values, exp with their bits, the tile product with
// each output summed in order by fused multiply-adds (so a plain loop of std::fma gives the same
// bits), layer norm's parameter-gradient sums with the scalar loop's bits. Skipped on a CPU without AVX-512F (or AVX2
// and FMA, for the comparison).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/structural_kernels.h"
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

// The layer norm rows of each width this CPU runs: AVX2's are AVX-512's 8 lanes at a time, with the
// same Notes and the same bounds.
struct LayerNormRows {
  const char* name;
  decltype(&vec512::layer_norm_row_f32) forward;
  decltype(&vec512::layer_norm_grad_row_f32) backward;
};
std::vector<LayerNormRows> layer_norm_rows() {
  std::vector<LayerNormRows> rows;
  if (vec512::available()) rows.push_back({"AVX-512", vec512::layer_norm_row_f32, vec512::layer_norm_grad_row_f32});
  if (vec::available()) rows.push_back({"AVX2", vec::layer_norm_row_f32, vec::layer_norm_grad_row_f32});
  return rows;
}

double gelu_tanh_exact(double x) {
  return 0.5 * x * (1.0 + std::tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
}
double gelu_tanh_grad_exact(double x) {
  const double t = std::tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.79788456080286535588 * (1.0 + 3.0 * 0.044715 * x * x);
}

// Within 2 ulp of max(|exact|, 1), forward and backward, for both widths (AVX2's is AVX-512's form
// 8 lanes at a time, with a division for the reciprocal), over a dense grid of [-12, 12] (where the
// clamps and AVX-512's Newton step matter) and random points.
TEST(VecMathAvx512, GeluTanhIsWithinTwoUlpOfTheExactFunction) {
  if (!vec512::available() && !vec::available()) GTEST_SKIP() << "no AVX2 or AVX-512F";
  const int64_t grid = 48001;
  std::vector<float> x = host_values(1000, -12.0f, 12.0f, 7);
  for (int64_t i = 0; i < grid; ++i) x.push_back(-12.0f + 24.0f * static_cast<float>(i) / (grid - 1));
  const int64_t n = static_cast<int64_t>(x.size());
  using Forward = void (*)(const float*, float*, int64_t);
  using Backward = void (*)(const float*, const float*, float*, int64_t);
  struct Width {
    const char* name;
    bool runs;
    Forward forward;
    Backward backward;
  };
  for (const Width& w : {Width{"AVX-512", vec512::available(), vec512::gelu_tanh_f32, vec512::gelu_tanh_grad_f32},
                         Width{"AVX2", vec::available(), vec::gelu_tanh_f32, vec::gelu_tanh_grad_f32}}) {
    if (!w.runs) continue;
    SCOPED_TRACE(w.name);
    std::vector<float> dy(n, 1.0f), y(n), g(n);
    w.forward(x.data(), y.data(), n);
    w.backward(x.data(), dy.data(), g.data(), n);
    const double ulp = std::ldexp(1.0, -23);
    for (int64_t i = 0; i < n; ++i) {
      const double fy = gelu_tanh_exact(x[i]), fg = gelu_tanh_grad_exact(x[i]);
      ASSERT_LE(std::abs(y[i] - fy), 2 * ulp * std::max(std::abs(fy), 1.0)) << "forward at x = " << x[i];
      ASSERT_LE(std::abs(g[i] - fg), 2 * ulp * std::max(std::abs(fg), 1.0)) << "gradient at x = " << x[i];
    }
  }
}

// Zeros, infinities, NaN and values past the clamps give what the AVX2 functions give (PyTorch's
// answers: NaN for gelu(-inf), x - 0 for large x, -0 for large negative x), at every tail length.
TEST(VecMathAvx512, GeluTanhSpecialValuesAsTheAvx2Functions) {
  if (!vec512::available() || !vec::available()) GTEST_SKIP() << "no AVX-512F, or no AVX2 and FMA";
  const std::vector<float> specials = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e30f, -1e30f, 60.0f, -60.0f, -9.0f};
  for (int64_t n : {int64_t{1}, int64_t{15}, int64_t{17}, int64_t{40}}) {
    SCOPED_TRACE("n " + std::to_string(n));
    std::vector<float> x(n), dy = host_values(n, 0.5f, 2.0f, 8), y2(n), y5(n), g2(n), g5(n);
    for (int64_t i = 0; i < n; ++i) x[i] = specials[static_cast<std::size_t>(i) % specials.size()];
    vec::gelu_tanh_f32(x.data(), y2.data(), n);
    vec512::gelu_tanh_f32(x.data(), y5.data(), n);
    vec::gelu_tanh_grad_f32(x.data(), dy.data(), g2.data(), n);
    vec512::gelu_tanh_grad_f32(x.data(), dy.data(), g5.data(), n);
    const auto same = [](float a, float b) {
      return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b)) ||
             std::abs(a - b) <= 2e-7f * std::max(std::abs(a), 1.0f);
    };
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_TRUE(same(y2[i], y5[i])) << "forward at x = " << x[i] << ": " << y2[i] << " vs " << y5[i];
      EXPECT_TRUE(same(g2[i], g5[i])) << "gradient at x = " << x[i] << ": " << g2[i] << " vs " << g5[i];
    }
  }
}

// log_softmax's gradient dy - exp(y) sum(dy) with dy all ones (a sum exact in any order): the
// same bits from both widths exactly when their exp gives the same bits, over log-probabilities
// (y <= 0, all that the backward is given) down to where exp rounds to a denormal and flushes to 0.
TEST(VecMathAvx512, ExpGivesTheAvx2Bits) {
  if (!vec512::available() || !vec::available()) GTEST_SKIP() << "no AVX-512F, or no AVX2 and FMA";
  std::vector<float> y = host_values(4000, -100.0f, 0.0f, 9);
  for (float special : {-INFINITY, NAN, -87.34f, -87.3f, -103.0f, -1e-30f, -0.0f, 0.0f}) y.push_back(special);
  const int64_t n = static_cast<int64_t>(y.size());
  std::vector<float> dy(n, 1.0f), dx2(n), dx5(n);
  vec::softmax_grad_row_f32(true, y.data(), dy.data(), 0.0f, dx2.data(), n);
  vec512::softmax_grad_row_f32(true, y.data(), dy.data(), 0.0f, dx5.data(), n);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_TRUE(same_bits(dx2[i], dx5[i]) || (std::isnan(dx2[i]) && std::isnan(dx5[i])))
        << "at y = " << y[i] << ": " << dx2[i] << " vs " << dx5[i];
}

// Both widths' products (AVX2's 8-lane blocks give the same bits).
TEST(VecMathAvx512, GemmIsAnOrderedFmaSum) {
  if (!vec512::available() && !vec::available()) GTEST_SKIP() << "no AVX2 or AVX-512F";
  struct Shape {
    int64_t m, n, k;
    bool transposed_a, accumulate;
  };
  const Shape shapes[] = {{1, 1, 1, false, false},  {16, 64, 32, false, false}, {13, 37, 9, false, true},
                          {32, 32, 64, true, true}, {7, 100, 5, true, false},   {9, 16, 0, false, true},
                          {11, 24, 7, false, true}, {8, 47, 3, true, true}};
  using Gemm = decltype(&vec512::gemm_f32);
  std::vector<std::pair<const char*, Gemm>> widths;
  if (vec512::available()) widths.emplace_back("AVX-512", vec512::gemm_f32);
  if (vec::available()) widths.emplace_back("AVX2", vec::gemm_f32);
  for (const auto& [width, gemm] : widths)
    for (const Shape& s : shapes) {
      SCOPED_TRACE(width);
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
      gemm(s.m, s.n, s.k, a.data(), a_rs, a_cs, b.data(), ldb, c.data(), ldc, s.accumulate);
      for (int64_t i = 0; i < s.m; ++i)
        for (int64_t j = 0; j < ldc; ++j)  // the padding past n is left alone
          ASSERT_TRUE(same_bits(c[i * ldc + j], expected[i * ldc + j]))
              << "c[" << i << "][" << j << "] " << c[i * ldc + j] << " vs " << expected[i * ldc + j];
    }
}

// The attention's transpose moves every element exactly and touches nothing past the block; its
// row dots are within a rounding of the ordered double sum.
TEST(VecMathAvx512, TransposeAndRowDots) {
  if (!vec::available()) GTEST_SKIP() << "no AVX2";
  for (const auto& [rows, cols] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {8, 8}, {64, 32}, {37, 13}, {7, 9}}) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols));
    const int64_t src_ld = cols + 3, dst_ld = rows + 5;
    const std::vector<float> src = host_values(rows * src_ld, -1.0f, 1.0f, 21);
    std::vector<float> dst(static_cast<std::size_t>(cols * dst_ld), -7.0f);
    vec::transpose_f32(src.data(), src_ld, rows, cols, dst.data(), dst_ld);
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = 0; r < dst_ld; ++r)
        ASSERT_EQ(dst[c * dst_ld + r], r < rows ? src[r * src_ld + c] : -7.0f) << "dst[" << c << "][" << r << "]";
    const std::vector<float> b = host_values(rows * src_ld, -1.0f, 1.0f, 22);
    std::vector<float> dots(static_cast<std::size_t>(rows));
    vec::row_dots_f64(src.data(), src_ld, b.data(), src_ld, rows, cols, dots.data());
    for (int64_t r = 0; r < rows; ++r) {
      double exact = 0.0;
      for (int64_t c = 0; c < cols; ++c) exact += static_cast<double>(src[r * src_ld + c]) * b[r * src_ld + c];
      EXPECT_NEAR(dots[r], exact, std::abs(exact) * 1.2e-7 + 1e-30) << "row " << r;
    }
  }
}

// Note [Layer norm's row in one pass and a float output]: against float64's two-pass layer norm,
// the mean and rstd within a rounding of the exact values and the output within 2 ulp of
// max(|exact|, 1), over rows around 0 and around 1000 (where rounding the mean to float alone
// would cost 3e-5), of widths with a tail, with and without the affine parameters.
TEST(VecMathAvx512, LayerNormRowWithinTwoUlpOfTheExactRow) {
  if (layer_norm_rows().empty()) GTEST_SKIP() << "no AVX2 or AVX-512F";
  for (const LayerNormRows& rows : layer_norm_rows())
    for (const int64_t n : {int64_t{1}, int64_t{37}, int64_t{4096}, int64_t{100003}}) {
      for (const float centre : {0.0f, 1000.0f}) {
        SCOPED_TRACE(std::string(rows.name) + ", n " + std::to_string(n) + ", around " + std::to_string(centre));
        const std::vector<float> x = host_values(n, centre - 3.0f, centre + 3.0f, 51),
                                 weight = host_values(n, 0.5f, 1.5f, 52), bias = host_values(n, -1.0f, 1.0f, 53);
        double m = 0.0, v = 0.0;
        for (float e : x) m += e;
        m /= static_cast<double>(n);
        for (float e : x) v += (e - m) * (e - m);
        const double inv = 1.0 / std::sqrt(v / static_cast<double>(n) + 1e-5f);
        for (const bool affine : {false, true}) {
          std::vector<float> y(n);
          float mean = 0.0f, rstd = 0.0f;
          rows.forward(x.data(), affine ? weight.data() : nullptr, affine ? bias.data() : nullptr, n, 1e-5f, y.data(),
                       &mean, &rstd);
          EXPECT_EQ(mean, static_cast<float>(m));
          EXPECT_NEAR(rstd, inv, 1.2e-7 * inv);
          const double ulp = std::ldexp(1.0, -23);
          for (int64_t i = 0; i < n; ++i) {
            const double xhat = (x[i] - m) * inv;
            const double exact = affine ? xhat * weight[i] + bias[i] : xhat;
            // With the parameters: xhat's 2 ulp scaled by the weight, and the product's and sum's roundings.
            const double size = affine ? std::abs(xhat * weight[i]) + std::abs(bias[i]) : std::abs(xhat);
            const double tolerance = (affine ? 3 : 2) * ulp * std::max(size, 1.0);
            ASSERT_LE(std::abs(y[i] - exact), tolerance) << "at " << i << " (affine " << affine << ")";
          }
        }
      }
    }
}

// The gradient row's dx, in float from blocked float sums (Note [Blocked float sums] in
// kernels/cpu/vec_math_avx512.cpp), against the same formula in double (with the saved float mean
// and rstd, as the kernel takes them): within a few roundings of the terms it subtracts,
// dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy weight, and of the sums' terms (a lane of a
// block adds 8 of them).
TEST(VecMathAvx512, LayerNormGradientRowWithinFourUlpOfItsTerms) {
  if (layer_norm_rows().empty()) GTEST_SKIP() << "no AVX2 or AVX-512F";
  const int64_t n = 4099;
  const std::vector<float> x = host_values(n, 997.0f, 1003.0f, 61), dy = host_values(n, -1.0f, 1.0f, 62),
                           weight = host_values(n, 0.5f, 1.5f, 63);
  const float mean = 1000.0f, rstd = 0.58f;
  double sg = 0.0, sgx = 0.0, abs_g = 0.0, abs_gx = 0.0;
  std::vector<double> g(n), xhat(n);
  for (int64_t i = 0; i < n; ++i) {
    g[i] = static_cast<double>(dy[i] * weight[i]);
    xhat[i] = (static_cast<double>(x[i]) - mean) * rstd;
    sg += g[i];
    sgx += g[i] * xhat[i];
    abs_g += std::abs(g[i]);
    abs_gx += std::abs(g[i] * xhat[i]);
  }
  const double mg = sg / n, mgx = sgx / n, ulp = std::ldexp(1.0, -23);
  for (const LayerNormRows& rows : layer_norm_rows()) {
    SCOPED_TRACE(rows.name);
    std::vector<float> dx(n);
    rows.backward(x.data(), dy.data(), weight.data(), mean, rstd, n, 0.0f, dx.data(), nullptr, nullptr);
    for (int64_t i = 0; i < n; ++i) {
      const double exact = rstd * (g[i] - mg - xhat[i] * mgx);
      const double terms = rstd * (std::abs(g[i]) + std::abs(mg) + std::abs(xhat[i] * mgx));
      const double sums = rstd * (abs_g + std::abs(xhat[i]) * abs_gx) / n;
      ASSERT_LE(std::abs(dx[i] - exact), 4 * ulp * terms + 6 * ulp * sums) << "at " << i;
    }
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

// The row kernel's parameter terms (with and without a weight), added in float: dy xhat within two
// roundings of the double term (xhat in float), dy with one float add's bits; the one past n is
// left alone.
TEST(VecMathAvx512, LayerNormGradientRowAddsTheParameterTermsInFloat) {
  if (layer_norm_rows().empty()) GTEST_SKIP() << "no AVX2 or AVX-512F";
  const int64_t n = 37;
  const std::vector<float> x = host_values(n, -3.0f, 3.0f, 31), dy = host_values(n, -1.0f, 1.0f, 32),
                           weight = host_values(n, 0.5f, 1.5f, 33);
  const double u = std::ldexp(1.0, -24);
  for (const LayerNormRows& rows : layer_norm_rows())
    for (const float* w : {static_cast<const float*>(nullptr), weight.data()}) {
      SCOPED_TRACE(rows.name);
      std::vector<float> pw(n + 1, 0.25f), pb(n + 1, -0.5f), dx(n);
      rows.backward(x.data(), dy.data(), w, 0.3f, 1.5f, n, 0.0f, dx.data(), pw.data(), pb.data());
      for (int64_t c = 0; c < n; ++c) {
        const double term = dy[c] * ((static_cast<double>(x[c]) - 0.3f) * 1.5f);
        EXPECT_NEAR(pw[c], 0.25 + term, 3 * u * (0.25 + std::abs(term))) << "column " << c;
        EXPECT_EQ(pb[c], -0.5f + dy[c]) << "column " << c;
      }
      EXPECT_EQ(pw[n], 0.25f);
      EXPECT_EQ(pb[n], -0.5f);
    }
}

// The one-pass backward against the two passes at one shape (the test below).
void layer_norm_backward_in_one_pass_agrees(int64_t rows, int64_t cols) {
  const std::vector<float> x = host_values(rows * cols, -3.0f, 5.0f, 41),
                           dy = host_values(rows * cols, -1.0f, 1.0f, 42), weight = host_values(cols, 0.5f, 1.5f, 43);
  std::vector<float> mean(rows), rstd(rows), y(rows * cols);
  kernels::layer_norm_forward_cpu(x.data(), weight.data(), nullptr, rows, cols, 1e-5f, y.data(), mean.data(),
                                  rstd.data());
  for (float beta : {0.0f, 1.0f}) {
    SCOPED_TRACE("beta " + std::to_string(beta));
    std::vector<float> dx = host_values(rows * cols, -1.0f, 1.0f, 44), dw = host_values(cols, -1.0f, 1.0f, 45),
                       db = host_values(cols, -1.0f, 1.0f, 46), ex = dx, ew = dw, eb = db;
    kernels::layer_norm_backward_cpu(x.data(), dy.data(), weight.data(), mean.data(), rstd.data(), rows, cols, beta,
                                     dx.data(), beta, dw.data(), beta, db.data());
    kernels::layer_norm_backward_dx_cpu(x.data(), dy.data(), weight.data(), mean.data(), rstd.data(), rows, cols, beta,
                                        ex.data());
    kernels::layer_norm_param_grads_cpu(x.data(), dy.data(), mean.data(), rstd.data(), rows, cols, beta, ew.data(),
                                        beta, eb.data());
    for (int64_t i = 0; i < rows * cols; ++i) ASSERT_TRUE(same_bits(dx[i], ex[i])) << "dx at " << i;
    for (int64_t c = 0; c < cols; ++c) {  // float sums over 8 rows: within 12 roundings of their terms
      double terms_w = 0.0, terms_b = 0.0;
      for (int64_t r = 0; r < rows; ++r) {
        const double d = dy[r * cols + c];
        terms_w += std::abs(d * (x[r * cols + c] - static_cast<double>(mean[r])) * rstd[r]);
        terms_b += std::abs(d);
      }
      const double u = std::ldexp(1.0, -24);
      EXPECT_NEAR(dw[c], ew[c], 12 * u * terms_w + 2 * u * std::abs(ew[c])) << "dweight column " << c;
      EXPECT_NEAR(db[c], eb[c], 12 * u * terms_b + 2 * u * std::abs(eb[c])) << "dbias column " << c;
    }
  }
}

// Note [Layer norm's backward in one pass]: over enough rows for many blocks (and rows so wide that
// the sums' cap sets the blocks), dx has the bits of layer_norm_backward_dx_cpu and the parameter
// gradients agree with layer_norm_param_grads_cpu's double sums row by row within a few roundings
// of their terms (Note [Blocked float sums]), with each beta.
TEST(VecMathAvx512, LayerNormBackwardInOnePassAgreesWithTheTwoPasses) {
  if (!vec::available()) GTEST_SKIP() << "no AVX2";
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{3001, 77}, {23, 40001}}) {
    SCOPED_TRACE("rows " + std::to_string(rows) + ", cols " + std::to_string(cols));
    layer_norm_backward_in_one_pass_agrees(rows, cols);
  }
}

}  // namespace
}  // namespace cumulus::testing
