// index_scatter_add (kernels/cuda/structural.cu) with thousands of positions, on the CPU emulation:
// the positions sorted by index, then each index's run summed in order (Note [Sorted scatter-add]),
// give index_scatter_add_cpu's bits with many repeats of few indices and with mostly distinct ones,
// beta 0 over NaN and beta 1, and counts that are not powers of two (the sort's padding). Indices
// outside [0, dim) contribute nothing. That the sort makes it O(count log^2 count) rather than the
// quadratic scan it replaced only a GPU's timing shows.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/structural_kernels.h"
#include "kernels/cuda/structural_kernels.h"
#include "tests/emulated/emulated.h"

namespace cumulus::testing {
namespace {

// The launcher on device copies of its arguments; dx's values after it, on the host.
template <typename Values, typename T>
std::vector<T> scatter_add_cuda(const Values& dy, int64_t outer, const std::vector<int32_t>& idx, int64_t dim,
                                int64_t inner, float beta, const std::vector<T>& start) {
  const auto count = static_cast<int64_t>(idx.size());
  const DeviceVector<T> dy_on_device(dy.begin(), dy.end());
  const DeviceVector<int32_t> idx_on_device = on_device(idx);
  DeviceVector<T> dx = on_device(start);
  DeviceVector<uint64_t> scratch(static_cast<std::size_t>(kernels::index_scatter_add_scratch(count)),
                                 0x5a5a5a5a5a5a5a5a);
  kernels::index_scatter_add_cuda(dy_on_device.data(), outer, count, idx_on_device.data(), dim, inner, beta, dx.data(),
                                  scratch.data(), nullptr);
  return on_host(dx);
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

}  // namespace
}  // namespace cumulus::testing
