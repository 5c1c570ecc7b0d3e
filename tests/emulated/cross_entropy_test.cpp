// Softmax cross-entropy's CUDA kernels (kernels/cuda/cross_entropy.cu) on the CPU emulation, for
// f32, bf16 and f16 logits:
//   forward: row losses and the loss against a double-precision reference, on the one-block path
//            (batch <= 256) and the multi-block one (then sum_all), a label out of range giving NaN;
//            the two paths' row losses and sums agree bit for bit; batch 0 gives 0.
//   backward: against the double reference, over NaN with beta 0 and adding with beta 1.
//   classification_tally: the totals against counting on the host with argmax_rows_cpu's rule.
// Classes 10, 33 and 100: fewer than a warp's lanes, one past, and more than three per lane.
// Tolerance: in the kernels' f32 sums a term passes through at most 4 + 5 additions (100 classes
// over 32 lanes, then the shuffles), in the loss's at most 10 (257 rows: block_sum_all), each within
// 2^-24 relative, and expf / logf are within an ulp or two: 1e-5 relative is several times their
// bound. A 16-bit gradient adds its one rounding (2^-8 or 2^-11 relative).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cuda/kernels.h"
#include "tests/emulated/emulated.h"

namespace cumulus::testing {
namespace {

using kernels::ClassificationTotals;

std::string shape_name(int64_t batch, int64_t classes) {
  return "batch " + std::to_string(batch) + ", " + std::to_string(classes) + " classes";
}

// log sum_j exp(x_j) of a row, in double around its maximum.
double log_sum_exp(const float* x, int64_t n) {
  double m = -INFINITY, s = 0;
  for (int64_t j = 0; j < n; ++j) m = std::max(m, static_cast<double>(x[j]));
  for (int64_t j = 0; j < n; ++j) s += std::exp(x[j] - m);
  return m + std::log(s);
}

// Logits in [-4, 4) stored as T; every fifth row is moved up by 1000, where one float m + log(s)
// would round log(s) away (the kernels keep the two apart), and row 1 has a -inf off its label
// (exp gives 0). With nan_row, row 2 has a NaN logit: its loss and gradient are NaN.
template <typename T>
DeviceVector<T> logits(int64_t batch, int64_t classes, uint64_t seed, bool nan_row = false) {
  auto x = random_values(batch * classes, -4, 4, seed);
  for (int64_t r = 4; r < batch; r += 5)
    for (int64_t c = 0; c < classes; ++c) x[r * classes + c] += 1000.0f;
  if (batch > 1) x[classes + (7 + 1) % classes] = -kInf;  // row 1's label is 7 % classes
  if (nan_row && batch > 2) x[2 * classes + classes / 2] = kNaN;
  return stored_as<T>(x);
}

// Labels cycling over the classes; with out_of_range, the middle row's is `classes` and row 0's -1.
DeviceVector<int32_t> labels(int64_t batch, int64_t classes, bool out_of_range) {
  DeviceVector<int32_t> y;
  for (int64_t r = 0; r < batch; ++r) y.push_back(static_cast<int32_t>((r * 7) % classes));
  if (out_of_range && batch > 0) y[batch / 2] = static_cast<int32_t>(classes);
  if (out_of_range && batch > 2) y[0] = -1;
  return y;
}

struct Forward {
  DeviceVector<float> row_loss;
  DeviceValue<float> loss;
};

template <typename T>
Forward run_forward(const DeviceVector<T>& x, const DeviceVector<int32_t>& y, int64_t batch, int64_t classes) {
  Forward f{DeviceVector<float>(static_cast<std::size_t>(batch), kNaN), DeviceValue<float>(kNaN)};
  kernels::cross_entropy_forward_cuda(x.data(), y.data(), batch, classes, 1.0f / static_cast<float>(batch),
                                      f.row_loss.data(), f.loss.get(), nullptr);
  return f;
}

template <typename T>
class CrossEntropyEmulated : public ::testing::Test {};
TYPED_TEST_SUITE(CrossEntropyEmulated, StorageTypes, StorageTypeName);

// The row losses and the loss (scale 1 / batch) against the double reference.
template <typename T>
void expect_forward_matches_the_reference(const Forward& f, const DeviceVector<T>& x, const DeviceVector<int32_t>& y,
                                          int64_t batch, int64_t classes) {
  const auto xf = widened(x);
  std::vector<double> rows(static_cast<std::size_t>(batch));
  double total = 0;
  for (int64_t r = 0; r < batch; ++r) {
    const float* xr = xf.data() + r * classes;
    rows[r] = y[r] >= 0 && y[r] < classes ? log_sum_exp(xr, classes) - xr[y[r]] : NAN;
    total += rows[r];
  }
  expect_close(f.row_loss, rows, "row losses");
  expect_close(DeviceVector<float>{*f.loss}, {total / static_cast<double>(batch)}, "loss");
}

// Small batches, on the one-block path: every class count, with and without NaN rows (labels out
// of range, a NaN logit).
TYPED_TEST(CrossEntropyEmulated, ForwardMatchesTheReference) {
  using T = TypeParam;
  for (int64_t batch : {1, 7})
    for (int64_t classes : {10, 33, 100})
      for (bool bad_rows : {false, true}) {
        if (bad_rows && batch == 1 && classes != 10) continue;  // a NaN loss: once is enough
        SCOPED_TRACE(shape_name(batch, classes) + (bad_rows ? ", labels out of range, a NaN logit" : ""));
        const auto x = logits<T>(batch, classes, 1, bad_rows);
        const auto y = labels(batch, classes, bad_rows);
        expect_forward_matches_the_reference(run_forward(x, y, batch, classes), x, y, batch, classes);
      }
}

// Batch 257 takes the multi-block path (33 blocks of 8 rows, the last with one) and then
// sum_all_cuda; 256 the one-block path at its limit (32 rows per warp). Both compute a row with
// the same warp code and sum as sum_all_cuda does, so the first 256 rows give the same bits on both
// and the one-block loss is sum_all_cuda's over its row losses. f32 only: each emulated row costs
// milliseconds of thread switches, and 16-bit logits change only the loads of that shared warp code,
// which the small batches above run.
TEST(CrossEntropyEmulated, LargeBatchesMatchTheReferenceAndAgreeAcrossPaths) {
  const int64_t classes = 33;
  const auto x = logits<float>(257, classes, 2);
  const auto y = labels(257, classes, false);
  const Forward many = run_forward(x, y, 257, classes);
  expect_forward_matches_the_reference(many, x, y, 257, classes);
  const DeviceVector<float> x256(x.begin(), x.begin() + 256 * classes);
  const DeviceVector<int32_t> y256(y.begin(), y.begin() + 256);
  const Forward one = run_forward(x256, y256, 256, classes);
  expect_forward_matches_the_reference(one, x256, y256, 256, classes);
  expect_same_bits(one.row_loss, DeviceVector<float>(many.row_loss.begin(), many.row_loss.begin() + 256), "row losses");
  DeviceVector<float> sum(1, kNaN);
  kernels::sum_all_cuda(one.row_loss.data(), 256, 1.0f / 256, sum.data(), nullptr);
  expect_same_bits(DeviceVector<float>{*one.loss}, sum, "loss");
}

TEST(CrossEntropyEmulated, EmptyBatchGivesZeroLoss) {
  DeviceValue<float> loss(kNaN);
  kernels::cross_entropy_forward_cuda<float>(nullptr, nullptr, 0, 10, 1.0f, nullptr, loss.get(), nullptr);
  EXPECT_EQ(*loss, 0.0f);
}

// The relative error of T's rounding (0 for f32).
template <typename T>
double rounding() {
  if (std::is_same<T, float>::value) return 0;
  return std::is_same<T, BFloat16>::value ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
}

// dlogits = g scale (softmax - onehot) (+ old), g = 1.5, scale = 1 / batch; a row whose label is
// out of range has no onehot, a row with a NaN logit is NaN. Batch 40 is five blocks of 8 rows.
TYPED_TEST(CrossEntropyEmulated, BackwardMatchesTheReference) {
  using T = TypeParam;
  DeviceValue<float> grad_loss(1.5f);
  for (auto [batch, classes] : std::vector<std::pair<int64_t, int64_t>>{{1, 100}, {7, 10}, {7, 33}, {7, 100}, {40, 33}})
    for (float beta : {0.0f, 1.0f}) {
      SCOPED_TRACE(shape_name(batch, classes) + ", beta " + std::to_string(beta));
      const auto x = logits<T>(batch, classes, 3, true);
      const auto y = labels(batch, classes, true);
      const auto old =
          stored_as<T>(beta == 0.0f ? DeviceVector<float>(x.size(), kNaN) : random_values(batch * classes, -1, 1, 4));
      auto dx = old;
      const float scale = 1.0f / static_cast<float>(batch);
      kernels::cross_entropy_backward_cuda(x.data(), y.data(), batch, classes, grad_loss.get(), scale, beta, dx.data(),
                                           nullptr);
      const auto xf = widened(x), oldf = widened(old);
      std::vector<double> want(dx.size());
      for (int64_t r = 0; r < batch; ++r) {
        const double lse = log_sum_exp(xf.data() + r * classes, classes);
        for (int64_t c = 0; c < classes; ++c) {
          const int64_t i = r * classes + c;
          want[i] = *grad_loss * scale * (std::exp(xf[i] - lse) - (c == y[r] ? 1.0 : 0.0));
          if (beta != 0.0f) want[i] += oldf[i];
        }
      }
      expect_close(dx, want, "dlogits", 1e-5 + rounding<T>());
    }
}

// Labels that the first maximum matches, that a later tied maximum matches (not counted: ties go
// to the first, as argmax_rows), and some other class; rows 0 to 5 hold tied_rows's NaN and
// infinite cases. Rows 300: the block's threads take two rows each.
TYPED_TEST(CrossEntropyEmulated, ClassificationTallyCountsAsArgmaxRows) {
  using T = TypeParam;
  for (int64_t rows : {0, 1, 300})
    for (int64_t cols : {10, 33}) {
      SCOPED_TRACE(shape_name(rows, cols));
      const auto x = tied_rows<T>(rows, cols, 6);
      const auto xf = widened(x);
      DeviceVector<int32_t> best(static_cast<std::size_t>(rows)), y(best.size());
      kernels::argmax_rows_cpu(x.data(), rows, cols, best.data());
      int64_t correct = 0, later_ties = 0;
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = xf.data() + r * cols;
        int32_t last_tie = best[r];
        for (int64_t j = best[r] + 1; j < cols; ++j)
          if (xr[j] == xr[best[r]]) last_tie = static_cast<int32_t>(j);
        y[r] = r % 3 == 0 ? best[r] : r % 3 == 1 ? last_tie : static_cast<int32_t>((best[r] + 1) % cols);
        correct += y[r] == best[r];
        later_ties += y[r] != best[r] && r % 3 == 1;
      }
      if (rows == 300) ASSERT_GT(later_ties, 0) << "no label on a later tied maximum";
      DeviceValue<float> batch_loss(0.75f);
      DeviceValue<ClassificationTotals> totals(ClassificationTotals{0.5, 3, 10, 2});
      kernels::classification_tally_cuda(x.data(), y.data(), rows, cols, batch_loss.get(), totals.get(), nullptr);
      EXPECT_EQ(totals->loss_sum, 0.5 + 0.75);
      EXPECT_EQ(totals->correct, 3 + correct);
      EXPECT_EQ(totals->samples, 10 + rows);
      EXPECT_EQ(totals->batches, 3);
    }
}

}  // namespace
}  // namespace cumulus::testing
