// index_scatter_add (kernels/cuda/structural.cu) with thousands of positions, on the CPU emulation:
// the positions sorted by index, then each index's run summed in order (Note [Sorted scatter-add]),
// give index_scatter_add_cpu's bits with many repeats of few indices and with mostly distinct ones,
// beta 0 over NaN and beta 1, and counts that are not powers of two (the sort's padding). Indices
// outside [0, dim) contribute nothing. That the sort makes it O(count log^2 count) rather than the
// quadratic scan it replaced only a GPU's timing shows. With partials (the engine's form), runs
// longer than a segment of 32 positions are summed by segments, then the segments in order:
// dyadic terms (every order exact) give the CPU's bits, random terms stay within the bound of that
// order and give the same bits on a second run; runs within one segment keep the CPU's bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/structural_kernels.h"
#include "kernels/cuda/structural_kernels.h"
#include "tests/emulated/emulated.h"

namespace cumulus::testing {
namespace {

// The launcher on device copies of its arguments (with the partials of segments when `segments`);
// dx's values after it, on the host.
template <typename Values, typename T>
std::vector<T> scatter_add_cuda(const Values& dy, int64_t outer, const std::vector<int32_t>& idx, int64_t dim,
                                int64_t inner, float beta, const std::vector<T>& start, bool segments = false) {
  const auto count = static_cast<int64_t>(idx.size());
  const DeviceVector<T> dy_on_device(dy.begin(), dy.end());
  const DeviceVector<int32_t> idx_on_device = on_device(idx);
  DeviceVector<T> dx = on_device(start);
  DeviceVector<uint64_t> scratch(static_cast<std::size_t>(kernels::index_scatter_add_scratch(count)),
                                 0x5a5a5a5a5a5a5a5a);
  DeviceVector<float> partials(static_cast<std::size_t>(kernels::index_scatter_add_partials(count, outer, inner)),
                               kNaN);
  kernels::index_scatter_add_cuda(dy_on_device.data(), outer, count, idx_on_device.data(), dim, inner, beta, dx.data(),
                                  scratch.data(), segments ? partials.data() : nullptr, nullptr);
  return on_host(dx);
}

// Multiples of 2^-6 in [-2, 2]: every partial sum of a few thousand is exact in f32, whatever the order.
DeviceVector<float> dyadic(int64_t n, uint64_t seed) {
  auto x = random_values(n, -2, 2, seed);
  for (float& v : x) v = std::ldexp(std::round(std::ldexp(v, 6)), -6);
  return x;
}

TEST(StructuralScalingEmulated, ScatterAddOverThousandsOfPositionsMatchesTheCpu) {
  for (auto [outer, dim, inner, count] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
           {2, 40, 3, 3001}, {1, 5000, 2, 4096}, {3, 700, 1, 2500}}) {
    SCOPED_TRACE(std::to_string(dim) + " rows, " + std::to_string(count) + " positions");
    std::vector<int32_t> idx(static_cast<std::size_t>(count));
    const auto u = random_values(count, 0, 1, 21);
    for (int64_t j = 0; j < count; ++j) idx[j] = static_cast<int32_t>(u[j] * (dim - 1));
    const auto dy = random_values(outer * count * inner, -2, 2, 22);
    for (float beta : {0.0f, 1.0f}) {
      const auto old = random_values(outer * dim * inner, -2, 2, 23);
      std::vector<float> want(old.begin(), old.end());
      kernels::index_scatter_add_cpu(dy.data(), outer, count, idx.data(), dim, inner, beta, want.data());
      std::vector<float> start(old.begin(), old.end());
      if (beta == 0.0f) std::fill(start.begin(), start.end(), kNaN);
      expect_same_bits(scatter_add_cuda(dy, outer, idx, dim, inner, beta, start), want, "beta " + std::to_string(beta));
    }
  }
}

// Out-of-range positions are left out of every run; the in-range ones around them still sum in order.
TEST(StructuralScalingEmulated, ScatterAddSkipsIndicesOutOfRange) {
  const int64_t count = 1500, dim = 7;
  std::vector<int32_t> idx(count), in_range;
  std::vector<float> dy(count), dy_in_range;
  for (int64_t j = 0; j < count; ++j) {
    idx[j] = j % 5 == 0 ? (j % 2 == 0 ? -1 : static_cast<int32_t>(dim)) : static_cast<int32_t>(j % dim);
    dy[j] = static_cast<float>(j % 13) / 8.0f;
    if (idx[j] >= 0 && idx[j] < dim) {
      in_range.push_back(idx[j]);
      dy_in_range.push_back(dy[j]);
    }
  }
  std::vector<float> want(dim, kNaN);
  kernels::index_scatter_add_cpu(dy_in_range.data(), 1, static_cast<int64_t>(in_range.size()), in_range.data(), dim, 1,
                                 0.0f, want.data());
  expect_same_bits(scatter_add_cuda(dy, 1, idx, dim, 1, 0.0f, std::vector<float>(dim, kNaN)), want, "in range only");
}

// Runs of hundreds of positions (40 and 7 rows named thousands of times) and of a few (5000 rows),
// over segments: the CPU's bits for dyadic terms, beta 0 over NaN and beta 1; random terms the same
// bits twice and within (a segment's 32 terms + the segments + 2) roundings of the exact sums.
TEST(StructuralScalingEmulated, ScatterAddOverSegmentsOfLongRuns) {
  for (auto [outer, dim, inner, count] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
           {2, 40, 3, 3001}, {1, 7, 5, 1000}, {1, 5000, 2, 4096}}) {
    SCOPED_TRACE(std::to_string(dim) + " rows, " + std::to_string(count) + " positions");
    std::vector<int32_t> idx(static_cast<std::size_t>(count));
    const auto u = random_values(count, 0, 1, 31);
    for (int64_t j = 0; j < count; ++j) idx[j] = static_cast<int32_t>(u[j] * (dim - 1));
    const auto dy = dyadic(outer * count * inner, 32);
    for (float beta : {0.0f, 1.0f}) {
      const auto old = dyadic(outer * dim * inner, 33);
      std::vector<float> want(old.begin(), old.end()), start(old.begin(), old.end());
      kernels::index_scatter_add_cpu(dy.data(), outer, count, idx.data(), dim, inner, beta, want.data());
      if (beta == 0.0f) std::fill(start.begin(), start.end(), kNaN);
      expect_same_bits(scatter_add_cuda(dy, outer, idx, dim, inner, beta, start, true), want,
                       "dyadic, beta " + std::to_string(beta));
    }
    const auto x = random_values(outer * count * inner, -2, 2, 34);
    const std::vector<float> zeros(static_cast<std::size_t>(outer * dim * inner), kNaN);
    const auto got = scatter_add_cuda(x, outer, idx, dim, inner, 0.0f, zeros, true);
    cuda_emulation::reseed("scatter_add again");
    expect_same_bits(scatter_add_cuda(x, outer, idx, dim, inner, 0.0f, zeros, true), got, "a second run");
    std::vector<double> exact(got.size(), 0.0), sum_abs(got.size(), 0.0), runs(static_cast<std::size_t>(dim), 0.0);
    for (int64_t j = 0; j < count; ++j) runs[static_cast<std::size_t>(idx[j])] += 1;
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < count; ++j)
        for (int64_t i = 0; i < inner; ++i) {
          const std::size_t at = static_cast<std::size_t>((o * dim + idx[j]) * inner + i);
          exact[at] += x[(o * count + j) * inner + i];
          sum_abs[at] += std::abs(x[(o * count + j) * inner + i]);
        }
    for (std::size_t e = 0; e < got.size(); ++e) {
      const double depth = 32 + runs[(e / inner) % dim] / 32 + 2;
      ASSERT_LE(std::abs(got[e] - exact[e]), depth * std::ldexp(sum_abs[e], -24)) << "element " << e;
    }
  }
}

}  // namespace
}  // namespace cumulus::testing
