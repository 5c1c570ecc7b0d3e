// cross_entropy over rows with ignored positions (kernels/cuda/loss.cu) on the CPU emulation, for
// f32, bf16 and f16 logits, against a double-precision reference:
//   forward: per-row losses (0 where ignored, NaN for a label out of range), the Sum and the Mean
//            (divided by the rows kept) with the backward's scale, on the one-block path (<= 256
//            rows) and the two-launch one; every row ignored gives a NaN mean.
//   backward: per-row upstream gradients (Reduction::None) and one scaled gradient, ignored rows 0,
//            with beta 0 over NaN and adding with beta 1.
//   indices_to_i32: values in i32's range kept, others INT32_MIN.
// Tolerances: cross_entropy_test.cpp's (1e-5 relative for f32 sums of a few terms, the stored
// type's rounding for a 16-bit gradient).
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/loss_kernels.h"
#include "kernels/cuda/loss_kernels.h"
#include "tests/emulated/emulated.h"

namespace cumulus::testing {
namespace {

constexpr int64_t kIgnore = -100;

// Labels cycling over the classes, every third row ignored; with a bad row, row 1's is `classes`.
DeviceVector<int32_t> labels_with_ignored(int64_t rows, int64_t classes, bool bad_row = false) {
  DeviceVector<int32_t> y;
  for (int64_t r = 0; r < rows; ++r) y.push_back(r % 3 == 2 ? kIgnore : static_cast<int32_t>((r * 7) % classes));
  if (bad_row && rows > 1) y[1] = static_cast<int32_t>(classes);
  return y;
}

// Each row's loss in double (0 ignored, NaN out of range).
std::vector<double> reference_rows(const DeviceVector<float>& x, const DeviceVector<int32_t>& y, int64_t classes) {
  std::vector<double> out;
  for (std::size_t r = 0; r < y.size(); ++r) {
    if (y[r] == kIgnore) {
      out.push_back(0.0);
      continue;
    }
    if (y[r] < 0 || y[r] >= classes) {
      out.push_back(NAN);
      continue;
    }
    const float* xr = x.data() + r * classes;
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < classes; ++j) m = std::max(m, static_cast<double>(xr[j]));
    for (int64_t j = 0; j < classes; ++j) s += std::exp(xr[j] - m);
    out.push_back(m + std::log(s) - xr[y[r]]);
  }
  return out;
}

template <typename T>
class LossRowsEmulated : public ::testing::Test {};
TYPED_TEST_SUITE(LossRowsEmulated, StorageTypes, StorageTypeName);

TYPED_TEST(LossRowsEmulated, ForwardMatchesTheReference) {
  using T = TypeParam;
  const int64_t classes = 33;
  for (int64_t rows : {1, 7, 40})
    for (bool mean : {false, true})
      for (bool bad : {false, true}) {
        SCOPED_TRACE(std::to_string(rows) + " rows" + (mean ? ", mean" : ", sum") + (bad ? ", a bad label" : ""));
        const auto x = stored_as<T>(random_values(rows * classes, -4, 4, 3));
        const auto y = labels_with_ignored(rows, classes, bad);
        const auto want = reference_rows(widened(x), y, classes);
        DeviceVector<float> row_loss(static_cast<std::size_t>(2 * rows), kNaN);
        DeviceValue<float> loss(kNaN), scale(kNaN);
        kernels::cross_entropy_rows_forward_cuda(x.data(), y.data(), rows, classes, kIgnore, mean, row_loss.data(),
                                                 row_loss.data() + rows, loss.get(), scale.get(), nullptr);
        double total = 0, kept = 0;
        for (std::size_t r = 0; r < want.size(); ++r) {
          total += want[r];
          kept += y[r] != kIgnore;
        }
        expect_close(DeviceVector<float>(row_loss.begin(), row_loss.begin() + rows), want, "row losses");
        expect_close(DeviceVector<float>{*loss}, {mean ? total / kept : total}, "loss");
        expect_close(DeviceVector<float>{*scale}, {mean ? 1.0 / kept : 1.0}, "scale");
        // Reduction::None: the row losses only, no count.
        DeviceVector<float> per_row(static_cast<std::size_t>(rows), kNaN);
        kernels::cross_entropy_rows_forward_cuda(x.data(), y.data(), rows, classes, kIgnore, false, per_row.data(),
                                                 static_cast<float*>(nullptr), static_cast<float*>(nullptr),
                                                 static_cast<float*>(nullptr), nullptr);
        expect_close(per_row, want, "Reduction::None row losses");
      }
}

// 300 rows: the rows over a grid, then one block's sums; the same row losses as the one-block path's
// rows (the same warp code). f32 only: emulated rows cost milliseconds each.
TEST(LossRowsEmulated, TwoLaunchPathMatchesTheReference) {
  const int64_t classes = 10, rows = 300;
  const auto x = stored_as<float>(random_values(rows * classes, -4, 4, 5));
  const auto y = labels_with_ignored(rows, classes);
  const auto want = reference_rows(widened(x), y, classes);
  DeviceVector<float> scratch(static_cast<std::size_t>(2 * rows), kNaN);
  DeviceValue<float> loss(kNaN), scale(kNaN);
  kernels::cross_entropy_rows_forward_cuda(x.data(), y.data(), rows, classes, kIgnore, true, scratch.data(),
                                           scratch.data() + rows, loss.get(), scale.get(), nullptr);
  double total = 0, kept = 0;
  for (std::size_t r = 0; r < want.size(); ++r) total += want[r], kept += y[r] != kIgnore;
  expect_close(DeviceVector<float>(scratch.begin(), scratch.begin() + rows), want, "row losses");
  expect_close(DeviceVector<float>{*loss}, {total / kept}, "mean loss");
}

// Every row ignored: the sum 0, the mean NaN (0 / 0, as PyTorch), each row's loss 0.
TEST(LossRowsEmulated, EveryRowIgnored) {
  const int64_t classes = 4;
  for (int64_t rows : {3, 300}) {
    SCOPED_TRACE(std::to_string(rows) + " rows");
    const auto x = stored_as<float>(random_values(rows * classes, -1, 1, 2));
    const DeviceVector<int32_t> y(static_cast<std::size_t>(rows), kIgnore);
    DeviceVector<float> scratch(static_cast<std::size_t>(2 * rows), kNaN);
    DeviceValue<float> loss(kNaN), scale(kNaN);
    kernels::cross_entropy_rows_forward_cuda(x.data(), y.data(), rows, classes, kIgnore, true, scratch.data(),
                                             scratch.data() + rows, loss.get(), scale.get(), nullptr);
    EXPECT_TRUE(std::isnan(*loss)) << *loss;
    for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(scratch[r], 0.0f) << "row " << r;
    kernels::cross_entropy_rows_forward_cuda(x.data(), y.data(), rows, classes, kIgnore, false, scratch.data(),
                                             scratch.data() + rows, loss.get(), scale.get(), nullptr);
    EXPECT_EQ(*loss, 0.0f);
  }
}

TYPED_TEST(LossRowsEmulated, BackwardMatchesTheReference) {
  using T = TypeParam;
  const double rel = std::is_same_v<T, float> ? 1e-5 : std::is_same_v<T, BFloat16> ? 8e-3 : 1e-3;
  const int64_t classes = 33, rows = 9;
  const auto x = stored_as<T>(random_values(rows * classes, -4, 4, 7));
  const auto xf = widened(x);
  const auto y = labels_with_ignored(rows, classes);
  const auto g = random_values(rows, -2, 2, 8);
  const DeviceValue<float> scale(0.25f);
  for (bool per_row : {true, false})
    for (float beta : {0.0f, 1.0f}) {
      SCOPED_TRACE(std::string(per_row ? "per-row gradients" : "one scaled gradient") + ", beta " +
                   std::to_string(beta));
      const auto old = random_values(rows * classes, -1, 1, 9);
      DeviceVector<T> dx = beta == 0.0f ? stored_as<T>(DeviceVector<float>(old.size(), kNaN)) : stored_as<T>(old);
      const auto dx_before = widened(dx);
      kernels::cross_entropy_rows_backward_cuda(x.data(), y.data(), rows, classes, kIgnore, g.data(), per_row ? 1 : 0,
                                                per_row ? nullptr : scale.get(), beta, dx.data(), nullptr);
      std::vector<double> want;
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = xf.data() + r * classes;
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < classes; ++j) m = std::max(m, static_cast<double>(xr[j]));
        for (int64_t j = 0; j < classes; ++j) s += std::exp(xr[j] - m);
        const double gr = per_row ? g[r] : 0.25 * g[0];
        for (int64_t j = 0; j < classes; ++j) {
          const double v = y[r] == kIgnore ? 0.0 : gr * (std::exp(xr[j] - m) / s - (j == y[r] ? 1.0 : 0.0));
          want.push_back(v + (beta == 0.0f ? 0.0 : dx_before[r * classes + j]));
        }
      }
      expect_within_each(widened(dx), want, rel, std::vector<double>(want.size(), 1e-6), "dlogits");
    }
}

TEST(LossRowsEmulated, IndicesToI32) {
  const std::vector<int64_t> in{0, 7, -100, INT_MAX, INT_MIN, int64_t{1} << 40, -(int64_t{1} << 40), -1};
  const auto d_in = on_device(in);
  DeviceVector<int32_t> out(in.size(), 12345);
  kernels::indices_to_i32_cuda(d_in.data(), static_cast<int64_t>(in.size()), out.data(), nullptr);
  const std::vector<int32_t> want{0, 7, -100, INT_MAX, INT_MIN, INT_MIN, INT_MIN, -1};
  EXPECT_EQ(on_host(out), want);
  std::vector<int32_t> cpu(in.size());
  kernels::indices_to_i32_cpu(in.data(), static_cast<int64_t>(in.size()), cpu.data());
  EXPECT_EQ(cpu, want);
}

}  // namespace
}  // namespace cumulus::testing
