// The CUDA kernels of the reductions over dimensions (kernels/cuda/reduce_dims.cu) on the CPU
// emulation, against their CPU twins (kernels/cpu/reduce_dims.cpp):
//   sum_dims: both sum in double, in different orders, and round once: within one rounding of T of
//             the CPU's result and of the exact sum; NaN and infinities where the CPU has them; a
//             sum of no terms is 0, their mean NaN. Terms below and above the 256-thread threshold.
//   sum_dims_backward, extreme_dims (amax / amin) and its backward, select_along_dim, scatter_along_dim, multinomial:
//   the CPU's bits (the same
//             row rules, no sums in another order).
// select_along_dim with k 1 also gives argmax_rows_cpu's indices (kernels::row_argmax's rule).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/reduce_dims_kernels.h"
#include "kernels/cuda/reduce_dims_kernels.h"
#include "tests/emulated/emulated.h"

namespace cumulus::testing {
namespace {

using kernels::ReduceGeometry;

// A geometry (Note [Reduce geometry]) from explicit kept and reduced (size, stride) lists.
ReduceGeometry geometry(const std::vector<std::pair<int64_t, int64_t>>& kept,
                        const std::vector<std::pair<int64_t, int64_t>>& reduced) {
  ReduceGeometry g;
  for (auto [size, stride] : kept) {
    g.kept_size[g.kept_ndim] = size;
    g.kept_stride[g.kept_ndim++] = stride;
    g.outputs *= size;
  }
  for (auto [size, stride] : reduced) {
    g.reduced_size[g.reduced_ndim] = size;
    g.reduced_stride[g.reduced_ndim++] = stride;
    g.terms *= size;
  }
  return g;
}

struct NamedGeometry {
  std::string name;
  ReduceGeometry g;
};

// Over x [3, 40, 5] (600 elements): the middle dimension, the outer two, all, none; over
// x [3, 5000]: the rows (wide: 256 threads); over x [4, 0, 2]: terms of nothing.
std::vector<NamedGeometry> geometries() {
  return {{"[3, 40, 5] dim 1", geometry({{3, 200}, {5, 1}}, {{40, 5}})},
          {"[3, 40, 5] dims 0, 2", geometry({{40, 5}}, {{3, 200}, {5, 1}})},
          {"[3, 40, 5] all", geometry({}, {{600, 1}})},
          {"[3, 40, 5] none", geometry({{600, 1}}, {})},
          {"[3, 5000] dim 1", geometry({{3, 5000}}, {{5000, 1}})},
          {"[4, 0, 2] dim 1", geometry({{4, 0}, {2, 1}}, {{0, 2}})}};
}

int64_t input_size(const ReduceGeometry& g) { return g.outputs * g.terms; }

template <typename T>
class ReduceDimsEmulated : public ::testing::Test {};
TYPED_TEST_SUITE(ReduceDimsEmulated, StorageTypes, StorageTypeName);

TYPED_TEST(ReduceDimsEmulated, SumDimsMatchesTheCpuToOneRounding) {
  using T = TypeParam;
  for (const NamedGeometry& ng : geometries())
    for (int64_t divisor : {int64_t{1}, ng.g.terms}) {
      SCOPED_TRACE(ng.name + (divisor == 1 ? " sum" : " mean"));
      const ReduceGeometry& g = ng.g;
      const auto x = stored_as<T>(with_specials(random_values(input_size(g), -2, 2, 11), 293, 5));
      DeviceVector<T> want(static_cast<std::size_t>(g.outputs)),
          got = stored_as<T>(DeviceVector<float>(want.size(), kNaN));
      kernels::sum_dims_cpu(g, x.data(), divisor, want.data());
      kernels::sum_dims_cuda(g, x.data(), divisor, got.data(), nullptr);
      expect_within(got, as_double(want), unit_rounding<T>(), 0, "against the CPU");
      // The exact sum, from the definition (input element (o, r) at kept + reduced offsets).
      std::vector<double> exact(want.size(), 0.0);
      for (int64_t o = 0; o < g.outputs; ++o) {
        for (int64_t r = 0; r < g.terms; ++r)
          exact[o] += kernels::to_f32(x[kernels::kept_offset(g, o) + kernels::reduced_offset(g, r)]);
        exact[o] /= static_cast<double>(divisor);
      }
      expect_within(got, exact, unit_rounding<T>(), 0, "against the exact sum");
    }
}

TYPED_TEST(ReduceDimsEmulated, SumDimsBackwardMatchesTheCpu) {
  using T = TypeParam;
  for (const NamedGeometry& ng : geometries())
    for (float beta : {0.0f, 1.0f}) {
      SCOPED_TRACE(ng.name + " beta " + std::to_string(beta));
      const ReduceGeometry& g = ng.g;
      const auto dy = stored_as<T>(random_values(g.outputs, -2, 2, 12));
      const auto old = stored_as<T>(random_values(input_size(g), -2, 2, 13));
      DeviceVector<T> want = old, got = old;
      kernels::sum_dims_backward_cpu(g, dy.data(), 0.25f, beta, want.data());
      kernels::sum_dims_backward_cuda(g, dy.data(), 0.25f, beta, got.data(), nullptr);
      expect_same_bits(got, want, "dx");
    }
}

TYPED_TEST(ReduceDimsEmulated, ExtremeDimsMatchTheCpu) {
  using T = TypeParam;
  for (const NamedGeometry& ng : geometries())
    for (bool largest : {true, false}) {
      const ReduceGeometry& g = ng.g;
      if (g.terms == 0) continue;  // the engine refuses it
      SCOPED_TRACE(ng.name + (largest ? " amax" : " amin"));
      // Values in {0, ..., 3}: ties in every output; NaN and infinities in some.
      auto xf = random_values(input_size(g), 0, 4, 20);
      for (float& v : xf) v = std::floor(v);
      const auto x = stored_as<T>(with_specials(xf, 97, 3));
      DeviceVector<T> want(static_cast<std::size_t>(g.outputs)), got(want.size());
      kernels::extreme_dims_cpu(g, x.data(), largest, want.data());
      kernels::extreme_dims_cuda(g, x.data(), largest, got.data(), nullptr);
      expect_same_values(got, want, "values");
      const auto dy = stored_as<T>(random_values(g.outputs, -2, 2, 21));
      for (float beta : {0.0f, 1.0f}) {
        const auto old = stored_as<T>(random_values(input_size(g), -2, 2, 22));
        DeviceVector<T> dx_want = old, dx_got = old;
        kernels::extreme_dims_backward_cpu(g, x.data(), want.data(), dy.data(), beta, dx_want.data());
        kernels::extreme_dims_backward_cuda(g, x.data(), want.data(), dy.data(), beta, dx_got.data(), nullptr);
        expect_same_values(dx_got, dx_want, "dx, beta " + std::to_string(beta));
      }
    }
}

struct Along {
  int64_t outer, dim, inner;
};
// The last two: rows of the block-per-row kernel (1024 elements or more), contiguous (tied_rows's
// NaN and infinity rows among them) and strided.
const std::vector<Along> kAlong = {{1, 7, 1}, {6, 9, 1}, {3, 10, 5},   {1, 33, 257},
                                   {4, 1, 3}, {0, 5, 2}, {6, 1100, 1}, {1, 1500, 2}};

TYPED_TEST(ReduceDimsEmulated, SelectAlongDimMatchesTheCpu) {
  using T = TypeParam;
  for (const Along& a : kAlong)
    for (int64_t k : {int64_t{1}, std::min<int64_t>(3, a.dim), a.dim < 1024 ? a.dim : 8})
      for (bool largest : {true, false})
        for (bool nan_first : {true, false}) {
          SCOPED_TRACE(std::to_string(a.outer) + " x " + std::to_string(a.dim) + " x " + std::to_string(a.inner) +
                       " k " + std::to_string(k) + (largest ? " largest" : " smallest") +
                       (nan_first ? " nan first" : " nan last"));
          const auto x = tied_rows<T>(a.outer * a.inner, a.dim, 14);  // rows of ties, NaN, infinities
          const auto n = static_cast<std::size_t>(a.outer * k * a.inner);
          DeviceVector<T> want_values(n), got_values(n);
          DeviceVector<int64_t> want(n, -1), got(n, -1);
          kernels::select_along_dim_cpu(x.data(), a.outer, a.dim, a.inner, k, largest, nan_first, want_values.data(),
                                        want.data());
          kernels::select_along_dim_cuda(x.data(), a.outer, a.dim, a.inner, k, largest, nan_first, got_values.data(),
                                         got.data(), nullptr);
          expect_same_bits(got, want, "indices");
          expect_same_bits(got_values, want_values, "values");
          for (int64_t index : got) ASSERT_TRUE(index >= 0 && index < a.dim) << index;
          DeviceVector<int64_t> indices_only(n, -1);  // values not wanted
          kernels::select_along_dim_cuda(x.data(), a.outer, a.dim, a.inner, k, largest, nan_first,
                                         static_cast<T*>(nullptr), indices_only.data(), nullptr);
          expect_same_bits(indices_only, want, "indices without values");
        }
}

// argmax along the last dimension is argmax_rows (kernels::row_argmax: the first NaN, else the first
// maximum) on every row tied_rows makes.
TYPED_TEST(ReduceDimsEmulated, ArgmaxAlongTheLastDimIsRowArgmax) {
  using T = TypeParam;
  const int64_t rows = 37, cols = 10;
  const auto x = tied_rows<T>(rows, cols, 15);
  DeviceVector<int32_t> rule(static_cast<std::size_t>(rows));
  kernels::argmax_rows_cpu(x.data(), rows, cols, rule.data());
  DeviceVector<int64_t> got(static_cast<std::size_t>(rows), -1);
  kernels::select_along_dim_cuda(x.data(), rows, cols, 1, 1, true, true, static_cast<T*>(nullptr), got.data(), nullptr);
  for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(got[r], rule[r]) << "row " << r;
}

TYPED_TEST(ReduceDimsEmulated, ScatterAlongDimMatchesTheCpu) {
  using T = TypeParam;
  for (const Along& a : kAlong)
    for (int64_t k : {int64_t{1}, a.dim})
      for (float beta : {0.0f, 1.0f}) {
        SCOPED_TRACE(std::to_string(a.outer) + " x " + std::to_string(a.dim) + " x " + std::to_string(a.inner) + " k " +
                     std::to_string(k) + " beta " + std::to_string(beta));
        const auto x = stored_as<T>(random_values(a.outer * a.dim * a.inner, -1, 1, 16));
        const auto n = static_cast<std::size_t>(a.outer * k * a.inner);
        DeviceVector<int64_t> indices(n);
        kernels::select_along_dim_cpu(x.data(), a.outer, a.dim, a.inner, k, true, true, static_cast<T*>(nullptr),
                                      indices.data());
        const auto dy = stored_as<T>(random_values(static_cast<int64_t>(n), -2, 2, 17));
        const auto old = stored_as<T>(with_specials(random_values(a.outer * a.dim * a.inner, -2, 2, 18), 5));
        DeviceVector<T> want = old, got = old;
        kernels::scatter_along_dim_cpu(dy.data(), indices.data(), a.outer, a.dim, a.inner, k, beta, want.data());
        kernels::scatter_along_dim_cuda(dy.data(), indices.data(), a.outer, a.dim, a.inner, k, beta, got.data(),
                                        nullptr);
        expect_same_bits(got, want, "dx");
        if (beta == 0.0f)  // the old values (NaN among them) never leak
          for (const T& v : got) ASSERT_FALSE(std::isnan(kernels::to_f32(v)));
      }
}

TYPED_TEST(ReduceDimsEmulated, MultinomialMatchesTheCpu) {
  using T = TypeParam;
  for (auto [rows, n] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 10}, {300, 17}})
    for (bool replacement : {true, false}) {
      const int64_t samples = replacement ? 2 * n + 1 : n;
      SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(n) + (replacement ? " with" : " without") +
                   " replacement");
      auto w = random_values(rows * n, 0.1f, 3, 19);
      const auto weights = stored_as<T>(w);
      DeviceVector<int64_t> want(static_cast<std::size_t>(rows * samples), -1), got = want;
      kernels::multinomial_cpu(weights.data(), rows, n, samples, replacement, 99, want.data());
      kernels::multinomial_cuda(weights.data(), rows, n, samples, replacement, 99, got.data(), nullptr);
      expect_same_bits(got, want, "samples");
      for (int64_t r = 0; r < rows && !replacement; ++r) {  // a permutation of the row's categories
        std::vector<int64_t> row(got.begin() + r * samples, got.begin() + (r + 1) * samples);
        std::sort(row.begin(), row.end());
        for (int64_t c = 0; c < n; ++c) ASSERT_EQ(row[c], c) << "row " << r;
      }
    }
}

}  // namespace
}  // namespace cumulus::testing
