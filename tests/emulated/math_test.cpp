// The CUDA kernels behind cumulus/ops/math.h on the CPU emulation against their CPU twins: the new
// unary ops (exp, log, sqrt, rsqrt, abs) and binary ones (pow, maximum, minimum) of
// kernels/cuda/pointwise.cu, within a few roundings (the CPU's exp and log are SLEEF's where the CPU
// has AVX2); clamp's forward, integer arithmetic and integer conversions of kernels/cuda/math.cu
// exactly (comparisons, integer arithmetic, one rounding: nothing to differ), clamp's gradient
// within the blend's one rounding. Inputs hold IEEE specials, sizes
// cross block edges, gradients are written with beta 0 over NaN (never read) and beta 1.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/math_kernels.h"
#include "kernels/cpu/pointwise_kernels.h"
#include "kernels/cuda/math_kernels.h"
#include "kernels/cuda/pointwise_kernels.h"
#include "tests/emulated/emulated.h"

namespace cumulus::testing {
namespace {

using kernels::BinaryOp;
using kernels::from_f32;
using kernels::UnaryOp;

constexpr int64_t kSizes[] = {0, 1, 257, 3 * 256 + 5};

template <typename T>
DeviceVector<T> destination(int64_t n, float beta, uint64_t seed) {
  return beta == 0.0f ? DeviceVector<T>(static_cast<std::size_t>(n), from_f32<T>(kNaN))
                      : stored_as<T>(random_values(n, -2, 2, seed));
}

std::string what(int64_t n, float beta) { return "n " + std::to_string(n) + ", beta " + std::to_string(beta); }

template <typename T>
class MathEmulated : public ::testing::Test {};
TYPED_TEST_SUITE(MathEmulated, StorageTypes, StorageTypeName);

TYPED_TEST(MathEmulated, UnaryMatchesTheCpu) {
  using T = TypeParam;
  for (int64_t n : kSizes)
    for (UnaryOp op : {UnaryOp::exp, UnaryOp::log, UnaryOp::sqrt, UnaryOp::rsqrt, UnaryOp::abs})
      for (float beta : {0.0f, 1.0f}) {
        SCOPED_TRACE(what(n, beta) + ", op " + std::to_string(static_cast<int>(op)));
        // Both signs (log and sqrt of a negative are NaN on both), and the specials.
        const auto x = stored_as<T>(with_specials(random_values(n, -5, 5, 30)));
        const auto dy = stored_as<T>(random_values(n, -2, 2, 31));
        auto y = destination<T>(n, 0.0f, 0), want = y;
        kernels::unary_forward_cpu(op, x.data(), want.data(), n);
        kernels::unary_forward_cuda(op, x.data(), y.data(), n, nullptr);
        expect_cpu_parity("pointwise.cu", y, want, 2 * unit_rounding<T>(), kContractionAbs, "y", Exact::values);
        auto dx = destination<T>(n, beta, 32), want_dx = dx;
        kernels::unary_backward_cpu(op, x.data(), dy.data(), beta, want_dx.data(), n);
        kernels::unary_backward_cuda(op, x.data(), dy.data(), beta, dx.data(), n, nullptr);
        expect_cpu_parity("pointwise.cu", dx, want_dx, 2 * unit_rounding<T>(), kContractionAbs, "dx", Exact::values);
      }
}

struct ShapePair {
  DeviceVector<int64_t> a, b;
};
const ShapePair kShapes[] = {
    {{3, 257}, {3, 257}}, {{5, 67}, {67}}, {{7, 1, 3}, {1, 40, 1}}, {{1}, {2, 130}}, {{0, 3}, {3}}};

TYPED_TEST(MathEmulated, PowMaximumMinimumMatchTheCpu) {
  using T = TypeParam;
  for (const ShapePair& s : kShapes)
    for (BinaryOp op : {BinaryOp::pow, BinaryOp::maximum, BinaryOp::minimum}) {
      SCOPED_TRACE("op " + std::to_string(static_cast<int>(op)) + ", a of " + std::to_string(s.a.size()) + " dims");
      const auto g = kernels::broadcast_geometry(s.a.data(), static_cast<int>(s.a.size()), s.b.data(),
                                                 static_cast<int>(s.b.size()));
      const int64_t n = g.numel(0), na = g.numel(1), nb = g.numel(2);
      // a: positive bases and the specials; b: exponents in [-2, 2], with a's own values at every
      // fifth element where the shapes agree (ties for maximum and minimum).
      const auto a_values = with_specials(random_values(na, 0.25f, 3, 33));
      auto b_values = random_values(nb, -2, 2, 34);
      if (na == nb)
        for (int64_t i = 0; i < nb; i += 5) b_values[i] = a_values[i];
      const auto a = stored_as<T>(a_values), b = stored_as<T>(with_specials(b_values, 11, 3));
      const auto dy = stored_as<T>(random_values(n, -2, 2, 35));
      auto y = destination<T>(n, 0.0f, 0), want = y;
      kernels::binary_forward_cpu(g, op, a.data(), b.data(), want.data());
      kernels::binary_forward_cuda(g, op, a.data(), b.data(), y.data(), nullptr);
      expect_cpu_parity("pointwise.cu", y, want, 2 * unit_rounding<T>(), kContractionAbs, "y", Exact::values);
      for (int operand = 0; operand < 2; ++operand)
        for (float beta : {0.0f, 1.0f}) {
          SCOPED_TRACE("operand " + std::to_string(operand) + ", beta " + std::to_string(beta));
          auto dx = destination<T>(operand == 0 ? na : nb, beta, 36), want_dx = dx;
          kernels::binary_backward_cpu(g, op, operand, a.data(), b.data(), dy.data(), beta, want_dx.data());
          kernels::binary_backward_cuda(g, op, operand, a.data(), b.data(), dy.data(), beta, dx.data(), nullptr);
          expect_cpu_parity("pointwise.cu", dx, want_dx, 2 * unit_rounding<T>(), kContractionAbs, "dx", Exact::values);
        }
    }
}

// The scalar form of pow (scalar_forward/backward with BinaryOp::pow), exponent 0 included (its
// gradient is 0 everywhere, NaN and infinite bases too).
TYPED_TEST(MathEmulated, PowWithAScalarExponentMatchesTheCpu) {
  using T = TypeParam;
  for (int64_t n : kSizes)
    for (float e : {2.0f, 0.5f, -1.5f, 0.0f}) {
      SCOPED_TRACE("n " + std::to_string(n) + ", e " + std::to_string(e));
      const auto x = stored_as<T>(with_specials(random_values(n, -3, 3, 37))),
                 dy = stored_as<T>(random_values(n, -2, 2, 38));
      auto y = destination<T>(n, 0.0f, 0), want = y;
      kernels::scalar_forward_cpu(BinaryOp::pow, false, e, x.data(), want.data(), n);
      kernels::scalar_forward_cuda(BinaryOp::pow, false, e, x.data(), y.data(), n, nullptr);
      expect_cpu_parity("pointwise.cu", y, want, 2 * unit_rounding<T>(), kContractionAbs, "y", Exact::values);
      auto dx = destination<T>(n, 0.0f, 0), want_dx = dx;
      kernels::scalar_backward_cpu(BinaryOp::pow, false, e, x.data(), dy.data(), 0.0f, want_dx.data(), n);
      kernels::scalar_backward_cuda(BinaryOp::pow, false, e, x.data(), dy.data(), 0.0f, dx.data(), n, nullptr);
      expect_cpu_parity("pointwise.cu", dx, want_dx, 2 * unit_rounding<T>(), kContractionAbs, "dx", Exact::values);
      if (e == 0.0f)
        for (std::size_t i = 0; i < dx.size(); ++i) ASSERT_EQ(kernels::to_f32(dx[i]), 0.0f) << "at " << i;
    }
}

TYPED_TEST(MathEmulated, ClampMatchesTheCpuExactly) {
  using T = TypeParam;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const std::pair<float, float> bounds[] = {{-0.5f, 0.75f}, {-kInf, 1.0f}, {0.0f, kInf}, {2.0f, -1.0f}, {kNaN, 1.0f}};
  for (int64_t n : kSizes)
    for (const auto& [lo, hi] : bounds)
      for (float beta : {0.0f, 1.0f}) {
        SCOPED_TRACE(what(n, beta) + ", bounds " + std::to_string(lo) + " " + std::to_string(hi));
        auto x_values = with_specials(random_values(n, -3, 3, 39));
        for (std::size_t i = 2; i < x_values.size(); i += 9) x_values[i] = i % 2 ? lo : hi;  // on a bound
        const auto x = stored_as<T>(x_values), dy = stored_as<T>(random_values(n, -2, 2, 40));
        auto y = destination<T>(n, 0.0f, 0), want = y;
        kernels::clamp_forward_cpu(lo, hi, x.data(), want.data(), n);
        kernels::clamp_forward_cuda(lo, hi, x.data(), y.data(), n, nullptr);
        expect_same_values(y, want, "y");
        auto dx = destination<T>(n, beta, 41), want_dx = dx;
        kernels::clamp_backward_cpu(lo, hi, x.data(), dy.data(), beta, want_dx.data(), n);
        kernels::clamp_backward_cuda(lo, hi, x.data(), dy.data(), beta, dx.data(), n, nullptr);
        expect_cpu_parity("math.cu", dx, want_dx, 2 * unit_rounding<T>(), kContractionAbs, "dx", Exact::values);
      }
}

// The CPU's clamp against the definition: min(max(x, lo), hi) with NaN propagated, and the
// gradient's inclusive mask.
TEST(MathEmulated, ClampIsTorchClamp) {
  const DeviceVector<float> x = {kNaN, -3.0f, -0.5f, 0.1f, 0.75f, 3.0f};
  const DeviceVector<float> dy = {1, 1, 1, 1, 1, 1};
  DeviceVector<float> y(6, kNaN), dx(6, kNaN);
  kernels::clamp_forward_cuda(-0.5f, 0.75f, x.data(), y.data(), 6, nullptr);
  kernels::clamp_backward_cuda(-0.5f, 0.75f, x.data(), dy.data(), 0.0f, dx.data(), 6, nullptr);
  expect_within(y, {NAN, -0.5, -0.5, 0.1f, 0.75, 0.75}, 0, 0, "y");
  expect_within(dx, {0, 0, 1, 1, 1, 0}, 0, 0, "dx");
}

template <typename I>
class IntegerEmulated : public ::testing::Test {};
using IntegerTypes = ::testing::Types<int32_t, int64_t>;
TYPED_TEST_SUITE(IntegerEmulated, IntegerTypes);

template <typename I>
DeviceVector<I> integers(int64_t n, uint64_t seed) {
  const auto u = random_values(n, -1000, 1000, seed);
  DeviceVector<I> v(u.size());
  for (std::size_t i = 0; i < u.size(); ++i) v[i] = static_cast<I>(u[i]);
  // The extremes, so that the sums and products wrap.
  if (v.size() > 3) v[0] = std::numeric_limits<I>::max(), v[1] = std::numeric_limits<I>::min(), v[3] = -1;
  return v;
}

TYPED_TEST(IntegerEmulated, BinaryMatchesTheCpuExactly) {
  using I = TypeParam;
  for (const ShapePair& s : kShapes)
    for (BinaryOp op : {BinaryOp::add, BinaryOp::sub, BinaryOp::mul}) {
      SCOPED_TRACE("op " + std::to_string(static_cast<int>(op)) + ", a of " + std::to_string(s.a.size()) + " dims");
      const auto g = kernels::broadcast_geometry(s.a.data(), static_cast<int>(s.a.size()), s.b.data(),
                                                 static_cast<int>(s.b.size()));
      const auto a = integers<I>(g.numel(1), 42), b = integers<I>(g.numel(2), 43);
      DeviceVector<I> y(static_cast<std::size_t>(g.numel(0)), I(7)), want = y;
      kernels::int_binary_forward_cpu(g, op, a.data(), b.data(), want.data());
      kernels::int_binary_forward_cuda(g, op, a.data(), b.data(), y.data(), nullptr);
      EXPECT_EQ(on_host(y), on_host(want));
    }
}

// Wrap-around as two's complement, and the broadcast's offsets, against plain arithmetic.
TYPED_TEST(IntegerEmulated, ArithmeticWrapsAndBroadcasts) {
  using I = TypeParam;
  const I max = std::numeric_limits<I>::max(), min = std::numeric_limits<I>::min();
  const DeviceVector<int64_t> sa = {2, 2}, sb = {2};
  const auto g = kernels::broadcast_geometry(sa.data(), 2, sb.data(), 1);
  const DeviceVector<I> a = {max, 3, min, -4}, b = {1, -2};
  DeviceVector<I> y(4), y_cpu(4);
  kernels::int_binary_forward_cuda(g, BinaryOp::add, a.data(), b.data(), y.data(), nullptr);
  kernels::int_binary_forward_cpu(g, BinaryOp::add, a.data(), b.data(), y_cpu.data());
  const std::vector<I> sum = {min, 1, static_cast<I>(min + 1), -6};
  EXPECT_EQ(on_host(y), sum);
  EXPECT_EQ(on_host(y_cpu), sum);
  kernels::int_binary_forward_cuda(g, BinaryOp::mul, a.data(), b.data(), y.data(), nullptr);
  EXPECT_EQ(on_host(y), std::vector<I>({max, -6, min, 8}));
  kernels::int_binary_forward_cuda(g, BinaryOp::sub, a.data(), b.data(), y.data(), nullptr);
  EXPECT_EQ(on_host(y), std::vector<I>({static_cast<I>(max - 1), 5, max, -2}));
}

template <typename I, typename To>
void expect_conversion_matches_the_cpu(const DeviceVector<I>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  DeviceVector<To> y(x.size()), want(x.size());
  kernels::int_convert_cpu(x.data(), want.data(), n);
  kernels::int_convert_cuda(x.data(), y.data(), n, nullptr);
  expect_same_bits(y, want, std::string("to ") + dtype_name(dtype_of<To>::value));
}

TYPED_TEST(IntegerEmulated, ConversionsMatchTheCpuExactly) {
  using I = TypeParam;
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n " + std::to_string(n));
    auto x = integers<I>(n, 44);
    if (x.size() > 5) x[4] = static_cast<I>((1 << 24) + 1), x[5] = 65520;  // f32's and f16's rounding edges
    expect_conversion_matches_the_cpu<I, int64_t>(x);
    expect_conversion_matches_the_cpu<I, float>(x);
    expect_conversion_matches_the_cpu<I, BFloat16>(x);
    expect_conversion_matches_the_cpu<I, Half>(x);
  }
}

// The conversions against the definition: the value rounded to nearest even in f32, then to the
// 16-bit type.
TEST(IntegerEmulated, ConversionsRoundAsFloatDoes) {
  const DeviceVector<int64_t> x = {(int64_t{1} << 24) + 1, (int64_t{1} << 24) + 3, -7, int64_t{1} << 62, 65520};
  DeviceVector<float> f(5);
  DeviceVector<Half> h(5);
  kernels::int_convert_cuda(x.data(), f.data(), 5, nullptr);
  kernels::int_convert_cuda(x.data(), h.data(), 5, nullptr);
  expect_within(f, {16777216.0, 16777220.0, -7.0, 4611686018427387904.0, 65520.0}, 0, 0, "f32");
  expect_within(h, {INFINITY, INFINITY, -7.0, INFINITY, INFINITY}, 0, 0, "f16");
}

}  // namespace
}  // namespace cumulus::testing
