// Op cases (Note [Op cases] in op_case.h): the elementwise math of cumulus/ops/math.h (exp, log,
// sqrt, rsqrt, abs, pow with a scalar and with a tensor exponent, clamp, maximum, minimum) in f32,
// bf16 and f16, 0-d inputs, values near the ends of the f32 range, and the integer promotion of the
// arithmetic ops (an i32 operand with a floating one, two i32 operands). Edge values a finite
// difference cannot check (NaN, inf, ties, bounds, empty tensors, i64) are in tests/test_math.cpp.
// 16-bit tolerances are a few units of the type's rounding (bf16 2^-8, f16 2^-11 relative).
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cumulus/ops/math.h"
#include "cumulus/ops/pointwise.h"
#include "op_case.h"

namespace cumulus::testing {

namespace {

constexpr DType kDTypes[] = {DType::f32, DType::bf16, DType::f16};

void set_tolerances(OpCase& c, DType dtype, double scale = 1.0) {
  if (dtype == DType::bf16) c.tolerance = 1.6e-2 * scale, c.grad_tolerance = 2.4e-2 * scale;
  if (dtype == DType::f16) c.tolerance = 2e-3 * scale, c.grad_tolerance = 3e-3 * scale;
}

struct UnaryForm {
  const char* op;
  std::function<Tensor(const Tensor&)> forward;
  std::function<double(double)> ref;
  double lo, hi, min_abs;  // the inputs' range: inside the domain, off abs's kink at 0
};

const UnaryForm kUnaryForms[] = {
    {"exp", [](const Tensor& x) { return ops::exp(x); }, [](double x) { return std::exp(x); }, -4, 4, 0},
    {"log", [](const Tensor& x) { return ops::log(x); }, [](double x) { return std::log(x); }, 0.1, 4, 0},
    {"sqrt", [](const Tensor& x) { return ops::sqrt(x); }, [](double x) { return std::sqrt(x); }, 0.1, 4, 0},
    {"rsqrt", [](const Tensor& x) { return ops::rsqrt(x); }, [](double x) { return 1 / std::sqrt(x); }, 0.1, 4, 0},
    {"abs", [](const Tensor& x) { return ops::abs(x); }, [](double x) { return std::fabs(x); }, -2, 2, 0.05},
};

OpCase unary_case(const UnaryForm& form, const std::string& name, Shape shape, DType dtype, double lo, double hi) {
  OpCase c;
  c.op = form.op;
  c.name = name;
  c.inputs = {{shape, dtype, lo, hi, form.min_abs}};
  c.forward = [f = form.forward](const Inputs& t) { return f(t[0]); };
  c.reference = [f = form.ref](const Values& v) { return map(v[0], f); };
  set_tolerances(c, dtype);
  return c;
}

void unary_cases(std::vector<OpCase>& cases) {
  for (const UnaryForm& form : kUnaryForms) {
    for (DType dtype : kDTypes) {
      OpCase c =
          unary_case(form, std::string(form.op) + "_2x3x11_" + dtype_name(dtype), {2, 3, 11}, dtype, form.lo, form.hi);
      c.bench_shapes = {{4096, 1024}};
      cases.push_back(c);
    }
    cases.push_back(unary_case(form, std::string(form.op) + "_scalar_f32", Shape(), DType::f32, form.lo, form.hi));
  }
}

// Where f32's range ends: exp up to 86 (near its overflow threshold, 88.7, with dy y still finite),
// log and sqrt of 1e-30 (their gradients 1e30 and 5e14), rsqrt of 1e-20 (a gradient of 5e29, y^3
// still in range), log, sqrt and abs up to 3e38 (forward only: their gradients there are below the
// driver's floor). The tolerance is relative to the largest value, so each case spans a narrow
// range; results far below 1 (exp of -87) are checked element by element in tests/test_math.cpp.
void extreme_cases(std::vector<OpCase>& cases) {
  struct Extreme {
    int form;  // index into kUnaryForms
    const char* what;
    double lo, hi, fd_step;
    bool grad;  // false where the gradient is below the driver's floor of one worth checking
  };
  const Extreme extremes[] = {
      {0, "large", 80, 86, 1e-6, true},     {1, "tiny", 1e-30, 3e-30, 1e-33, true},
      {1, "huge", 1e36, 3e38, 1e30, false}, {2, "tiny", 1e-30, 3e-30, 1e-33, true},
      {2, "huge", 1e36, 3e38, 1e30, false}, {3, "tiny", 1e-20, 3e-20, 1e-23, true},
      {4, "huge", 1e37, 3e38, 1e30, false},
  };
  for (const Extreme& e : extremes) {
    const UnaryForm& form = kUnaryForms[e.form];
    OpCase c = unary_case(form, std::string(form.op) + "_" + e.what + "_3x5_f32", {3, 5}, DType::f32, e.lo, e.hi);
    c.fd_step = e.fd_step;
    c.inputs[0].grad = e.grad;
    c.differentiable = e.grad;  // without a leaf requiring grad the output requires none: forward only
    cases.push_back(c);
  }
}

void pow_cases(std::vector<OpCase>& cases) {
  struct Exponent {
    const char* name;
    float e;
    double lo, hi, min_abs;  // the base's range: positive for a fractional exponent, off 0 for a negative one
  };
  const Exponent exponents[] = {{"2", 2.0f, -2, 2, 0},      {"3", 3.0f, -2, 2, 0},      {"0p5", 0.5f, 0.1, 4, 0},
                                {"m1p5", -1.5f, 0.1, 4, 0}, {"m2", -2.0f, -2, 2, 0.25}, {"1p3", 1.3f, 0.1, 4, 0}};
  for (const Exponent& e : exponents)
    for (DType dtype : kDTypes) {
      if (dtype != DType::f32 && std::string(e.name) != "0p5" && std::string(e.name) != "m2") continue;
      OpCase c;
      c.op = "pow";
      c.name = std::string("pow_scalar_") + e.name + "_3x7_" + dtype_name(dtype);
      c.inputs = {{{3, 7}, dtype, e.lo, e.hi, e.min_abs}};
      c.forward = [x = e.e](const Inputs& t) { return ops::pow(t[0], x); };
      c.reference = [x = e.e](const Values& v) { return map(v[0], [x](double b) { return std::pow(b, double(x)); }); };
      set_tolerances(c, dtype, 2.0);
      if (dtype == DType::f32 && std::string(e.name) == "2") c.bench_shapes = {{4096, 1024}};
      cases.push_back(c);
    }
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{3, 5}, {3, 5}}, {{4, 7}, {7}}, {{3, 1}, {1, 4}}, {{2, 3}, {}}, {{}, {2, 3}}};
  for (std::size_t k = 0; k < shapes.size(); ++k)
    for (DType dtype : kDTypes) {
      if (dtype != DType::f32 && k != 1) continue;
      const auto [sa, sb] = shapes[k];
      OpCase c;
      c.op = "pow";
      c.name = "pow_" + shape_name(sa) + "_by_" + shape_name(sb) + "_" + dtype_name(dtype);
      c.inputs = {{sa, dtype, 0.2, 3}, {sb, dtype, -2, 2}};  // a positive base: its log is the exponent's gradient
      c.forward = [](const Inputs& t) { return ops::pow(t[0], t[1]); };
      c.reference = [sa = sa, sb = sb](const Values& v) {
        return broadcast(v[0], sa, v[1], sb, [](double a, double b) { return std::pow(a, b); });
      };
      set_tolerances(c, dtype, 2.0);
      if (k == 0) c.bench_shapes = {{4096, 1024}, {4096, 1024}};
      cases.push_back(c);
    }
}

void extremum_cases(std::vector<OpCase>& cases) {
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{3, 5}, {3, 5}}, {{4, 7}, {7}}, {{3, 1}, {1, 4}}, {{5}, {2, 3, 5}}, {{}, {2, 3}}};
  for (bool larger : {true, false})
    for (std::size_t k = 0; k < shapes.size(); ++k)
      for (DType dtype : kDTypes) {
        if (dtype != DType::f32 && k != 1) continue;
        const auto [sa, sb] = shapes[k];
        OpCase c;
        c.op = larger ? "maximum" : "minimum";
        c.name = c.op + "_" + shape_name(sa) + "_by_" + shape_name(sb) + "_" + dtype_name(dtype);
        c.inputs = {{sa, dtype, -2, 2}, {sb, dtype, -2, 2}};
        c.forward = [larger](const Inputs& t) { return larger ? ops::maximum(t[0], t[1]) : ops::minimum(t[0], t[1]); };
        c.reference = [sa = sa, sb = sb, larger](const Values& v) {
          return broadcast(v[0], sa, v[1], sb,
                           [larger](double a, double b) { return larger ? std::max(a, b) : std::min(a, b); });
        };
        set_tolerances(c, dtype);
        if (k == 0) c.bench_shapes = {{4096, 1024}, {4096, 1024}};
        cases.push_back(c);
      }
}

// Bounds no bf16 or f16 value equals (-0.4, 0.7), so no input sits on a bound, where the gradient is
// PyTorch's one-sided choice and a central difference gives half of it (tests/test_math.cpp).
void clamp_cases(std::vector<OpCase>& cases) {
  struct Bounds {
    const char* name;
    std::optional<float> lo, hi;
  };
  const Bounds bounds[] = {{"both", -0.4f, 0.7f}, {"min", -0.4f, std::nullopt}, {"max", std::nullopt, 0.7f}};
  for (const Bounds& b : bounds)
    for (DType dtype : kDTypes) {
      OpCase c;
      c.op = "clamp";
      c.name = std::string("clamp_") + b.name + "_5x9_" + dtype_name(dtype);
      c.inputs = {{{5, 9}, dtype, -2, 2}};
      c.forward = [lo = b.lo, hi = b.hi](const Inputs& t) { return ops::clamp(t[0], lo, hi); };
      c.reference = [lo = b.lo, hi = b.hi](const Values& v) {
        return map(v[0], [lo, hi](double x) {
          if (lo) x = std::max(x, double(*lo));
          if (hi) x = std::min(x, double(*hi));
          return x;
        });
      };
      set_tolerances(c, dtype);
      if (dtype == DType::f32 && std::string(b.name) == "both") c.bench_shapes = {{4096, 1024}};
      cases.push_back(c);
    }
  OpCase c;  // a 0-d input
  c.op = "clamp";
  c.name = "clamp_scalar_f32";
  c.inputs = {{Shape(), DType::f32, 0.2, 0.6}};
  c.forward = [](const Inputs& t) { return ops::clamp(t[0], 0.0f, 1.0f); };
  c.reference = [](const Values& v) { return v[0]; };
  cases.push_back(c);
}

// Note [Integer promotion] in engine/ops/arithmetic.cpp: an i32 operand with a floating one
// computes in the floating type (the gradient reaches the floating operand only); two i32 operands
// stay i32 for add, sub and mul (no gradient), and divide into f32.
void promotion_cases(std::vector<OpCase>& cases) {
  struct Form {
    const char* op;
    std::function<Tensor(const Tensor&, const Tensor&)> forward;
    std::function<double(double, double)> ref;
  };
  const Form forms[] = {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }, [](double a, double b) { return a + b; }},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }, [](double a, double b) { return a - b; }},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }, [](double a, double b) { return a * b; }},
      {"div", [](const Tensor& a, const Tensor& b) { return a / b; }, [](double a, double b) { return a / b; }},
  };
  for (const Form& f : forms) {
    const bool div = std::string(f.op) == "div";
    // i32 [3, 5] op a floating [5], each floating type; then the floating operand first.
    for (DType dtype : kDTypes) {
      OpCase c;
      c.op = f.op;
      c.name = std::string(f.op) + "_i32_3x5_by_" + dtype_name(dtype) + "_5";
      c.inputs = {{{3, 5}, DType::i32, -9, 10}, {{5}, dtype, -2, 2, div ? 0.5 : 0.0}};
      c.forward = [fw = f.forward](const Inputs& t) { return fw(t[0], t[1]); };
      c.reference = [ref = f.ref](const Values& v) { return broadcast(v[0], {3, 5}, v[1], {5}, ref); };
      set_tolerances(c, dtype, 2.0);
      cases.push_back(c);
    }
    OpCase r;
    r.op = f.op;
    r.name = std::string(f.op) + "_f32_4x3_by_i32_4x1";
    r.inputs = {{{4, 3}, DType::f32, -2, 2}, {{4, 1}, DType::i32, 1, 6}};  // a nonzero divisor
    r.forward = [fw = f.forward](const Inputs& t) { return fw(t[0], t[1]); };
    r.reference = [ref = f.ref](const Values& v) { return broadcast(v[0], {4, 3}, v[1], {4, 1}, ref); };
    cases.push_back(r);
    OpCase i;  // two integer tensors: an integer result (div: f32), nothing to differentiate
    i.op = f.op;
    i.name = std::string(f.op) + "_i32_3x4_by_i32_4";
    i.inputs = {{{3, 4}, DType::i32, -50, 50}, {{4}, DType::i32, 1, 9}};
    i.forward = [fw = f.forward](const Inputs& t) { return fw(t[0], t[1]); };
    i.reference = [ref = f.ref](const Values& v) { return broadcast(v[0], {3, 4}, v[1], {4}, ref); };
    i.differentiable = false;
    cases.push_back(i);
  }
  OpCase s;  // an i32 tensor with a float scalar: f32
  s.op = "mul";
  s.name = "mul_i32_3x4_by_scalar";
  s.inputs = {{{3, 4}, DType::i32, -50, 50}};
  s.forward = [](const Inputs& t) { return t[0] * 2.5f; };
  s.reference = [](const Values& v) { return map(v[0], [](double x) { return x * 2.5; }); };
  s.differentiable = false;
  cases.push_back(s);
}

}  // namespace

CUMULUS_OP_CASES(math) {
  unary_cases(cases);
  extreme_cases(cases);
  pow_cases(cases);
  extremum_cases(cases);
  clamp_cases(cases);
  promotion_cases(cases);
}

}  // namespace cumulus::testing
