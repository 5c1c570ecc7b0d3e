// The elementwise math ops' (cumulus/ops/math.h) edge cases and errors, and the arithmetic ops'
// integer promotion where an op case cannot say it (their values and gradients on ordinary inputs
// are op cases: tests/op_cases/cases_math.cpp): IEEE specials as PyTorch gives them, results far
// below 1 to f32's relative precision, the gradients at ties, bounds, zeros and NaN, empty tensors,
// i64 operands, wrap-around, and the refusals by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cumulus/cumulus.h"
#include "test_util.h"

namespace cumulus::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

template <typename E, typename Fn>
void expect_error(Fn fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no exception";
  } catch (const E& e) {
    for (const std::string& part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

std::vector<float> host(const Tensor& t) {
  NoGradGuard no_grad;
  return ops::cast(t.to(Device::cpu()), DType::f32).to_vector<float>();
}

// The same value element by element, NaN matching NaN, and the sign of a zero or an infinity checked.
void expect_same(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << what << " at " << i << ": " << got[i];
      continue;
    }
    EXPECT_EQ(got[i], want[i]) << what << " at " << i;
    EXPECT_EQ(std::signbit(got[i]), std::signbit(want[i])) << what << " sign at " << i;
  }
}

class MathTest : public DeviceTest {
 protected:
  Tensor of(const std::vector<float>& v, bool grad = false) const {
    Tensor t = Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, device());
    if (grad) t.set_requires_grad(true);
    return t;
  }
  // The gradient of sum(f(x)) at x.
  std::vector<float> grad_of(const std::vector<float>& x, const std::function<Tensor(const Tensor&)>& f) const {
    const Tensor t = of(x, true);
    ops::sum(f(t)).backward();
    return host(t.grad());
  }
};
CUMULUS_INSTANTIATE_DEVICES(MathTest);

TEST_P(MathTest, UnarySpecialsAreIeeesAsInPyTorch) {
  const std::vector<float> x = {kInf, -kInf, kNaN, 0.0f, -0.0f, -1.0f};
  const std::vector<float> e = host(ops::exp(of(x)));
  expect_same({e.begin(), e.begin() + 5}, {kInf, 0.0f, kNaN, 1.0f, 1.0f}, "exp");
  // exp(-1) is no special: the device's expf is within 2 ulp of glibc's (1 ulp off on an H200).
  EXPECT_NEAR(e[5], std::exp(-1.0f), 2 * std::numeric_limits<float>::epsilon() * std::exp(-1.0f)) << "exp(-1)";
  expect_same(host(ops::log(of(x))), {kInf, kNaN, kNaN, -kInf, -kInf, kNaN}, "log");
  expect_same(host(ops::sqrt(of(x))), {kInf, kNaN, kNaN, 0.0f, -0.0f, kNaN}, "sqrt");
  expect_same(host(ops::rsqrt(of(x))), {0.0f, kNaN, kNaN, kInf, -kInf, kNaN}, "rsqrt");
  expect_same(host(ops::abs(of(x))), {kInf, kInf, kNaN, 0.0f, 0.0f, 1.0f}, "abs");
  expect_same(host(ops::exp(of({88.8f, -104.0f}))), {kInf, 0.0f}, "exp beyond f32");
}

// Values far below 1, which an op case's tolerance (relative to max(1, |y|)) cannot see: each to a
// few ulp of f32, element by element (exp of -87 is 1.6e-38, near the smallest normal float).
TEST_P(MathTest, TinyResultsKeepTheirRelativePrecision) {
  struct Form {
    const char* name;
    std::function<Tensor(const Tensor&)> op;
    double (*ref)(double);
    std::vector<float> x;
  };
  const Form forms[] = {
      {"exp",
       [](const Tensor& t) { return ops::exp(t); },
       [](double v) { return std::exp(v); },
       {-87.0f, -60.5f, -20.25f}},
      {"log",
       [](const Tensor& t) { return ops::log(t); },
       [](double v) { return std::log(v); },
       {1.0f + 1e-6f, 0.9999999f}},
      {"sqrt", [](const Tensor& t) { return ops::sqrt(t); }, [](double v) { return std::sqrt(v); }, {1e-38f, 3e-30f}},
      {"rsqrt",
       [](const Tensor& t) { return ops::rsqrt(t); },
       [](double v) { return 1 / std::sqrt(v); },
       {1e30f, 3e37f}},
  };
  for (const Form& f : forms) {
    const std::vector<float> y = host(f.op(of(f.x)));
    for (std::size_t i = 0; i < f.x.size(); ++i) {
      const double want = f.ref(f.x[i]);
      EXPECT_LE(std::fabs(y[i] - want), 4e-7 * std::fabs(want)) << f.name << "(" << f.x[i] << ") = " << y[i];
    }
  }
}

TEST_P(MathTest, GradientsAtZeroNaNAndTheDomainsEdge) {
  expect_same(grad_of({0.0f, -0.0f, kNaN, -3.0f}, [](const Tensor& t) { return ops::abs(t); }),
              {0.0f, 0.0f, 0.0f, -1.0f}, "abs: torch.sign's 0 at 0 and NaN");
  expect_same(grad_of({0.0f, 4.0f}, [](const Tensor& t) { return ops::sqrt(t); }), {kInf, 0.25f}, "sqrt");
  expect_same(grad_of({0.0f, -1.0f}, [](const Tensor& t) { return ops::log(t); }), {kInf, -1.0f}, "log");
  expect_same(grad_of({4.0f}, [](const Tensor& t) { return ops::rsqrt(t); }), {-0.0625f}, "rsqrt: -y^3 / 2");
}

TEST_P(MathTest, PowFollowsPowfAndPyTorchsGradients) {
  expect_same(host(ops::pow(of({kNaN, -8.0f, 0.0f, 2.0f, -2.0f}), 0.0f)), {1, 1, 1, 1, 1}, "x^0 is 1, NaN too");
  expect_same(host(ops::pow(of({-8.0f, 0.0f, -2.0f, 4.0f}), -0.5f)), {kNaN, kInf, kNaN, 0.5f}, "x^-0.5");
  expect_same(host(ops::pow(of({-2.0f, 3.0f}), 3.0f)), {-8.0f, 27.0f}, "x^3");
  // 0.5 is sqrt, as in PyTorch (powf would give +0 and +inf).
  expect_same(host(ops::pow(of({-0.0f, -kInf, 4.0f}), 0.5f)), {-0.0f, kNaN, 2.0f}, "x^0.5");
  expect_same(host(ops::pow(of({-0.0f, 2.0f}), -1.0f)), {-kInf, 0.5f}, "x^-1");
  // e = 0: a zero gradient, even where e x^(e - 1) is inf (x = 0) or NaN.
  expect_same(grad_of({0.0f, 2.0f, kNaN}, [](const Tensor& t) { return ops::pow(t, 0.0f); }), {0, 0, 0}, "d x^0");
  expect_same(grad_of({0.0f, 2.0f}, [](const Tensor& t) { return ops::pow(t, 2.0f); }), {0.0f, 4.0f}, "d x^2");
  // A tensor exponent: the exponent's gradient x^e log x is 0 where x = 0 and e >= 0, NaN for x < 0.
  const Tensor x = of({0.0f, 0.0f, 2.0f, -2.0f}), e = of({0.0f, 2.0f, 3.0f, 2.0f}, true);
  ops::sum(ops::pow(x, e)).backward();
  expect_same(host(e.grad()), {0.0f, 0.0f, 8.0f * std::log(2.0f), kNaN}, "d/de x^e");
  const Tensor b = of({0.0f, 3.0f}, true), z = of({0.0f, 0.0f});
  ops::sum(ops::pow(b, z)).backward();
  expect_same(host(b.grad()), {0.0f, 0.0f}, "d/dx x^0 with a tensor exponent");
}

TEST_P(MathTest, MaximumAndMinimumPropagateNaNAndSplitTies) {
  const std::vector<float> av = {kNaN, 1.0f, 2.0f, 3.0f, -kInf}, bv = {1.0f, kNaN, 2.0f, -1.0f, 0.0f};
  expect_same(host(ops::maximum(of(av), of(bv))), {kNaN, kNaN, 2.0f, 3.0f, 0.0f}, "maximum");
  expect_same(host(ops::minimum(of(av), of(bv))), {kNaN, kNaN, 2.0f, -1.0f, -kInf}, "minimum");
  for (bool larger : {true, false}) {
    const Tensor a = of(av, true), b = of(bv, true);
    ops::sum(larger ? ops::maximum(a, b) : ops::minimum(a, b)).backward();
    // NaN: all to both; a tie: half to each; else to the one chosen.
    expect_same(host(a.grad()), {1.0f, 1.0f, 0.5f, larger ? 1.0f : 0.0f, larger ? 0.0f : 1.0f}, "a's");
    expect_same(host(b.grad()), {1.0f, 1.0f, 0.5f, larger ? 0.0f : 1.0f, larger ? 1.0f : 0.0f}, "b's");
  }
}

TEST_P(MathTest, ClampAsTorchClamp) {
  const std::vector<float> x = {kNaN, -kInf, kInf, -1.0f, 1.0f, 0.25f, -2.0f};
  expect_same(host(ops::clamp(of(x), -1.0f, 1.0f)), {kNaN, -1.0f, 1.0f, -1.0f, 1.0f, 0.25f, -1.0f}, "both");
  expect_same(host(ops::clamp(of(x), 0.0f, std::nullopt)), {kNaN, 0.0f, kInf, 0.0f, 1.0f, 0.25f, 0.0f}, "min");
  expect_same(host(ops::clamp(of(x), std::nullopt, 0.0f)), {kNaN, -kInf, 0.0f, -1.0f, 0.0f, 0.0f, -2.0f}, "max");
  // min > max: every element is max.
  expect_same(host(ops::clamp(of({-5.0f, 0.5f, 5.0f}), 1.0f, -1.0f)), {-1.0f, -1.0f, -1.0f}, "min > max");
  // A NaN bound gives NaN.
  expect_same(host(ops::clamp(of({0.5f}), kNaN, 1.0f)), {kNaN}, "NaN min");
  // The gradient passes on the bounds themselves (PyTorch's clamp_backward), not outside or at NaN.
  expect_same(grad_of(x, [](const Tensor& t) { return ops::clamp(t, -1.0f, 1.0f); }), {0, 0, 0, 1, 1, 1, 0},
              "clamp's gradient");
  expect_same(grad_of({-5.0f, 0.5f}, [](const Tensor& t) { return ops::clamp(t, 1.0f, -1.0f); }), {0, 0},
              "min > max: no gradient");
}

TEST_P(MathTest, EmptyTensorsGiveEmptyResultsAndGradients) {
  Tensor a = Tensor::from_vector(std::vector<float>{}, {0, 3}, device());
  a.set_requires_grad(true);
  Tensor b = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3}, device());
  b.set_requires_grad(true);
  const std::vector<Tensor> ys = {
      ops::exp(a),       ops::log(a),    ops::sqrt(a),       ops::rsqrt(a),      ops::abs(a),
      ops::pow(a, 2.0f), ops::pow(a, b), ops::maximum(a, b), ops::minimum(b, a), ops::clamp(a, 0.0f, 1.0f)};
  Tensor total = ops::sum(ys[0]);
  for (const Tensor& y : ys) {
    EXPECT_EQ(y.shape(), Shape({0, 3}));
    total = total + ops::sum(y);
  }
  total.backward();
  EXPECT_EQ(a.grad().numel(), 0);
  EXPECT_EQ(host(b.grad()), std::vector<float>({0, 0, 0}));  // no output element read b
}

TEST_P(MathTest, TheOpsRefuseBadArgumentsByName) {
  const Tensor i = Tensor::zeros({3}, DType::i32, device()), f = Tensor::zeros({3}, DType::f32, device());
  const Tensor h = Tensor::zeros({3}, DType::bf16, device());
  expect_error<InvalidArgument>([&] { ops::clamp(f, std::nullopt, std::nullopt); }, {"clamp", "min", "max"});
  expect_error<InvalidArgument>([&] { ops::clamp(i, 0.0f, 1.0f); }, {"clamp", "input", "i32"});
  expect_error<InvalidArgument>([&] { ops::exp(i); }, {"exp", "input", "i32"});
  expect_error<InvalidArgument>([&] { ops::pow(i, 2.0f); }, {"pow", "i32"});
  expect_error<InvalidArgument>([&] { ops::pow(f, i); }, {"pow", "b", "i32"});
  expect_error<InvalidArgument>([&] { ops::maximum(f, h); }, {"maximum", "same dtype", "f32", "bf16"});
  expect_error<InvalidArgument>([&] { ops::minimum(f, Tensor::zeros({4}, DType::f32, device())); },
                                {"minimum", "[3]", "[4]", "do not broadcast"});
  expect_error<InvalidArgument>([&] { ops::log(Tensor()); }, {"log", "undefined"});
}

// ---- the arithmetic ops' integer promotion (Note [Integer promotion] in engine/ops/arithmetic.cpp) ----

TEST_P(MathTest, IntegerTensorsStayIntegersForAddSubAndMul) {
  const int64_t big = int64_t{1} << 40;  // beyond f32's 24 bits: an f32 detour would round it
  const Tensor a = Tensor::from_vector(std::vector<int64_t>{big + 1, -3, 7}, {3}, device());
  const Tensor b = Tensor::from_vector(std::vector<int32_t>{2, 5, -4}, {3}, device());
  const Tensor s = a + b, d = a - b, m = a * b;
  EXPECT_EQ(s.dtype(), DType::i64);
  EXPECT_EQ(s.to(Device::cpu()).to_vector<int64_t>(), std::vector<int64_t>({big + 3, 2, 3}));
  EXPECT_EQ(d.to(Device::cpu()).to_vector<int64_t>(), std::vector<int64_t>({big - 1, -8, 11}));
  EXPECT_EQ(m.to(Device::cpu()).to_vector<int64_t>(), std::vector<int64_t>({2 * big + 2, -15, -28}));
  EXPECT_FALSE(s.requires_grad());
  // i32 with i32 stays i32, broadcast, and wraps on overflow as two's complement.
  const Tensor c = Tensor::from_vector(std::vector<int32_t>{INT32_MAX, 1, -2, 3}, {2, 2}, device());
  const Tensor r = Tensor::from_vector(std::vector<int32_t>{1, 10}, {2}, device());
  const Tensor cr = c + r;
  EXPECT_EQ(cr.dtype(), DType::i32);
  EXPECT_EQ(cr.to(Device::cpu()).to_vector<int32_t>(), std::vector<int32_t>({INT32_MIN, 11, -1, 13}));
  const Tensor empty = Tensor::from_vector(std::vector<int32_t>{}, {0, 2}, device());
  EXPECT_EQ((empty * r).shape(), Shape({0, 2}));
}

TEST_P(MathTest, IntegerDivisionIsTrueDivisionInF32) {
  const Tensor a = Tensor::from_vector(std::vector<int32_t>{7, -7, 1, 0}, {4}, device());
  const Tensor b = Tensor::from_vector(std::vector<int64_t>{2, 2, 3, 0}, {4}, device());
  const Tensor q = a / b;
  EXPECT_EQ(q.dtype(), DType::f32);
  expect_same(host(q), {3.5f, -3.5f, 1.0f / 3.0f, kNaN}, "i32 / i64");  // 0 / 0 is NaN, not an error
  const Tensor h = ops::div(a, 2.0f);
  EXPECT_EQ(h.dtype(), DType::f32);
  expect_same(host(h), {3.5f, -3.5f, 0.5f, 0.0f}, "i32 / scalar");
}

TEST_P(MathTest, AnIntegerWithAFloatingTensorTakesTheFloatingType) {
  const Tensor i = Tensor::from_vector(std::vector<int64_t>{3, -1000, (int64_t{1} << 24) + 1}, {3}, device());
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor leaf = Tensor::from_vector(std::vector<float>{0.5f, 2.0f, 1.0f}, {3}, device());
    leaf.set_requires_grad(true);
    const Tensor f = ops::cast(leaf, dtype);
    const Tensor y = f * i;
    EXPECT_EQ(y.dtype(), dtype);
    EXPECT_EQ((i + f).dtype(), dtype);
    ops::sum(ops::cast(y, DType::f32)).backward();
    // The integer converted as the type rounds it: 2^24 + 1 is 2^24 in f32; f16 overflows to inf.
    const float big = dtype == DType::f16 ? kInf : 16777216.0f;
    expect_same(host(y), {1.5f, -2000.0f, big}, "y");
    expect_same(host(leaf.grad()), {3.0f, -1000.0f, big}, "the floating operand's gradient");
  }
  const Tensor x = Tensor::from_vector(std::vector<int32_t>{1, 2}, {2}, device());
  const Tensor scaled = x * 1.5f;  // an integer tensor with a float scalar: f32
  EXPECT_EQ(scaled.dtype(), DType::f32);
  expect_same(host(scaled), {1.5f, 3.0f}, "i32 * 1.5");
  expect_same(host(2.0f - x), {1.0f, 0.0f}, "2 - i32");
}

}  // namespace
}  // namespace cumulus::testing
