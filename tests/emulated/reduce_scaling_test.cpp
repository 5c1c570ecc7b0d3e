// The reductions' paths for large inputs (kernels/cuda/reduce.cu), on the CPU emulation:
//   sum_all past kSumAllOneBlock: two launches over a grid fixed by n (Note [Deterministic sum]),
//            against a double reference within the bound of that order, exact for dyadic terms
//            (a term lost or counted twice shows), NaN propagating, the same bits on a second run;
//            without partials it refuses rather than reading a null pointer.
//   sum_rows with rows >> cols: several row slices per column; dyadic terms give the CPU's bits
//            (every order is exact), random terms stay within the bound of the slices' order, and
//            beta 1 adds the old value after the column sum. With partials (Note [Column sums]):
//            a grid over row chunks too, the same checks within the bound of that order, the form
//            without partials' bits up to one chunk, the same bits on a second run.
// Whether these run in parallel on a GPU (their point) only a GPU's timing can show.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cuda/kernels.h"
#include "tests/emulated/emulated.h"

namespace cumulus::testing {
namespace {

// Multiples of 2^-bits in [-1, 1]: sums of up to 2^(24 - bits) of them are exact in f32.
DeviceVector<float> dyadic_values(int64_t n, int bits, uint64_t seed) {
  auto x = random_values(n, -1, 1, seed);
  for (float& v : x) v = std::ldexp(std::round(std::ldexp(v, bits)), -bits);
  return x;
}

float sum_all(const DeviceVector<float>& x, float scale) {
  const auto n = static_cast<int64_t>(x.size());
  DeviceVector<float> partials(static_cast<std::size_t>(kernels::sum_all_blocks(n)), kNaN);
  DeviceValue<float> out(kNaN);
  kernels::sum_all_cuda(x.data(), n, scale, out.get(), partials.empty() ? nullptr : partials.data(), nullptr);
  return *out;
}

TEST(ReduceScalingEmulated, SumAllUsesOneBlockUpToItsLimitAndAGridAbove) {
  EXPECT_EQ(kernels::sum_all_blocks(0), 0);
  EXPECT_EQ(kernels::sum_all_blocks(kernels::kSumAllOneBlock), 0);
  EXPECT_GT(kernels::sum_all_blocks(kernels::kSumAllOneBlock + 1), 1);
  EXPECT_GT(kernels::sum_all_blocks(1000003), kernels::sum_all_blocks(kernels::kSumAllOneBlock + 1));
  EXPECT_LE(kernels::sum_all_blocks(int64_t{1} << 40), 1024);
}

// Random terms within the first-order bound of the two stages' depth: a thread's terms, block_sum's
// 8 levels, the second stage's terms per thread and 8 levels, and the scale.
TEST(ReduceScalingEmulated, SumAllOverAGridMatchesTheDoubleSum) {
  const float scale = 0.375f;
  for (int64_t n : {kernels::kSumAllOneBlock, kernels::kSumAllOneBlock + 1, int64_t{1000003}}) {
    SCOPED_TRACE("n " + std::to_string(n));
    const auto x = random_values(n, -1, 1, 11);
    double exact = 0, sum_abs = 0;
    for (float v : x) {
      exact += v;
      sum_abs += std::abs(v);
    }
    const int64_t blocks = std::max<int64_t>(kernels::sum_all_blocks(n), 1);
    const double depth =
        static_cast<double>((n + blocks * 256 - 1) / (blocks * 256) + 8 + (blocks + 255) / 256 + 8 + 1);
    const float got = sum_all(x, scale);
    EXPECT_LE(std::abs(got - exact * scale), depth * std::ldexp(sum_abs * scale, -24)) << got << " vs " << exact;
    const float again = sum_all(x, scale);
    EXPECT_EQ(std::memcmp(&got, &again, sizeof got), 0) << "a second run";

    const auto d = dyadic_values(n, 4, 12);  // |every partial sum| < 2^20: 24 bits
    double d_exact = 0;
    for (float v : d) d_exact += v;
    EXPECT_EQ(sum_all(d, 1.0f), static_cast<float>(d_exact));
  }
}

TEST(ReduceScalingEmulated, SumAllOverAGridPropagatesNaNAndInfinities) {
  auto x = random_values(300007, -1, 1, 13);
  x[299999] = kInf;
  EXPECT_EQ(sum_all(x, 1.0f), kInf);
  x[5] = kNaN;
  EXPECT_TRUE(std::isnan(sum_all(x, 1.0f)));
}

TEST(ReduceScalingEmulated, SumAllPastOneBlockNeedsItsPartials) {
  const DeviceVector<float> x(static_cast<std::size_t>(kernels::kSumAllOneBlock + 1), 1.0f);
  DeviceValue<float> out(kNaN);
  EXPECT_THROW(kernels::sum_all_cuda(x.data(), static_cast<int64_t>(x.size()), 1.0f, out.get(), nullptr),
               InvalidArgument);
}

template <typename T>
class ReduceScalingEmulated : public ::testing::Test {};
TYPED_TEST_SUITE(ReduceScalingEmulated, StorageTypes, StorageTypeName);

TYPED_TEST(ReduceScalingEmulated, SumRowsOverRowSlicesMatchesTheCpu) {
  using T = TypeParam;
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{64, 3}, {65, 33}, {1000, 10}, {4099, 3}}) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols));
    // Dyadic terms stored exactly in every T: every order gives the CPU's bits.
    const auto xd = stored_as<T>(dyadic_values(rows * cols, 6, 14));
    const auto xdf = widened(xd);
    DeviceVector<float> want(static_cast<std::size_t>(cols), kNaN), got = want;
    kernels::sum_rows_cpu(xdf.data(), rows, cols, 0.0f, want.data());
    kernels::sum_rows_cuda(xd.data(), rows, cols, 0.0f, got.data(), nullptr);
    expect_same_bits(got, want, "dyadic, beta 0");

    const auto x = stored_as<T>(random_values(rows * cols, -2, 2, 15));
    const auto xf = widened(x);
    DeviceVector<float> sums(static_cast<std::size_t>(cols), kNaN);
    kernels::sum_rows_cuda(x.data(), rows, cols, 0.0f, sums.data(), nullptr);
    const auto old = random_values(cols, -2, 2, 16);
    got = old;
    kernels::sum_rows_cuda(x.data(), rows, cols, 1.0f, got.data(), nullptr);
    const double depth = static_cast<double>((rows + 7) / 8 + 8 + 1);  // a slice's rows, 8 slices, old
    for (int64_t c = 0; c < cols; ++c) {
      double exact = 0, sum_abs = 0;
      for (int64_t r = 0; r < rows; ++r) {
        exact += xf[r * cols + c];
        sum_abs += std::abs(xf[r * cols + c]);
      }
      ASSERT_LE(std::abs(sums[c] - exact), depth * std::ldexp(sum_abs, -24)) << "column " << c;
      ASSERT_EQ(got[c], sums[c] + old[c]) << "beta 1 adds the old value after the sum, column " << c;
    }
  }
}

// The 2-D grid: rows past one chunk (256) in several chunks, each with its slices; the partials' size
// is 0 up to one chunk (the launcher then takes no partials), and the form without them gives the
// same bits there.
TYPED_TEST(ReduceScalingEmulated, SumRowsOverRowChunksMatchesTheCpu) {
  using T = TypeParam;
  EXPECT_EQ(kernels::sum_rows_partials(256, 7), 0);
  EXPECT_EQ(kernels::sum_rows_partials(257, 7), 2 * 7);
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{200, 33}, {257, 5}, {1000, 40}, {2900, 3}}) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols));
    const int64_t n_partials = kernels::sum_rows_partials(rows, cols);
    DeviceVector<float> partials(static_cast<std::size_t>(std::max<int64_t>(n_partials, 1)), kNaN);
    float* pp = n_partials > 0 ? partials.data() : nullptr;
    const auto xd = stored_as<T>(dyadic_values(rows * cols, 6, 24));
    const auto xdf = widened(xd);
    DeviceVector<float> want(static_cast<std::size_t>(cols), kNaN), got = want;
    kernels::sum_rows_cpu(xdf.data(), rows, cols, 0.0f, want.data());
    kernels::sum_rows_cuda(xd.data(), rows, cols, 0.0f, got.data(), pp, nullptr);
    expect_same_bits(got, want, "dyadic, beta 0");

    const auto x = stored_as<T>(random_values(rows * cols, -2, 2, 25));
    const auto xf = widened(x);
    DeviceVector<float> sums(static_cast<std::size_t>(cols), kNaN), again = sums, one_chunk = sums;
    kernels::sum_rows_cuda(x.data(), rows, cols, 0.0f, sums.data(), pp, nullptr);
    cuda_emulation::reseed("sum_rows again");
    kernels::sum_rows_cuda(x.data(), rows, cols, 0.0f, again.data(), pp, nullptr);
    expect_same_bits(again, sums, "a second run");
    kernels::sum_rows_cuda(x.data(), rows, cols, 0.0f, one_chunk.data(), nullptr);
    if (n_partials == 0) expect_same_bits(one_chunk, sums, "without partials, one chunk");
    const auto old = random_values(cols, -2, 2, 26);
    got = old;
    kernels::sum_rows_cuda(x.data(), rows, cols, 1.0f, got.data(), pp, nullptr);
    const int64_t chunks = std::max<int64_t>(n_partials / cols, 1), chunk_rows = (rows + chunks - 1) / chunks;
    const double depth = static_cast<double>((chunk_rows + 7) / 8 + 8 + chunks + 1);  // slice, slices, chunks, old
    for (int64_t c = 0; c < cols; ++c) {
      double exact = 0, sum_abs = 0;
      for (int64_t r = 0; r < rows; ++r) {
        exact += xf[r * cols + c];
        sum_abs += std::abs(xf[r * cols + c]);
      }
      ASSERT_LE(std::abs(sums[c] - exact), depth * std::ldexp(sum_abs, -24)) << "column " << c;
      ASSERT_EQ(got[c], sums[c] + old[c]) << "beta 1 adds the old value after the sum, column " << c;
    }
  }
}

}  // namespace
}  // namespace cumulus::testing
