// The elementwise CUDA kernels (kernels/cuda/elementwise.cu), the very source nvcc compiles, run on
// the CPU emulation against their CPU twins (kernels/cpu/elementwise.cpp) bit for bit: none of them
// sums, so each element's arithmetic is the CPU's. Sizes 0, 1, a block less one (255), a block and
// one (257) and three blocks and a partial fourth; NaN, infinities, signed zeros and rounding ties
// among the inputs (with_specials); beta 0 over a destination of NaN (never read) and beta 1; f32,
// bf16 and f16 storage wherever a launcher is templated.
#include <gtest/gtest.h>

#include <cmath>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cuda/kernels.h"
#include "tests/emulated/emulated.h"

namespace cumulus::testing {
namespace {

using kernels::from_f32;
using kernels::to_f32;

constexpr int64_t kSizes[] = {0, 1, 255, 257, 3 * 256 + 5};

// n values in [-2, 2) stored as T, with_specials every `stride` elements from `first`.
template <typename T>
DeviceVector<T> inputs(int64_t n, uint64_t seed, std::size_t stride = 7, std::size_t first = 0) {
  return stored_as<T>(with_specials(random_values(n, -2, 2, seed), stride, first));
}

template <typename T>
DeviceVector<T> filled(int64_t n, float value) {
  return DeviceVector<T>(static_cast<std::size_t>(n), from_f32<T>(value));
}

// What a beta-blended destination holds before the launch: NaN for beta 0 (the kernel must not
// read it), values with specials for beta 1.
template <typename T>
DeviceVector<T> destination(int64_t n, float beta, uint64_t seed) {
  return beta == 0.0f ? filled<T>(n, kNaN) : inputs<T>(n, seed, 5, 3);
}

std::string size_name(int64_t n, float beta) { return "n " + std::to_string(n) + ", beta " + std::to_string(beta); }

template <typename T>
class ElementwiseEmulated : public ::testing::Test {};
TYPED_TEST_SUITE(ElementwiseEmulated, StorageTypes, StorageTypeName);

// cols 0 and rows 0 write nothing; 7 x 113 is three blocks and a partial fourth, its rows across
// the blocks' edges.
TYPED_TEST(ElementwiseEmulated, BroadcastRowsMatchesTheCpu) {
  using T = TypeParam;
  for (auto [rows, cols] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 7}, {7, 0}, {1, 1}, {1, 255}, {257, 1}, {7, 113}}) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols));
    const auto row = with_specials(random_values(cols, -2, 2, 1));
    DeviceVector<float> want(static_cast<std::size_t>(rows * cols));
    kernels::broadcast_rows_cpu(row.data(), rows, cols, want.data());
    auto out = filled<T>(rows * cols, kNaN);
    kernels::broadcast_rows_cuda(row.data(), rows, cols, out.data(), nullptr);
    expect_same_bits(out, stored_as<T>(want), "out");
  }
}

TYPED_TEST(ElementwiseEmulated, ReluForwardMatchesTheCpuAndPropagatesNaN) {
  using T = TypeParam;
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n " + std::to_string(n));
    const auto x = inputs<T>(n, 2);
    auto y = filled<T>(n, kNaN), want = y;
    kernels::relu_forward_cpu(x.data(), want.data(), n);
    kernels::relu_forward_cuda(x.data(), y.data(), n, nullptr);
    expect_same_bits(y, want, "y");
    // The CPU's rule itself (`x <= 0 ? 0 : x`), not fmaxf(x, 0), which would hide a diverged model.
    for (std::size_t i = 0; i < x.size(); ++i)
      if (std::isnan(to_f32(x[i]))) ASSERT_TRUE(std::isnan(to_f32(y[i]))) << "NaN at " << i;
  }
}

// y and dy carry their specials at different strides, so NaN and infinite gradients meet positive,
// zero and NaN outputs.
TYPED_TEST(ElementwiseEmulated, ReluBackwardMatchesTheCpu) {
  using T = TypeParam;
  for (int64_t n : kSizes)
    for (float beta : {0.0f, 1.0f}) {
      SCOPED_TRACE(size_name(n, beta));
      const auto y = inputs<T>(n, 3), dy = inputs<T>(n, 4, 3, 1);
      auto dx = destination<T>(n, beta, 5), want = dx;
      kernels::relu_backward_cpu(y.data(), dy.data(), beta, want.data(), n);
      kernels::relu_backward_cuda(y.data(), dy.data(), beta, dx.data(), n, nullptr);
      expect_same_bits(dx, want, "dx");
    }
}

TYPED_TEST(ElementwiseEmulated, AccumulateMatchesTheCpu) {
  using T = TypeParam;
  for (int64_t n : kSizes)
    for (float beta : {0.0f, 1.0f}) {
      SCOPED_TRACE(size_name(n, beta));
      const auto x = inputs<T>(n, 6);
      auto y = destination<T>(n, beta, 7), want = y;
      kernels::accumulate_cpu(x.data(), beta, want.data(), n);
      kernels::accumulate_cuda(x.data(), beta, y.data(), n, nullptr);
      expect_same_bits(y, want, "y");
      if (beta == 0.0f) expect_same_bits(y, x, "beta 0 copies x's bits");
    }
}

// One value per size (each launch costs thousands of thread switches): -0, infinity, NaN, ...
TEST(ElementwiseEmulated, FillMatchesTheCpu) {
  const float values[] = {-0.0f, kInf, kNaN, 2.5f};
  for (std::size_t k = 0; k < std::size(kSizes); ++k) {
    const int64_t n = kSizes[k];
    const float value = values[k % std::size(values)];
    SCOPED_TRACE("n " + std::to_string(n) + ", value " + std::to_string(value));
    auto out = random_values(n, -1, 1, 8), want = out;
    kernels::fill_cpu(want.data(), value, n);
    kernels::fill_cuda(out.data(), value, n, nullptr);
    expect_same_bits(out, want, "out");
  }
}

// Beta 1 adds to a destination with specials; a NaN scalar (at the largest size) fills NaN.
TEST(ElementwiseEmulated, FillFromScalarMatchesTheCpu) {
  for (int64_t n : kSizes)
    for (float beta : {0.0f, 1.0f}) {
      DeviceValue<float> scalar(n == kSizes[std::size(kSizes) - 1] && beta == 0.0f ? kNaN : 3.0f);
      SCOPED_TRACE(size_name(n, beta) + ", scalar " + std::to_string(*scalar));
      auto out = destination<float>(n, beta, 9), want = out;
      kernels::fill_from_scalar_cpu(scalar.get(), 0.25f, beta, want.data(), n);
      kernels::fill_from_scalar_cuda(scalar.get(), 0.25f, beta, out.data(), n, nullptr);
      expect_same_bits(out, want, "out");
    }
}

// Values spread over 2^-25 .. 2^14 besides the specials, so every rounding path of both 16-bit
// formats is taken (f16 subnormals, overflow, ties).
template <typename From, typename To>
void expect_convert_matches_the_cpu() {
  for (int64_t n : kSizes) {
    SCOPED_TRACE(std::string(dtype_name(dtype_of<From>::value)) + " -> " + dtype_name(dtype_of<To>::value) + ", n " +
                 std::to_string(n));
    auto values = random_values(n, -2, 2, 10);
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = std::ldexp(values[i], static_cast<int>(i % 40) - 25);
    const auto x = stored_as<From>(with_specials(values, 11));
    DeviceVector<To> y(x.size(), from_f32<To>(kNaN)), want = y;
    kernels::convert_cpu(x.data(), want.data(), n);
    kernels::convert_cuda(x.data(), y.data(), n, nullptr);
    expect_same_bits(y, want, "y");
  }
}

TEST(ElementwiseEmulated, ConvertMatchesTheCpuForEveryInstantiatedPair) {
  expect_convert_matches_the_cpu<float, BFloat16>();
  expect_convert_matches_the_cpu<float, Half>();
  expect_convert_matches_the_cpu<BFloat16, float>();
  expect_convert_matches_the_cpu<Half, float>();
  expect_convert_matches_the_cpu<BFloat16, Half>();
  expect_convert_matches_the_cpu<Half, BFloat16>();
}

// Pairs of lengths 0 to 600 (a block's threads loop over more than two blocks' worth), their y
// slices of one buffer with a gap between them: each slice gets accumulate_cpu's beta-1 bits and
// the gaps keep theirs.
TEST(ElementwiseEmulated, AddVectorsAddsEveryPairAndNothingElse) {
  const DeviceVector<int64_t> lengths = {300, 0, 1, 257, 600, 31};
  constexpr int64_t kGap = 9;
  DeviceVector<int64_t> offsets;
  int64_t total = kGap;
  for (int64_t n : lengths) offsets.push_back(std::exchange(total, total + n + kGap));
  auto y = with_specials(random_values(total, -2, 2, 11), 13), want = y;
  std::vector<DeviceVector<float>> xs;
  kernels::VectorAdds adds;
  for (std::size_t p = 0; p < lengths.size(); ++p) {
    xs.push_back(with_specials(random_values(lengths[p], -2, 2, 12 + p), 7, p));
    adds.x[p] = xs[p].data();
    adds.y[p] = y.data() + offsets[p];
    adds.n[p] = lengths[p];
    kernels::accumulate_cpu(xs[p].data(), 1.0f, want.data() + offsets[p], lengths[p]);
  }
  adds.count = static_cast<int>(lengths.size());
  kernels::add_vectors_cuda(adds, nullptr);
  expect_same_bits(y, want, "y");
}

}  // namespace
}  // namespace cumulus::testing
