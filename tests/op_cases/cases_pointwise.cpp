// Op cases (Note [Op cases] in op_case.h): the pointwise ops of cumulus/ops/pointwise.h.
// Arithmetic in every broadcasting form (same shapes, the smaller operand's shape a suffix of the
// larger's, size-1 dimensions of both, the smaller operand first), the scalar forms, x * x; tanh,
// sigmoid, silu, both gelus; softmax and log_softmax over rows of several widths; dropout on and off.
// 16-bit cases store inputs, outputs and gradients in bf16 or f16 with f32 arithmetic: their
// tolerances are a few units of the type's rounding (bf16 2^-8, f16 2^-11 relative), stated per dtype.
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "cumulus/ops/pointwise.h"
#include "op_case.h"

namespace cumulus::testing {

namespace {

constexpr DType kDTypes[] = {DType::f32, DType::bf16, DType::f16};

// Forward and gradient tolerances: f32's defaults, else a few roundings of the 16-bit type.
void set_tolerances(OpCase& c, DType dtype, double scale = 1.0) {
  if (dtype == DType::bf16) c.tolerance = 1.6e-2 * scale, c.grad_tolerance = 2.4e-2 * scale;
  if (dtype == DType::f16) c.tolerance = 2e-3 * scale, c.grad_tolerance = 3e-3 * scale;
}

struct BinaryForm {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
  std::function<double(double, double)> ref;
};

const BinaryForm kBinaryForms[] = {
    {"add", [](const Tensor& a, const Tensor& b) { return ops::add(a, b); }, [](double a, double b) { return a + b; }},
    {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }, [](double a, double b) { return a - b; }},
    {"mul", [](const Tensor& a, const Tensor& b) { return ops::mul(a, b); }, [](double a, double b) { return a * b; }},
    {"div", [](const Tensor& a, const Tensor& b) { return a / b; }, [](double a, double b) { return a / b; }},
};

void binary_cases(std::vector<OpCase>& cases) {
  const std::vector<std::pair<Shape, Shape>> shapes = {{{3, 5}, {3, 5}}, {{4, 7}, {7}},    {{2, 3, 5}, {3, 5}},
                                                       {{3, 1}, {1, 4}}, {{5}, {2, 3, 5}}, {{2, 1, 3}, {4, 1}},
                                                       {{1}, {3, 2}}};
  for (const BinaryForm& form : kBinaryForms)
    for (std::size_t k = 0; k < shapes.size(); ++k)
      for (DType dtype : kDTypes) {
        if (dtype != DType::f32 && k != 1 && k != 3) continue;  // 16-bit: one trailing and one two-sided form
        const auto [sa, sb] = shapes[k];
        OpCase c;
        c.op = form.name;
        c.name = std::string(form.name) + "_" + shape_name(sa) + "_by_" + shape_name(sb) + "_" + dtype_name(dtype);
        const bool div = std::string(form.name) == "div";
        c.inputs = {{sa, dtype, -2, 2}, {sb, dtype, -2, 2, div ? 0.5 : 0.0}};  // |b| >= 0.5 for div
        c.forward = [op = form.op](const Inputs& t) { return op(t[0], t[1]); };
        c.reference = [sa = sa, sb = sb, ref = form.ref](const Values& v) {
          return broadcast(v[0], sa, v[1], sb, ref);
        };
        set_tolerances(c, dtype, div ? 2.0 : 1.0);
        if (k == 0) c.bench_shapes = {{4096, 1024}, {4096, 1024}};  // Note [Benchmark sizes]
        if (k == 1) c.bench_shapes = {{4096, 1024}, {1024}};
        cases.push_back(c);
      }
}

struct ScalarForm {
  const char* op;
  const char* name;
  std::function<Tensor(const Tensor&)> forward;
  std::function<double(double)> ref;
  double min_abs;
};

void scalar_cases(std::vector<OpCase>& cases) {
  const ScalarForm forms[] = {
      {"add", "add_scalar", [](const Tensor& x) { return x + 2.5f; }, [](double x) { return x + 2.5; }, 0},
      {"sub", "sub_scalar", [](const Tensor& x) { return ops::sub(x, 1.5f); }, [](double x) { return x - 1.5; }, 0},
      {"sub", "rsub_scalar", [](const Tensor& x) { return 2.0f - x; }, [](double x) { return 2.0 - x; }, 0},
      {"mul", "mul_scalar", [](const Tensor& x) { return 3.0f * x; }, [](double x) { return 3.0 * x; }, 0},
      {"mul", "neg", [](const Tensor& x) { return -x; }, [](double x) { return -x; }, 0},
      {"div", "div_scalar", [](const Tensor& x) { return x / 4.0f; }, [](double x) { return x / 4.0; }, 0},
      {"div", "rdiv_scalar", [](const Tensor& x) { return 1.5f / x; }, [](double x) { return 1.5 / x; }, 0.5},
  };
  for (const ScalarForm& form : forms)
    for (DType dtype : kDTypes) {
      OpCase c;
      c.op = form.op;
      c.name = std::string(form.name) + "_3x7_" + dtype_name(dtype);
      c.inputs = {{{3, 7}, dtype, -2, 2, form.min_abs}};
      c.forward = [f = form.forward](const Inputs& t) { return f(t[0]); };
      c.reference = [f = form.ref](const Values& v) { return map(v[0], f); };
      set_tolerances(c, dtype, 2.0);
      c.bench_shapes = {{4096, 1024}};
      cases.push_back(c);
    }
  for (DType dtype : kDTypes) {  // the same tensor as both operands: both gradients reach it
    OpCase c;
    c.op = "mul";
    c.name = std::string("mul_self_5x3_") + dtype_name(dtype);
    c.inputs = {{{5, 3}, dtype, -2, 2}};
    c.forward = [](const Inputs& t) { return t[0] * t[0]; };
    c.reference = [](const Values& v) { return map(v[0], [](double x) { return x * x; }); };
    set_tolerances(c, dtype);
    cases.push_back(c);
  }
}

double gelu_erf(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh(double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }

void activation_cases(std::vector<OpCase>& cases) {
  const ScalarForm forms[] = {
      {"tanh", "tanh", [](const Tensor& x) { return ops::tanh(x); }, [](double x) { return std::tanh(x); }, 0},
      {"sigmoid", "sigmoid", [](const Tensor& x) { return ops::sigmoid(x); },
       [](double x) { return 1.0 / (1.0 + std::exp(-x)); }, 0},
      {"silu", "silu", [](const Tensor& x) { return ops::silu(x); },
       [](double x) { return x / (1.0 + std::exp(-x)); }, 0},
      {"gelu", "gelu", [](const Tensor& x) { return ops::gelu(x); }, gelu_erf, 0},
      {"gelu", "gelu_tanh", [](const Tensor& x) { return ops::gelu(x, ops::GeluApproximation::tanh); }, gelu_tanh, 0},
  };
  for (const ScalarForm& form : forms)
    for (DType dtype : kDTypes) {
      OpCase c;
      c.op = form.op;
      c.name = std::string(form.name) + "_2x3x11_" + dtype_name(dtype);
      c.inputs = {{{2, 3, 11}, dtype, -4, 4}};
      c.forward = [f = form.forward](const Inputs& t) { return f(t[0]); };
      c.reference = [f = form.ref](const Values& v) { return map(v[0], f); };
      set_tolerances(c, dtype);
      c.bench_shapes = {{4096, 1024}};
      cases.push_back(c);
      if (dtype != DType::f32) continue;
      // The f32 case again, benchmarked at [512, 512] (a GPT's activation, issue 40's figure; in
      // the cache, where the transcendentals rather than memory set the time).
      c.name = std::string(form.name) + "_2x3x11_f32_bench512";
      c.bench_shapes = {{512, 512}};
      cases.push_back(c);
    }
}

// Row-wise softmax or log_softmax of v (rows of width `cols`) in double.
std::vector<double> softmax_reference(const std::vector<double>& v, int64_t cols, bool log) {
  std::vector<double> y(v.size());
  for (std::size_t r = 0; r < v.size() / static_cast<std::size_t>(cols); ++r) {
    const double* x = v.data() + r * cols;
    double m = x[0], s = 0;
    for (int64_t j = 1; j < cols; ++j) m = std::max(m, x[j]);
    for (int64_t j = 0; j < cols; ++j) s += std::exp(x[j] - m);
    for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = log ? x[j] - m - std::log(s) : std::exp(x[j] - m) / s;
  }
  return y;
}

void softmax_cases(std::vector<OpCase>& cases) {
  // Widths 3, 37 (a warp and some) and 70 (more than two warps' worth per lane). Width 1 is in
  // test_pointwise.cpp: its output is constant, so its gradient is exactly 0, which the driver's
  // finite-difference check refuses as empty (and with no input taking a gradient, the driver's
  // backward has nothing to run).
  const std::vector<Shape> shapes = {{3}, {2, 3, 37}, {5, 70}, {2, 2, 2, 3}};
  for (bool log : {false, true})
    for (const Shape& shape : shapes)
      for (DType dtype : kDTypes) {
        if (dtype != DType::f32 && shape[shape.ndim() - 1] < 37) continue;
        OpCase c;
        c.op = log ? "log_softmax" : "softmax";
        c.name = c.op + "_" + shape_name(shape) + "_" + dtype_name(dtype);
        const int64_t cols = shape[shape.ndim() - 1];
        c.inputs = {{shape, dtype, -4, 4}};
        c.forward = [log](const Inputs& t) { return log ? ops::log_softmax(t[0]) : ops::softmax(t[0]); };
        c.reference = [cols, log](const Values& v) { return softmax_reference(v[0], cols, log); };
        set_tolerances(c, dtype, 2.0);
        if (shape == Shape({5, 70})) c.bench_shapes = {{4096, 1024}};
        cases.push_back(c);
      }
}

// The sizes and values where an f32 formula or a float sum used to fail (issue 40): divisors whose
// square leaves the f32 range (1e20: b * b is inf, the gradient came back 0; 1e-23: b * b is 0,
// the gradient came back inf), a broadcast operand's gradient summed over a million elements, and
// softmax over a row of a million (a float sum drifted by 1e-3; beside a dominant element the rest
// of the row was rounded away).
void extreme_cases(std::vector<OpCase>& cases) {
  struct Divisor {
    const char* name;
    double lo, hi, fd_step;  // the divisor's range; the dividend is kDividend times it, squared
  };
  for (const Divisor& d : {Divisor{"huge", 1e20, 2e20, 1e13}, Divisor{"tiny", 1e-23, 2e-23, 1e-30}}) {
    // Dividends of 1e38 (huge) and 1e-20 (tiny): quotients, gradients and their scale within f32.
    const double dividend = d.lo > 1 ? 1e38 : 1e-20;
    OpCase c;
    c.op = "div";
    c.name = std::string("div_") + d.name + "_divisor_3x5_f32";
    c.inputs = {{{3, 5}, DType::f32, dividend, 3 * dividend}, {{3, 5}, DType::f32, d.lo, d.hi}};
    c.inputs[0].grad = d.lo < 1;  // 1 / 1e20 is below the driver's floor of a gradient worth checking
    c.forward = [](const Inputs& t) { return t[0] / t[1]; };
    c.reference = [](const Values& v) { return broadcast(v[0], {3, 5}, v[1], {3, 5}, std::divides<>()); };
    c.fd_step = d.fd_step;
    cases.push_back(c);
    OpCase r = c;
    r.name = std::string("rdiv_scalar_") + d.name + "_divisor_3x5_f32";
    r.inputs = {c.inputs[1]};
    const auto s = static_cast<float>(dividend);
    r.forward = [s](const Inputs& t) { return s / t[0]; };
    r.reference = [s](const Values& v) { return map(v[0], [s](double x) { return s / x; }); };
    cases.push_back(r);
  }
  {
    constexpr int64_t kWide = 1000000;
    OpCase c;  // b's gradient: sum over a million of dy * a
    c.op = "mul";
    c.name = "mul_1000000_by_1_f32";
    c.inputs = {{{kWide}, DType::f32, -1, 1}, {{1}, DType::f32, 0.5, 1.5}};
    c.forward = [](const Inputs& t) { return t[0] * t[1]; };
    c.reference = [](const Values& v) { return broadcast(v[0], {kWide}, v[1], {1}, std::multiplies<>()); };
    c.grad_tolerance = 1e-6;  // a float sum of the million terms was off by about 1e-5
    c.fd_samples = 4;
    cases.push_back(c);
    for (bool log : {false, true}) {
      OpCase s;
      s.op = log ? "log_softmax" : "softmax";
      s.name = s.op + "_1x1000000_f32";
      s.inputs = {{{1, kWide}, DType::f32, -4, 4}};
      // softmax: one dominant element (y about 0.986), so that the rest of the row is what a float
      // sum rounds away, and the gradient is large enough to check.
      if (!log) s.inputs[0].edit = [](std::vector<float>& x) { x[0] = 20.0f; };
      s.forward = [log](const Inputs& t) { return log ? ops::log_softmax(t[0]) : ops::softmax(t[0]); };
      s.reference = [log](const Values& v) { return softmax_reference(v[0], kWide, log); };
      s.fd_samples = 4;
      // A million-term reference sum rounds differently at x +- h: a step of 1e-6 would turn that
      // (1e-10 of the loss) into 5e-5 of the gradient; the curvature error at 1e-4 is far smaller.
      s.fd_step = 1e-4;
      cases.push_back(s);
    }
  }
}

void dropout_cases(std::vector<OpCase>& cases) {
  constexpr uint64_t kSeed = 1234, kOffset = 7;
  constexpr float kP = 0.3f;
  for (DType dtype : kDTypes) {
    OpCase c;
    c.op = "dropout";
    c.name = std::string("dropout_training_5x67_") + dtype_name(dtype);
    c.inputs = {{{5, 67}, dtype, -2, 2}};
    c.forward = [](const Inputs& t) { return ops::dropout(t[0], kP, true, kSeed, kOffset); };
    c.reference = [](const Values& v) {
      std::vector<double> y(v[0].size());
      const double scale = 1.0f / (1.0f - kP);  // the op's f32 scale
      for (std::size_t i = 0; i < y.size(); ++i)
        y[i] = ops::dropout_keeps(kSeed, kOffset, static_cast<int64_t>(i), kP) ? v[0][i] * scale : 0.0;
      return y;
    };
    set_tolerances(c, dtype);
    c.bench_shapes = {{4096, 1024}};
    cases.push_back(c);
  }
  for (auto [training, p] : {std::pair<bool, float>{false, 0.5f}, {true, 0.0f}}) {
    OpCase c;
    c.op = "dropout";
    c.name = training ? "dropout_p0_4x9_f32" : "dropout_eval_4x9_f32";
    c.inputs = {{{4, 9}, DType::f32, -2, 2}};
    c.forward = [training = training, p = p](const Inputs& t) { return ops::dropout(t[0], p, training, 1, 2); };
    c.reference = [](const Values& v) { return v[0]; };
    c.view = true;  // the identity returns its input: nothing allocated
    cases.push_back(c);
  }
}

}  // namespace

CUMULUS_OP_CASES(pointwise) {
  binary_cases(cases);
  scalar_cases(cases);
  activation_cases(cases);
  softmax_cases(cases);
  extreme_cases(cases);
  dropout_cases(cases);
}

}  // namespace cumulus::testing
