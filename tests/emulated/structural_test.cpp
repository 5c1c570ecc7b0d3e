// The structural ops' CUDA kernels (kernels/cuda/structural.cu) on the CPU emulation:
//   layer norm: forward, dx and the parameter gradients against a double reference (the sums run
//               in block_sum's order, not the CPU's), beta 0 over NaN and beta 1 adding; rows wider
//               than a block (300) and narrower (1, 7), more rows than the parameter kernel's groups;
//               the parameter gradients over a grid of row chunks (600 rows, with partials) the
//               same, the same bits on a second run, without partials the same bits up to a chunk.
//   slabs:      copy_slab and narrow_backward give the CPU kernels' bits (copies, and one addition).
//   gathers:    index_gather the CPU's bits, NaN rows for indices out of range; index_scatter_add
//               the CPU's bits (the same summation order) with repeated indices, beta 0 over NaN
//               (rows no index names become 0) and beta 1, more positions than a block (260);
//               out-of-range indices contribute nothing. (Thousands of positions:
//               structural_scaling_test.cpp.)
//   strided copy: the CPU kernel's bits both ways (from a view, into one), beta 0 over NaN and 1.
//   fill_zero:  zeros over NaN.
// The batched GEMM (kernels/cuda/bmm.cu) is a cuBLAS call and cannot run here; the op cases'
// CPU/CUDA parity checks it on a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/strided_kernels.h"
#include "kernels/cpu/structural_kernels.h"
#include "kernels/cuda/strided_kernels.h"
#include "kernels/cuda/structural_kernels.h"
#include "tests/emulated/emulated.h"

namespace cumulus::testing {
namespace {

template <typename T>
class StructuralEmulated : public ::testing::Test {};
TYPED_TEST_SUITE(StructuralEmulated, StorageTypes, StorageTypeName);

struct LayerNormRef {
  std::vector<double> y, dx, dw, db;
};

LayerNormRef layer_norm_reference(const DeviceVector<float>& x, const DeviceVector<float>& dy,
                                  const DeviceVector<float>& w, const DeviceVector<float>& b, int64_t rows,
                                  int64_t cols, float eps) {
  LayerNormRef ref{std::vector<double>(x.size()), std::vector<double>(x.size()), std::vector<double>(cols, 0.0),
                   std::vector<double>(cols, 0.0)};
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0, sg = 0, sgx = 0;
    for (int64_t c = 0; c < cols; ++c) mean += x[r * cols + c];
    mean /= cols;
    for (int64_t c = 0; c < cols; ++c) var += (x[r * cols + c] - mean) * (x[r * cols + c] - mean);
    const double inv = 1.0 / std::sqrt(var / cols + eps);
    for (int64_t c = 0; c < cols; ++c) {
      const double xhat = (x[r * cols + c] - mean) * inv, g = dy[r * cols + c] * static_cast<double>(w[c]);
      ref.y[r * cols + c] = xhat * w[c] + b[c];
      ref.dw[c] += dy[r * cols + c] * xhat;
      ref.db[c] += dy[r * cols + c];
      sg += g;
      sgx += g * xhat;
    }
    for (int64_t c = 0; c < cols; ++c) {
      const double xhat = (x[r * cols + c] - mean) * inv, g = dy[r * cols + c] * static_cast<double>(w[c]);
      ref.dx[r * cols + c] = inv * (g - sg / cols - xhat * sgx / cols);
    }
  }
  return ref;
}

TYPED_TEST(StructuralEmulated, LayerNormMatchesADoubleReference) {
  using T = TypeParam;
  const double tol = 4 * unit_rounding<T>() + 1e-5;
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{3, 1}, {5, 7}, {11, 300}}) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols));
    const auto x = stored_as<T>(random_values(rows * cols, -2, 3, 1));
    const auto dy = stored_as<T>(random_values(rows * cols, -1, 1, 2));
    const auto w = random_values(cols, 0.5f, 1.5f, 3), b = random_values(cols, -1, 1, 4);
    const float eps = 1e-5f;
    const LayerNormRef ref = layer_norm_reference(widened(x), widened(dy), w, b, rows, cols, eps);
    DeviceVector<T> y(x.size());
    DeviceVector<float> mean(rows), rstd(rows);
    kernels::layer_norm_forward_cuda(x.data(), w.data(), b.data(), rows, cols, eps, y.data(), mean.data(), rstd.data(),
                                     nullptr);
    expect_within(y, ref.y, tol, tol, "y");
    DeviceVector<T> dx(x.size(), kernels::from_f32<T>(kNaN));
    kernels::layer_norm_backward_dx_cuda(x.data(), dy.data(), w.data(), mean.data(), rstd.data(), rows, cols, 0.0f,
                                         dx.data(), nullptr);
    expect_within(dx, ref.dx, tol, 1e-4, "dx, beta 0");
    DeviceVector<T> dx1(x.size(), kernels::from_f32<T>(1.0f));
    kernels::layer_norm_backward_dx_cuda(x.data(), dy.data(), w.data(), mean.data(), rstd.data(), rows, cols, 1.0f,
                                         dx1.data(), nullptr);
    std::vector<double> plus_one(ref.dx);
    for (double& v : plus_one) v += 1.0;
    expect_within(dx1, plus_one, tol, 1e-4, "dx, beta 1");
    DeviceVector<float> dw(cols, kNaN), db(cols, 2.0f);
    kernels::layer_norm_param_grads_cuda(x.data(), dy.data(), mean.data(), rstd.data(), rows, cols, 0.0f, dw.data(),
                                         1.0f, db.data(), nullptr);
    std::vector<double> db_want(ref.db);
    for (double& v : db_want) v += 2.0;
    expect_within(dw, ref.dw, 1e-5, 1e-4, "dweight, beta 0");
    expect_within(db, db_want, 1e-5, 1e-4, "dbias, beta 1");
  }
}

// The parameter gradients over row chunks (256 rows each): 600 rows in 3 chunks with partials, and
// 256 rows (one chunk: no partials, the same bits as the form without them).
TYPED_TEST(StructuralEmulated, LayerNormParamGradsOverRowChunks) {
  using T = TypeParam;
  EXPECT_EQ(kernels::layer_norm_param_grads_partials(256, 9), 0);
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{600, 37}, {256, 9}}) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols));
    const auto x = stored_as<T>(random_values(rows * cols, -2, 3, 11));
    const auto dy = stored_as<T>(random_values(rows * cols, -1, 1, 12));
    const auto w = random_values(cols, 0.5f, 1.5f, 13), b = random_values(cols, -1, 1, 14);
    const LayerNormRef ref = layer_norm_reference(widened(x), widened(dy), w, b, rows, cols, 1e-5f);
    DeviceVector<float> y(x.size()), mean(rows), rstd(rows);
    const auto xf = widened(x);  // the statistics from the CPU kernel: the forward is not under test here
    kernels::layer_norm_forward_cpu(xf.data(), w.data(), b.data(), rows, cols, 1e-5f, y.data(), mean.data(),
                                    rstd.data());
    const int64_t n = kernels::layer_norm_param_grads_partials(rows, cols);
    DeviceVector<double> partials(static_cast<std::size_t>(std::max<int64_t>(n, 1)), kNaN);
    double* pp = n > 0 ? partials.data() : nullptr;
    DeviceVector<float> dw(cols, kNaN), db(cols, 2.0f), dw_again(cols, kNaN), db_again(cols, kNaN);
    kernels::layer_norm_param_grads_cuda(x.data(), dy.data(), mean.data(), rstd.data(), rows, cols, 0.0f, dw.data(),
                                         1.0f, db.data(), pp, nullptr);
    std::vector<double> db_want(ref.db);
    for (double& v : db_want) v += 2.0;
    expect_within(dw, ref.dw, 1e-5, 1e-4, "dweight, beta 0");
    expect_within(db, db_want, 1e-5, 1e-4, "dbias, beta 1");
    cuda_emulation::reseed("layer norm param grads again");
    kernels::layer_norm_param_grads_cuda(x.data(), dy.data(), mean.data(), rstd.data(), rows, cols, 0.0f,
                                         dw_again.data(), 0.0f, db_again.data(), pp, nullptr);
    expect_same_bits(dw_again, dw, "dweight, a second run");
    DeviceVector<float> dw_one(cols, kNaN), db_one(cols, kNaN);
    kernels::layer_norm_param_grads_cuda(x.data(), dy.data(), mean.data(), rstd.data(), rows, cols, 0.0f, dw_one.data(),
                                         0.0f, db_one.data(), nullptr);
    if (n == 0) expect_same_bits(dw_one, dw, "dweight without partials, one chunk");
    if (n == 0) expect_same_bits(db_one, db_again, "dbias without partials, one chunk");
  }
}

// Rows where float statistics fail: width 4096 around 1000 (a float mean is off by 1e-4, enough to
// move the output by 5e-4), and values of 1e20, whose squared deviations pass the f32 maximum (rstd
// came out 0 and the output the bias). Both devices' kernels against the double reference.
// Over one column the output is the bias whatever x is: dx is exactly 0, under the emulation's
// contraction as under nvcc's (dy * w must round before g - mean(g), or its rounding error times
// rstd = 316 is left).
TEST(StructuralEmulatedLayerNorm, OneColumnHasAZeroInputGradient) {
  const auto x = on_device<float>({0.5f, -3.0f, 7.25f, 100.0f, -0.001f, 2.0f});
  const auto dy = on_device<float>({0.3712f, -1.234567f, 2.71828f, 0.1f, 4.4f, -0.77f});
  const auto w = on_device<float>({1.5f}), b = on_device<float>({0.25f});
  DeviceVector<float> y(6), mean(6), rstd(6), dx(6, kNaN);
  kernels::layer_norm_forward_cuda(x.data(), w.data(), b.data(), 6, 1, 1e-5f, y.data(), mean.data(), rstd.data(),
                                   nullptr);
  kernels::layer_norm_backward_dx_cuda(x.data(), dy.data(), w.data(), mean.data(), rstd.data(), 6, 1, 0.0f, dx.data(),
                                       nullptr);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(dx[i], 0.0f) << "row " << i;
}

TEST(StructuralEmulatedLayerNorm, LargeMeansAndHugeValuesKeepTheirPrecision) {
  struct Rows {
    int64_t cols;
    float lo, hi;
  };
  for (const Rows& rows : {Rows{4096, 999.0f, 1001.0f}, Rows{8, -1e20f, 1e20f}}) {
    SCOPED_TRACE("width " + std::to_string(rows.cols) + " in [" + std::to_string(rows.lo) + ", " +
                 std::to_string(rows.hi) + ")");
    const int64_t n = 2 * rows.cols;
    const auto x = random_values(n, rows.lo, rows.hi, 5), dy = random_values(n, -1, 1, 6);
    const auto w = random_values(rows.cols, 0.5f, 1.5f, 7), b = random_values(rows.cols, -1, 1, 8);
    const LayerNormRef ref = layer_norm_reference(x, dy, w, b, 2, rows.cols, 1e-5f);
    for (bool cuda : {false, true}) {
      SCOPED_TRACE(cuda ? "CUDA" : "CPU");
      DeviceVector<float> y(n), mean(2), rstd(2), dw(rows.cols, kNaN), db(rows.cols, kNaN);
      if (cuda) {
        kernels::layer_norm_forward_cuda(x.data(), w.data(), b.data(), 2, rows.cols, 1e-5f, y.data(), mean.data(),
                                         rstd.data(), nullptr);
        kernels::layer_norm_param_grads_cuda(x.data(), dy.data(), mean.data(), rstd.data(), 2, rows.cols, 0.0f,
                                             dw.data(), 0.0f, db.data(), nullptr);
      } else {
        kernels::layer_norm_forward_cpu(x.data(), w.data(), b.data(), 2, rows.cols, 1e-5f, y.data(), mean.data(),
                                        rstd.data());
        kernels::layer_norm_param_grads_cpu(x.data(), dy.data(), mean.data(), rstd.data(), 2, rows.cols, 0.0f,
                                            dw.data(), 0.0f, db.data());
      }
      expect_within(y, ref.y, 2e-6, 2e-6, "y");
      expect_within(dw, ref.dw, 1e-4, 1e-4, "dweight");  // the saved f32 mean's rounding: 3e-5 of xhat
    }
  }
}

TYPED_TEST(StructuralEmulated, SlabsMatchTheCpu) {
  using T = TypeParam;
  const int64_t outer = 3, dim = 7, inner = 5, start = 2, length = 4;
  const auto src = stored_as<T>(random_values(outer * length * inner, -2, 2, 5));
  for (float beta : {0.0f, 1.0f}) {
    SCOPED_TRACE("beta " + std::to_string(beta));
    const auto old = stored_as<T>(random_values(outer * dim * inner, -2, 2, 6));
    auto want = old, got = old;
    if (beta == 0.0f) std::fill(got.begin(), got.end(), kernels::from_f32<T>(kNaN));
    kernels::copy_slab_cpu(src.data(), length, 0, want.data(), dim, start, outer, length, inner, beta);
    kernels::copy_slab_cuda(src.data(), length, 0, got.data(), dim, start, outer, length, inner, beta, nullptr);
    if (beta == 0.0f)  // outside the slab the CUDA output keeps its NaN: compare the slab only
      for (std::size_t e = 0; e < got.size(); ++e)
        if (std::isnan(kernels::to_f32(got[e]))) got[e] = want[e];
    expect_same_bits(got, want, "copy_slab");
    auto nb_want = old, nb_got = old;
    if (beta == 0.0f) std::fill(nb_got.begin(), nb_got.end(), kernels::from_f32<T>(kNaN));
    kernels::narrow_backward_cpu(src.data(), outer, dim, start, length, inner, beta, nb_want.data());
    kernels::narrow_backward_cuda(src.data(), outer, dim, start, length, inner, beta, nb_got.data(), nullptr);
    expect_same_bits(nb_got, nb_want, "narrow_backward");
  }
}

TYPED_TEST(StructuralEmulated, StridedCopyMatchesTheCpu) {
  using T = TypeParam;
  // A transpose's copy: a dense source [3, 9, 2, 7, 5] read as [3, 7, 2, 9, 5] (dimensions 1 and 3
  // swapped), more elements than a block, into a dense destination; then the backward's direction
  // (dense source, strided destination).
  kernels::StridedLayout l;
  l.ndim = 5;
  const int64_t size[] = {3, 7, 2, 9, 5}, strided[] = {630, 5, 315, 35, 1}, dense[] = {630, 90, 45, 5, 1};
  for (int d = 0; d < 5; ++d) l.size[d] = size[d];
  const int64_t n = l.numel();
  const auto x = stored_as<T>(random_values(n, -2, 2, 7));
  for (bool into_view : {false, true})
    for (float beta : {0.0f, 1.0f}) {
      SCOPED_TRACE(std::string(into_view ? "into the view" : "from the view") + ", beta " + std::to_string(beta));
      for (int d = 0; d < 5; ++d) {
        l.src_stride[d] = into_view ? dense[d] : strided[d];
        l.dst_stride[d] = into_view ? strided[d] : dense[d];
      }
      const auto old = stored_as<T>(random_values(n, -2, 2, 8));
      auto want = old, got = old;
      if (beta == 0.0f) std::fill(got.begin(), got.end(), kernels::from_f32<T>(kNaN));
      kernels::strided_copy_cpu(x.data(), want.data(), l, beta);
      kernels::strided_copy_cuda(x.data(), got.data(), l, beta, nullptr);
      expect_same_bits(got, want, "strided_copy");
    }
}

TYPED_TEST(StructuralEmulated, GatherAndScatterAddMatchTheCpu) {
  using T = TypeParam;
  for (auto [outer, dim, inner, count] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{{1, 4, 3, 10}, {2, 9, 5, 260}, {3, 6, 300, 7}}) {
    SCOPED_TRACE(std::to_string(outer) + " x " + std::to_string(dim) + " x " + std::to_string(inner) + ", " +
                 std::to_string(count) + " indices");
    DeviceVector<int32_t> idx(static_cast<std::size_t>(count));
    const auto u = random_values(count, 0, 1, 7);
    for (int64_t j = 0; j < count; ++j) idx[j] = static_cast<int32_t>(u[j] * (dim - 1));  // row dim - 1 unnamed
    const auto x = stored_as<T>(random_values(outer * dim * inner, -2, 2, 8));
    DeviceVector<T> want(outer * count * inner), got(want.size());
    kernels::index_gather_cpu(x.data(), outer, dim, idx.data(), count, inner, want.data());
    kernels::index_gather_cuda(x.data(), outer, dim, idx.data(), count, inner, got.data(), nullptr);
    expect_same_bits(got, want, "index_gather");

    const auto dy = stored_as<T>(random_values(outer * count * inner, -2, 2, 9));
    for (float beta : {0.0f, 1.0f}) {
      const auto old = stored_as<T>(random_values(outer * dim * inner, -2, 2, 10));
      auto s_want = old, s_got = old;
      if (beta == 0.0f) std::fill(s_got.begin(), s_got.end(), kernels::from_f32<T>(kNaN));
      kernels::index_scatter_add_cpu(dy.data(), outer, count, idx.data(), dim, inner, beta, s_want.data());
      DeviceVector<uint64_t> scratch(static_cast<std::size_t>(kernels::index_scatter_add_scratch(count)));
      kernels::index_scatter_add_cuda(dy.data(), outer, count, idx.data(), dim, inner, beta, s_got.data(),
                                      scratch.data(), nullptr);
      expect_same_bits(s_got, s_want, "index_scatter_add, beta " + std::to_string(beta));
    }
  }
}

TEST(StructuralEmulatedIndices, OutOfRangeGivesNanRowsAndNoGradient) {
  const int64_t dim = 3, inner = 2, count = 4;
  const DeviceVector<int32_t> idx{1, -1, 3, 1};
  const DeviceVector<float> x{1, 2, 3, 4, 5, 6};
  DeviceVector<float> y(count * inner);
  kernels::index_gather_cuda(x.data(), 1, dim, idx.data(), count, inner, y.data(), nullptr);
  EXPECT_EQ(y[0], 3.0f);
  EXPECT_TRUE(std::isnan(y[2]) && std::isnan(y[3]) && std::isnan(y[4]) && std::isnan(y[5]));
  EXPECT_EQ(y[7], 4.0f);
  const DeviceVector<float> dy{1, 2, 10, 20, 100, 200, 1000, 2000};
  DeviceVector<float> dx(dim * inner, kNaN);
  DeviceVector<uint64_t> scratch(static_cast<std::size_t>(kernels::index_scatter_add_scratch(count)));
  kernels::index_scatter_add_cuda(dy.data(), 1, count, idx.data(), dim, inner, 0.0f, dx.data(), scratch.data(),
                                  nullptr);
  EXPECT_EQ(dx, (DeviceVector<float>{0, 0, 1001, 2002, 0, 0}));
}

TEST(StructuralEmulatedFill, ZerosOverNan) {
  DeviceVector<Half> v(1000, kernels::from_f32<Half>(kNaN));
  kernels::fill_zero_cuda(v.data(), static_cast<int64_t>(v.size()), nullptr);
  for (const Half& h : v) ASSERT_EQ(kernels::to_f32(h), 0.0f);
}

}  // namespace
}  // namespace cumulus::testing
