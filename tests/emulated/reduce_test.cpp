// The reductions' CUDA kernels (kernels/cuda/reduce.cu) on the CPU emulation:
//   sum_rows: sums each column from 0 down the rows, the order sum_rows_cpu takes with beta 0, so
//             beta 0 gives its bits; beta 1 adds the old value after the column sum (the CPU adds it
//             first), so fl(CPU column sum + old) bit for bit, and within a bound of the exact sum.
//   sum_all:  block_sum's order, not the CPU's (double), so against a double reference within the
//             bound of that order; NaN and infinities propagate; n = 0 writes 0.
//   argmax_rows: argmax_rows_cpu's result, ties and NaN included.
// Columns and rows over one block, two (257) and four (773, the last partial).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cuda/kernels.h"
#include "tests/emulated/emulated.h"

namespace cumulus::testing {
namespace {

std::string shape_name(int64_t rows, int64_t cols) { return std::to_string(rows) + " x " + std::to_string(cols); }

// got within the first-order error bound of an f32 summation whose every term passes through at
// most `depth` additions: |got - want| <= depth * 2^-24 * sum_abs (sum_abs = sum of |terms|). NaN
// and infinities as expect_close.
void expect_within_sum_bound(const DeviceVector<float>& got, const std::vector<double>& want,
                             const std::vector<double>& sum_abs, double depth, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(want[i])) {
      ASSERT_TRUE(std::isnan(want[i]) ? std::isnan(got[i]) : got[i] == want[i])
          << what << " at " << i << ": " << got[i];
      continue;
    }
    ASSERT_LE(std::abs(got[i] - want[i]), depth * std::ldexp(sum_abs[i], -24))
        << what << " at " << i << ": " << got[i] << " vs " << want[i];
  }
}

template <typename T>
class ReduceEmulated : public ::testing::Test {};
TYPED_TEST_SUITE(ReduceEmulated, StorageTypes, StorageTypeName);

// rows 0 sums to 0; x carries NaN and infinities in some columns (both signs in some: NaN).
TYPED_TEST(ReduceEmulated, SumRowsMatchesTheCpu) {
  using T = TypeParam;
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{0, 5}, {1, 1}, {7, 255}, {3, 257}, {5, 773}}) {
    SCOPED_TRACE(shape_name(rows, cols));
    const auto x = stored_as<T>(with_specials(random_values(rows * cols, -2, 2, 1), 19));
    const auto xf = widened(x);  // exact
    DeviceVector<float> column_sums(static_cast<std::size_t>(cols), kNaN), out = column_sums;
    kernels::sum_rows_cpu(xf.data(), rows, cols, 0.0f, column_sums.data());
    kernels::sum_rows_cuda(x.data(), rows, cols, 0.0f, out.data(), nullptr);
    expect_same_bits(out, column_sums, "beta 0");

    const auto old = random_values(cols, -2, 2, 2);
    out = old;
    kernels::sum_rows_cuda(x.data(), rows, cols, 1.0f, out.data(), nullptr);
    DeviceVector<float> want_bits(old.size());
    std::vector<double> exact(old.begin(), old.end()), sum_abs(exact.size());
    for (std::size_t c = 0; c < old.size(); ++c) {
      want_bits[c] = column_sums[c] + old[c];
      sum_abs[c] = std::abs(old[c]);
      for (int64_t r = 0; r < rows; ++r) {
        exact[c] += xf[r * cols + c];
        sum_abs[c] += std::abs(xf[r * cols + c]);
      }
    }
    expect_same_bits(out, want_bits, "beta 1");
    expect_within_sum_bound(out, exact, sum_abs, static_cast<double>(rows + 1), "beta 1 against the exact sum");
  }
}

// n 0 writes 0 over the NaN there; 5000 leaves each of the 256 threads 20 terms. Random terms:
// within the bound of block_sum_all's depth (the thread's ceil(n / 256) terms, 5 shuffle levels in
// a warp, 3 across the 8 warps, and the scale's rounding). That bound is loose, so also multiples
// of 2^-8 in [-1, 1]: every partial sum is exact in f32 whatever the order (|sum| < 2^13, 21
// bits), so a term lost or counted twice shows as a wrong result, bit for bit.
TEST(ReduceEmulated, SumAllMatchesTheDoubleSum) {
  const float scale = 0.375f;
  for (int64_t n : {0, 1, 255, 257, 3 * 256 + 5, 5000})
    for (bool dyadic : {false, true}) {
      SCOPED_TRACE("n " + std::to_string(n) + (dyadic ? ", multiples of 2^-8" : ""));
      auto x = random_values(n, -1, 1, 3);
      if (dyadic)
        for (float& v : x) v = std::round(v * 256) / 256;
      DeviceValue<float> result(kNaN);
      kernels::sum_all_cuda(x.data(), n, scale, result.get(), nullptr);
      const float out = *result;
      double exact = 0, sum_abs = 0;
      for (float v : x) {
        exact += v;
        sum_abs += std::abs(v);
      }
      const double depth = dyadic ? 0.0 : static_cast<double>((n + 255) / 256 + 5 + 3 + 1);
      expect_within_sum_bound({out}, {exact * scale}, {sum_abs * scale}, depth, "sum");
      if (n == 0) EXPECT_EQ(out, 0.0f);
    }
}

TEST(ReduceEmulated, SumAllPropagatesNaNAndInfinities) {
  const std::vector<std::pair<DeviceVector<float>, float>> cases = {
      {{kNaN}, kNaN}, {{kInf}, kInf}, {{-kInf}, -kInf}, {{kInf, -kInf}, kNaN}, {{kInf, kNaN}, kNaN}};
  for (const auto& [specials, want] : cases) {
    auto x = random_values(3 * 256 + 5, -1, 1, 4);
    for (std::size_t k = 0; k < specials.size(); ++k) x[300 + 97 * k] = specials[k];  // different threads
    DeviceValue<float> result(0.0f);
    kernels::sum_all_cuda(x.data(), static_cast<int64_t>(x.size()), 1.0f, result.get(), nullptr);
    const float out = *result;
    if (std::isnan(want)) EXPECT_TRUE(std::isnan(out)) << specials.size() << " specials: " << out;
    else EXPECT_EQ(out, want);
  }
}

// torch.argmax's rule, written independently of kernels::row_argmax: the first NaN wherever it
// stands (NaN counts as the largest value), else the first largest value.
int32_t argmax_rule(const float* x, int64_t cols) {
  for (int64_t j = 0; j < cols; ++j)
    if (std::isnan(x[j])) return static_cast<int32_t>(j);
  int32_t best = 0;
  for (int64_t j = 1; j < cols; ++j)
    if (x[j] > x[best]) best = static_cast<int32_t>(j);
  return best;
}

TYPED_TEST(ReduceEmulated, ArgmaxRowsMatchesTheCpuFirstMaximumAndNaNRule) {
  using T = TypeParam;
  for (int64_t rows : {0, 1, 7, 257})
    for (int64_t cols : {1, 10, 33}) {
      SCOPED_TRACE(shape_name(rows, cols));
      const auto x = tied_rows<T>(rows, cols, 5);
      DeviceVector<int32_t> out(static_cast<std::size_t>(rows), -1), want = out;
      kernels::argmax_rows_cpu(x.data(), rows, cols, want.data());
      kernels::argmax_rows_cuda(x.data(), rows, cols, out.data(), nullptr);
      expect_same_bits(out, want, "argmax");
      const auto xf = widened(x);
      for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(out[r], argmax_rule(xf.data() + r * cols, cols)) << "row " << r;
    }
}

}  // namespace
}  // namespace cumulus::testing
