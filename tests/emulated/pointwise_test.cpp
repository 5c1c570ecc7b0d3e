// The pointwise CUDA kernels (kernels/cuda/pointwise.cu) on the CPU emulation against their CPU
// twins (kernels/cpu/pointwise.cpp): the elementwise ones and the broadcast gradients bit for bit
// (each element, and each gradient sum, in the same order by the same rule in
// kernels/pointwise_rules.h; the emulation's expf/tanhf/erff are the host's); softmax, which sums a
// row in a warp's order, within a few roundings of a double reference. f32, bf16 and f16 storage;
// beta 0 over a NaN destination (never read) and beta 1; sizes across block edges.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/pointwise_kernels.h"
#include "kernels/cuda/pointwise_kernels.h"
#include "tests/emulated/emulated.h"

namespace cumulus::testing {
namespace {

using kernels::BinaryOp;
using kernels::from_f32;
using kernels::UnaryOp;

constexpr int64_t kSizes[] = {0, 1, 257, 3 * 256 + 5};
constexpr BinaryOp kBinaryOps[] = {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div};

template <typename T>
DeviceVector<T> values(int64_t n, uint64_t seed, float lo = -2, float hi = 2) {
  return stored_as<T>(random_values(n, lo, hi, seed));
}

// NaN for beta 0 (must not be read), else values.
template <typename T>
DeviceVector<T> destination(int64_t n, float beta, uint64_t seed) {
  return beta == 0.0f ? DeviceVector<T>(static_cast<std::size_t>(n), from_f32<T>(kNaN)) : values<T>(n, seed);
}

std::string what(int64_t n, float beta) { return "n " + std::to_string(n) + ", beta " + std::to_string(beta); }

template <typename T>
class PointwiseEmulated : public ::testing::Test {};
TYPED_TEST_SUITE(PointwiseEmulated, StorageTypes, StorageTypeName);

struct ShapePair {
  DeviceVector<int64_t> a, b;
};
// Same shapes across block edges, a trailing operand, both operands broadcast, the smaller first,
// a size-1 operand, and an empty output (the broadcast operand's gradient is 0).
const ShapePair kShapes[] = {{{3, 257}, {3, 257}}, {{5, 67}, {67}}, {{7, 1, 3}, {1, 40, 1}},
                             {{9}, {4, 3, 9}},     {{1}, {2, 130}}, {{0, 3}, {3}}};

template <typename T>
void expect_binary_matches_the_cpu(const ShapePair& s, BinaryOp op) {
  const auto g =
      kernels::broadcast_geometry(s.a.data(), static_cast<int>(s.a.size()), s.b.data(), static_cast<int>(s.b.size()));
  const int64_t n = g.numel(0), na = g.numel(1), nb = g.numel(2);
  const auto a = values<T>(na, 1), b = values<T>(nb, 2, 0.5f, 2.0f), dy = values<T>(n, 3);
  auto y = destination<T>(n, 0.0f, 0), want = y;
  kernels::binary_forward_cpu(g, op, a.data(), b.data(), want.data());
  kernels::binary_forward_cuda(g, op, a.data(), b.data(), y.data(), nullptr);
  expect_same_bits(y, want, "y");
  for (int operand = 0; operand < 2; ++operand)
    for (float beta : {0.0f, 1.0f}) {
      SCOPED_TRACE("operand " + std::to_string(operand) + what(n, beta));
      auto dx = destination<T>(operand == 0 ? na : nb, beta, 4), want_dx = dx;
      kernels::binary_backward_cpu(g, op, operand, a.data(), b.data(), dy.data(), beta, want_dx.data());
      kernels::binary_backward_cuda(g, op, operand, a.data(), b.data(), dy.data(), beta, dx.data(), nullptr);
      expect_same_bits(dx, want_dx, "dx");
    }
}

TYPED_TEST(PointwiseEmulated, BinaryMatchesTheCpu) {
  for (const ShapePair& s : kShapes)
    for (BinaryOp op : kBinaryOps) {
      SCOPED_TRACE("op " + std::to_string(static_cast<int>(op)) + ", a of " + std::to_string(s.a.size()) + " dims");
      expect_binary_matches_the_cpu<TypeParam>(s, op);
    }
}

// The broadcast gradient of [5, 67] + [67] is the column sum of dy, which the sum order fixes: a
// double reference confirms the CPU's (and so the kernel's) sum is the right one.
TEST(PointwiseEmulated, BroadcastGradientIsTheSumOverTheBroadcastDimension) {
  const int64_t a_shape[] = {5, 67}, b_shape[] = {67};
  const auto g = kernels::broadcast_geometry(a_shape, 2, b_shape, 1);
  const auto dy = values<float>(5 * 67, 5);
  DeviceVector<float> db(67, kNaN);
  kernels::binary_backward_cuda<float>(g, BinaryOp::sub, 1, nullptr, nullptr, dy.data(), 0.0f, db.data(), nullptr);
  std::vector<double> want(67, 0.0);
  for (int64_t r = 0; r < 5; ++r)
    for (int64_t c = 0; c < 67; ++c) want[c] -= dy[r * 67 + c];
  expect_close(db, want, "db");
}

// A broadcast operand's gradient summed over a million elements: [1e6] * [1], b's gradient is
// sum dy * a, whose float sum drifted by about 1e-5 relative.
TEST(PointwiseEmulated, BroadcastGradientOverAMillionKeepsF32Precision) {
  constexpr int64_t kWide = 1000000;
  const int64_t a_shape[] = {kWide}, b_shape[] = {1};
  const auto g = kernels::broadcast_geometry(a_shape, 1, b_shape, 1);
  const auto a = values<float>(kWide, 20, 0.5f, 1.5f), dy = values<float>(kWide, 21, 0.5f, 1.5f);
  const DeviceVector<float> b = {1.0f};
  double want = 0.0;
  for (int64_t i = 0; i < kWide; ++i) want += static_cast<double>(dy[i]) * a[i];
  DeviceVector<float> db(1, kNaN), db_cpu(1, kNaN);
  kernels::binary_backward_cuda<float>(g, BinaryOp::mul, 1, a.data(), b.data(), dy.data(), 0.0f, db.data(), nullptr);
  kernels::binary_backward_cpu<float>(g, BinaryOp::mul, 1, a.data(), b.data(), dy.data(), 0.0f, db_cpu.data());
  expect_within(db, {want}, 1e-7, 0, "CUDA db");
  expect_within(db_cpu, {want}, 1e-7, 0, "CPU db");
}

// div's gradient for b, -dy (a / b) / b, where b * b leaves the f32 range: b of 1e20 (b * b is inf:
// the gradient came back 0, and inf / b NaN rather than inf) and 1e-23 (b * b is 0: inf).
TEST(PointwiseEmulated, DivGradientStaysInRangeWhereTheDivisorSquaredDoesNot) {
  const DeviceVector<float> a = {1e38f, kInf, -kInf, 1e-20f, 3.0f}, b = {1e20f, 1e20f, -1e20f, 1e-23f, 2.0f};
  const DeviceVector<float> dy = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  const std::vector<double> want = {-1e38 / 1e40, -kInf, kInf, -1e-20 / 1e-46, -0.75};
  const int64_t shape[] = {5};
  const auto g = kernels::broadcast_geometry(shape, 1, shape, 1);
  DeviceVector<float> db(5, kNaN), db_cpu(5, kNaN);
  kernels::binary_backward_cuda<float>(g, BinaryOp::div, 1, a.data(), b.data(), dy.data(), 0.0f, db.data(), nullptr);
  kernels::binary_backward_cpu<float>(g, BinaryOp::div, 1, a.data(), b.data(), dy.data(), 0.0f, db_cpu.data());
  expect_within(db, want, 1e-6, 0, "CUDA db");  // the infinities exactly
  expect_within(db_cpu, want, 1e-6, 0, "CPU db");
  DeviceVector<float> dx(1, kNaN);  // rdiv: s / x, the same rule with s for a
  kernels::scalar_backward_cuda<float>(BinaryOp::div, true, 1e38f, b.data(), dy.data(), 0.0f, dx.data(), 1, nullptr);
  expect_within(dx, {-1e38 / 1e40}, 1e-6, 0, "rdiv dx");
}

TYPED_TEST(PointwiseEmulated, ScalarMatchesTheCpu) {
  using T = TypeParam;
  for (int64_t n : kSizes)
    for (BinaryOp op : kBinaryOps)
      for (bool reversed : {false, true}) {
        SCOPED_TRACE("n " + std::to_string(n) + ", op " + std::to_string(static_cast<int>(op)) +
                     (reversed ? " reversed" : ""));
        const auto x = values<T>(n, 6, 0.5f, 2.0f), dy = values<T>(n, 7);
        auto y = destination<T>(n, 0.0f, 0), want = y;
        kernels::scalar_forward_cpu(op, reversed, 1.5f, x.data(), want.data(), n);
        kernels::scalar_forward_cuda(op, reversed, 1.5f, x.data(), y.data(), n, nullptr);
        expect_cpu_parity("pointwise.cu", y, want, 2 * unit_rounding<T>(), kContractionAbs, "y", Exact::bits);
        const float beta = reversed ? 1.0f : 0.0f;  // each beta for every op, in one of the two forms
        auto dx = destination<T>(n, beta, 8), want_dx = dx;
        kernels::scalar_backward_cpu(op, reversed, 1.5f, x.data(), dy.data(), beta, want_dx.data(), n);
        kernels::scalar_backward_cuda(op, reversed, 1.5f, x.data(), dy.data(), beta, dx.data(), n, nullptr);
        expect_cpu_parity("pointwise.cu", dx, want_dx, 2 * unit_rounding<T>(), kContractionAbs, "dx", Exact::bits);
      }
}

TYPED_TEST(PointwiseEmulated, UnaryMatchesTheCpu) {
  using T = TypeParam;
  for (int64_t n : kSizes)
    for (UnaryOp op : {UnaryOp::tanh, UnaryOp::sigmoid, UnaryOp::gelu, UnaryOp::gelu_tanh, UnaryOp::silu})
      for (float beta : {0.0f, 1.0f}) {
        SCOPED_TRACE(what(n, beta) + ", op " + std::to_string(static_cast<int>(op)));
        const auto x = stored_as<T>(with_specials(random_values(n, -5, 5, 9))), dy = values<T>(n, 10);
        auto y = destination<T>(n, 0.0f, 0), want = y;
        kernels::unary_forward_cpu(op, x.data(), want.data(), n);
        kernels::unary_forward_cuda(op, x.data(), y.data(), n, nullptr);
        expect_cpu_parity("pointwise.cu", y, want, 2 * unit_rounding<T>(), kContractionAbs, "y", Exact::values);
        auto dx = destination<T>(n, beta, 11), want_dx = dx;
        kernels::unary_backward_cpu(op, x.data(), dy.data(), beta, want_dx.data(), n);
        kernels::unary_backward_cuda(op, x.data(), dy.data(), beta, dx.data(), n, nullptr);
        expect_cpu_parity("pointwise.cu", dx, want_dx, 2 * unit_rounding<T>(), kContractionAbs, "dx", Exact::values);
      }
}

TYPED_TEST(PointwiseEmulated, DropoutMatchesTheCpu) {
  using T = TypeParam;
  for (int64_t n : kSizes)
    for (float beta : {0.0f, 1.0f}) {
      SCOPED_TRACE(what(n, beta));
      const float p = 0.25f, scale = 1.0f / (1.0f - p);
      const auto x = values<T>(n, 12), dy = values<T>(n, 13);
      const DeviceValue<int64_t> offset(5);
      auto y = destination<T>(n, 0.0f, 0), want = y;
      kernels::dropout_forward_cpu(99, offset.get(), p, scale, x.data(), want.data(), n);
      kernels::dropout_forward_cuda(99, offset.get(), p, scale, x.data(), y.data(), n, nullptr);
      expect_cpu_parity("pointwise.cu", y, want, 2 * unit_rounding<T>(), kContractionAbs, "y", Exact::bits);
      auto dx = destination<T>(n, beta, 14), want_dx = dx;
      kernels::dropout_backward_cpu(99, offset.get(), p, scale, dy.data(), beta, want_dx.data(), n);
      kernels::dropout_backward_cuda(99, offset.get(), p, scale, dy.data(), beta, dx.data(), n, nullptr);
      expect_cpu_parity("pointwise.cu", dx, want_dx, 2 * unit_rounding<T>(), kContractionAbs, "dx", Exact::bits);
    }
}

// Each take hands out the counter's value and advances it, on the device.
TEST(DropoutOffsetEmulated, TakeHandsOutTheCounterAndAdvancesIt) {
  DeviceValue<int64_t> counter(41), taken(-1);
  for (int64_t k = 0; k < 3; ++k) {
    kernels::dropout_take_offset_cuda(counter.get(), taken.get(), nullptr);
    EXPECT_EQ(*taken, 41 + k);
    EXPECT_EQ(*counter, 42 + k);
  }
}

// Note [Dropout offsets on the device]: a captured micro-batch (take an offset, then dropout) replays
// with the offset of each replay's time, so every replay draws a fresh mask, the one an eager call
// with that offset draws.
TEST(DropoutOffsetEmulated, CapturedDropoutDrawsAFreshMaskOnEveryReplay) {
  const int64_t n = 4096;
  const float p = 0.5f, scale = 2.0f;
  const auto x = on_device(std::vector<float>(static_cast<std::size_t>(n), 1.0f));
  DeviceVector<float> y(static_cast<std::size_t>(n));
  DeviceValue<int64_t> counter(7), taken(-1);
  cuda_emulation::begin_capture();
  kernels::dropout_take_offset_cuda(counter.get(), taken.get(), nullptr);
  kernels::dropout_forward_cuda(3, taken.get(), p, scale, x.data(), y.data(), n, nullptr);
  cuda_emulation::Recording micro_batch = cuda_emulation::end_capture();
  ASSERT_EQ(micro_batch.launches(), 2u);
  std::vector<std::vector<float>> masks;
  for (int64_t replay = 0; replay < 3; ++replay) {
    micro_batch.replay();
    EXPECT_EQ(*taken, 7 + replay);
    const DeviceValue<int64_t> eager_offset(7 + replay);
    DeviceVector<float> eager(static_cast<std::size_t>(n));
    kernels::dropout_forward_cuda(3, eager_offset.get(), p, scale, x.data(), eager.data(), n, nullptr);
    EXPECT_EQ(on_host(y), on_host(eager)) << "replay " << replay;
    masks.push_back(on_host(y));
  }
  EXPECT_NE(masks[0], masks[1]);
  EXPECT_NE(masks[1], masks[2]);
}

// Row-wise softmax (or log_softmax) of x and its gradient for upstream dy, in double.
void softmax_reference(bool log, const std::vector<double>& x, const std::vector<double>& dy, int64_t cols,
                       std::vector<double>& y, std::vector<double>& dx) {
  y.assign(x.size(), 0.0);
  dx.assign(x.size(), 0.0);
  for (std::size_t r = 0; cols > 0 && r < x.size() / static_cast<std::size_t>(cols); ++r) {
    const std::size_t o = r * cols;
    double m = -INFINITY, s = 0.0, t = 0.0;
    for (int64_t j = 0; j < cols; ++j) m = std::max(m, x[o + j]);
    for (int64_t j = 0; j < cols; ++j) s += std::exp(x[o + j] - m);
    for (int64_t j = 0; j < cols; ++j) {
      const double p = std::exp(x[o + j] - m) / s;
      y[o + j] = log ? std::log(p) : p;
      t += log ? dy[o + j] : dy[o + j] * p;
    }
    for (int64_t j = 0; j < cols; ++j) {
      const double p = std::exp(x[o + j] - m) / s;
      dx[o + j] = log ? dy[o + j] - p * t : p * (dy[o + j] - t);
    }
  }
}

// Rows of width 1, 31, 33 and 100; 3 rows (a partial block of warps) and 11 (a second block). The
// backward reads the kernel's own output; its reference uses the double output, so the tolerance
// allows the output's rounding.
TYPED_TEST(PointwiseEmulated, SoftmaxIsWithinRoundingOfDouble) {
  using T = TypeParam;
  const double rel = 8 * unit_rounding<T>(), abs = 8 * unit_rounding<T>();
  for (bool log : {false, true})
    for (int64_t rows : {3, 11})
      for (int64_t cols : {1, 31, 33, 100}) {
        SCOPED_TRACE(std::string(log ? "log_softmax " : "softmax ") + std::to_string(rows) + " x " +
                     std::to_string(cols));
        const int64_t n = rows * cols;
        const auto x = values<T>(n, 15, -6, 6), dy = values<T>(n, 16);
        auto y = destination<T>(n, 0.0f, 0), dx = destination<T>(n, 1.0f, 17);
        const std::vector<double> old_dx = as_double(dx);
        kernels::softmax_forward_cuda(log, x.data(), y.data(), rows, cols, nullptr);
        kernels::softmax_backward_cuda(log, y.data(), dy.data(), 1.0f, dx.data(), rows, cols, nullptr);
        std::vector<double> want_y, want_dx;
        softmax_reference(log, as_double(x), as_double(dy), cols, want_y, want_dx);
        for (std::size_t i = 0; i < want_dx.size(); ++i) want_dx[i] += old_dx[i];
        expect_within(y, want_y, rel, abs, "y");
        expect_within(dx, want_dx, rel, 4 * abs, "dx");
      }
}

// A row of a million, its first element dominant (y0 about 0.986): a float sum of the row rounded
// the rest away (y0 off by 1e-2), and a plain row drifted by 1e-3. Both devices' kernels.
TEST(PointwiseEmulatedWide, SoftmaxOverAMillionKeepsItsSums) {
  constexpr int64_t kWide = 1000000;
  auto x = values<float>(kWide, 22, -4, 4);
  const auto dy = values<float>(kWide, 23);
  std::vector<double> want_y, want_dx;
  for (bool log : {false, true}) {
    SCOPED_TRACE(log ? "log_softmax" : "softmax");
    if (!log) x[0] = 20.0f;
    else x[0] = 0.0f;
    softmax_reference(log, as_double(x), as_double(dy), kWide, want_y, want_dx);
    for (bool cuda : {false, true}) {
      SCOPED_TRACE(cuda ? "CUDA" : "CPU");
      DeviceVector<float> y(kWide), dx(kWide);
      if (cuda) {
        kernels::softmax_forward_cuda(log, x.data(), y.data(), 1, kWide, nullptr);
        kernels::softmax_backward_cuda(log, y.data(), dy.data(), 0.0f, dx.data(), 1, kWide, nullptr);
      } else {
        kernels::softmax_forward_cpu(log, x.data(), y.data(), 1, kWide);
        kernels::softmax_backward_cpu(log, y.data(), dy.data(), 0.0f, dx.data(), 1, kWide);
      }
      expect_within(y, want_y, 1e-6, 1e-9, "y");
      // log_softmax's dx = dy - exp(y) sum dy cancels: exp of the rounded y (1e-6 relative) times a
      // sum of some 1e3 moves it by 1e-8.
      expect_within(dx, want_dx, 1e-5, 2e-8, "dx");
    }
  }
}

// The CPU kernels themselves against the same reference, so both devices are pinned to it.
TYPED_TEST(PointwiseEmulated, SoftmaxCpuIsWithinRoundingOfDouble) {
  using T = TypeParam;
  const double tol = 8 * unit_rounding<T>();
  for (bool log : {false, true}) {
    const int64_t rows = 4, cols = 45;
    const auto x = values<T>(rows * cols, 18, -6, 6), dy = values<T>(rows * cols, 19);
    auto y = destination<T>(rows * cols, 0.0f, 0), dx = y;
    kernels::softmax_forward_cpu(log, x.data(), y.data(), rows, cols);
    kernels::softmax_backward_cpu(log, y.data(), dy.data(), 0.0f, dx.data(), rows, cols);
    std::vector<double> want_y, want_dx;
    softmax_reference(log, as_double(x), as_double(dy), cols, want_y, want_dx);
    expect_within(y, want_y, tol, tol, log ? "log_softmax y" : "softmax y");
    expect_within(dx, want_dx, tol, 4 * tol, log ? "log_softmax dx" : "softmax dx");
  }
}

}  // namespace
}  // namespace cumulus::testing
