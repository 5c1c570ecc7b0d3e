// Op cases (Note [Op cases] in op_case.h): the ops of cumulus/ops/compare.h. Comparisons in their
// broadcasting forms and with a scalar, over values with many ties, NaN, infinities and signed zeros,
// in every dtype they take; logical ops over mixed dtypes; where and masked_fill with broadcast
// operands (their gradients summed), scalars and -inf fills; tril / triu at several diagonals over
// batches; arange in each dtype; casts to and from bool; a causal mask built from them. Outputs
// that are bool are compared as 0 and 1 with the reference. Empty tensors and error messages are
// tests/test_compare.cpp's (the drivers need an allocation and a gradient to check).
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cumulus/ops/compare.h"
#include "cumulus/ops/shape.h"
#include "op_case.h"

namespace cumulus::testing {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr float kNaNf = std::numeric_limits<float>::quiet_NaN();
constexpr float kInff = std::numeric_limits<float>::infinity();

std::string dtype_tag(DType d) { return dtype_name(d); }

// The dimensions of a shape as a vector (for the references' index arithmetic).
std::vector<int64_t> dims_of(const Shape& s) {
  std::vector<int64_t> d;
  for (int k = 0; k < s.ndim(); ++k) d.push_back(s[k]);
  return d;
}

// Numpy's broadcast of the shapes (the cases give shapes that broadcast).
std::vector<int64_t> broadcast_dims(const std::vector<Shape>& shapes) {
  int nd = 0;
  for (const Shape& s : shapes) nd = std::max(nd, s.ndim());
  std::vector<int64_t> out(static_cast<std::size_t>(nd), 1);
  for (const Shape& s : shapes)
    for (int k = 0; k < s.ndim(); ++k) {
      const int64_t v = s[k];
      int64_t& o = out[static_cast<std::size_t>(nd - s.ndim() + k)];
      if (v != 1) o = v;
    }
  return out;
}

// The flat index into an operand of `shape` of output element i of `out` (numpy's broadcasting).
int64_t operand_index(const std::vector<int64_t>& out, const Shape& shape, int64_t i) {
  const int nd = static_cast<int>(out.size());
  int64_t index = 0, stride = 1;
  for (int d = nd - 1; d >= 0; --d) {
    const int64_t k = i % out[static_cast<std::size_t>(d)];
    i /= out[static_cast<std::size_t>(d)];
    const int sd = d - (nd - shape.ndim());
    if (sd < 0) continue;
    if (shape[sd] != 1) index += k * stride;
    stride *= shape[sd];
  }
  return index;
}

int64_t numel_of(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

// out[i] = f(operand values at i) for operands broadcast together.
std::vector<double> broadcast_reference(const Values& v, const std::vector<Shape>& shapes,
                                        const std::function<double(const std::vector<double>&)>& f) {
  const std::vector<int64_t> out = broadcast_dims(shapes);
  std::vector<double> y(static_cast<std::size_t>(numel_of(out)));
  std::vector<double> args(shapes.size());
  for (int64_t i = 0; i < numel_of(out); ++i) {
    for (std::size_t k = 0; k < shapes.size(); ++k) args[k] = v[k][operand_index(out, shapes[k], i)];
    y[i] = f(args);
  }
  return y;
}

// Values in {-2, -1, 0, 1} (so operands tie often), with NaN, +-inf and -0 placed among them.
void ties_and_specials(std::vector<float>& v) {
  const float specials[] = {kNaNf, kInff, -kInff, -0.0f, 0.0f};
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::floor(v[i]);
  for (std::size_t i = 1, k = 0; i < v.size(); i += 4, ++k) v[i] = specials[k % 5];
}

struct Comparison {
  const char* name;
  Tensor (*tensor)(const Tensor&, const Tensor&);
  Tensor (*scalar)(const Tensor&, double);
  bool (*ref)(double, double);
};

const Comparison kComparisons[] = {
    {"eq", ops::eq, ops::eq, [](double a, double b) { return a == b; }},
    {"ne", ops::ne, ops::ne, [](double a, double b) { return a != b; }},
    {"lt", ops::lt, ops::lt, [](double a, double b) { return a < b; }},
    {"le", ops::le, ops::le, [](double a, double b) { return a <= b; }},
    {"gt", ops::gt, ops::gt, [](double a, double b) { return a > b; }},
    {"ge", ops::ge, ops::ge, [](double a, double b) { return a >= b; }},
};

CaseInput compare_input(const Shape& shape, DType dtype) {
  CaseInput in{shape, dtype, -2, 2};
  if (is_floating(dtype)) in.edit = ties_and_specials;
  if (dtype == DType::boolean) in.lo = 0;
  return in;
}

void comparison_cases(std::vector<OpCase>& cases) {
  struct Form {
    Shape a, b;
    DType dtype;
  };
  const Form forms[] = {{{3, 5}, {3, 5}, DType::f32},     {{2, 3, 5}, {3, 1}, DType::f32},
                        {{4, 1}, {1, 6}, DType::bf16},    {{7}, {2, 7}, DType::f16},
                        {{4, 6}, {6}, DType::i64},        {{3, 4}, {3, 4}, DType::i32},
                        {{2, 5}, {1, 5}, DType::boolean}, {{}, {3, 2}, DType::f32}};
  for (const Comparison& cmp : kComparisons)
    for (const Form& f : forms) {
      OpCase c;
      c.op = cmp.name;
      c.name = std::string(cmp.name) + "_" + shape_name(f.a) + "_" + shape_name(f.b) + "_" + dtype_tag(f.dtype);
      c.inputs = {compare_input(f.a, f.dtype), compare_input(f.b, f.dtype)};
      c.differentiable = false;
      c.forward = [op = cmp.tensor](const Inputs& t) { return op(t[0], t[1]); };
      if (f.a == Shape{3, 5} && f.b == Shape{3, 5}) c.bench_shapes = {{2048, 2048}, {2048, 2048}};
      c.reference = [shapes = std::vector<Shape>{f.a, f.b}, ref = cmp.ref](const Values& v) {
        return broadcast_reference(v, shapes,
                                   [&](const std::vector<double>& x) { return ref(x[0], x[1]) ? 1.0 : 0.0; });
      };
      cases.push_back(c);
    }
}

// x op s: the scalar takes x's dtype (0.1 rounded to f32 for an f32 x, which holds 0.1f in places);
// an integer x against a fractional scalar compares exactly.
void scalar_comparison_cases(std::vector<OpCase>& cases) {
  struct Form {
    const char* tag;
    DType dtype;
    double s;
    double s_as_dtype;  // the scalar as x's dtype holds it
  };
  const Form forms[] = {{"zero", DType::f32, 0.0, 0.0},
                        {"tenth", DType::f32, 0.1, static_cast<double>(0.1f)},
                        {"one", DType::bf16, 1.0, 1.0},
                        {"neg_inf", DType::f16, -kInf, -kInf},
                        {"nan", DType::f32, std::nan(""), std::nan("")},
                        {"half", DType::i32, 0.5, 0.5},
                        {"neg_one", DType::i64, -1.0, -1.0},
                        {"one", DType::boolean, 1.0, 1.0}};
  for (const Comparison& cmp : kComparisons)
    for (const Form& f : forms) {
      OpCase c;
      c.op = cmp.name;
      c.name = std::string(cmp.name) + "_scalar_" + f.tag + "_" + dtype_tag(f.dtype);
      CaseInput in = compare_input({4, 5}, f.dtype);
      if (f.dtype == DType::f32)
        in.edit = [](std::vector<float>& v) {
          ties_and_specials(v);
          v[2] = v[7] = 0.1f;
        };
      c.inputs = {in};
      c.differentiable = false;
      c.forward = [op = cmp.scalar, s = f.s](const Inputs& t) { return op(t[0], s); };
      c.reference = [ref = cmp.ref, s = f.s_as_dtype](const Values& v) {
        return map(v[0], [&](double x) { return ref(x, s) ? 1.0 : 0.0; });
      };
      cases.push_back(c);
    }
}

double truthy(double x) { return x != 0 ? 1.0 : 0.0; }  // NaN != 0: true

void logical_cases(std::vector<OpCase>& cases) {
  struct Logical {
    const char* name;
    Tensor (*op)(const Tensor&, const Tensor&);
    double (*ref)(double, double);
  };
  const Logical logicals[] = {
      {"logical_and", ops::logical_and, [](double a, double b) { return truthy(a) * truthy(b); }},
      {"logical_or", ops::logical_or, [](double a, double b) { return std::max(truthy(a), truthy(b)); }},
      {"logical_xor", ops::logical_xor, [](double a, double b) { return truthy(a) != truthy(b) ? 1.0 : 0.0; }},
  };
  struct Form {
    Shape a, b;
    DType da, db;
  };
  const Form forms[] = {{{3, 4}, {3, 4}, DType::boolean, DType::boolean},
                        {{2, 3, 4}, {4}, DType::boolean, DType::boolean},
                        {{3, 4}, {3, 1}, DType::f32, DType::boolean},
                        {{5}, {2, 5}, DType::i32, DType::bf16},
                        {{3, 4}, {3, 4}, DType::f32, DType::f32}};
  for (const Logical& l : logicals)
    for (const Form& f : forms) {
      OpCase c;
      c.op = l.name;
      c.name = std::string(l.name) + "_" + shape_name(f.a) + "_" + dtype_tag(f.da) + "_" + shape_name(f.b) + "_" +
               dtype_tag(f.db);
      c.inputs = {compare_input(f.a, f.da), compare_input(f.b, f.db)};
      c.differentiable = false;
      c.forward = [op = l.op](const Inputs& t) { return op(t[0], t[1]); };
      c.reference = [shapes = std::vector<Shape>{f.a, f.b}, ref = l.ref](const Values& v) {
        return broadcast_reference(v, shapes, [&](const std::vector<double>& x) { return ref(x[0], x[1]); });
      };
      cases.push_back(c);
    }
  for (DType dtype : {DType::f32, DType::boolean, DType::i64, DType::f16}) {
    OpCase c;
    c.op = "logical_not";
    c.name = "logical_not_3x5_" + dtype_tag(dtype);
    c.inputs = {compare_input({3, 5}, dtype)};
    c.differentiable = false;
    c.forward = [](const Inputs& t) { return ops::logical_not(t[0]); };
    c.reference = [](const Values& v) { return map(v[0], [](double x) { return 1.0 - truthy(x); }); };
    cases.push_back(c);
  }
}

// A bool input drawn 0 or 1.
CaseInput mask_input(const Shape& shape) { return CaseInput{shape, DType::boolean, 0, 2}; }

void where_cases(std::vector<OpCase>& cases) {
  struct Form {
    Shape cond, a, b;
    DType dtype;
  };
  const Form forms[] = {{{3, 5}, {3, 5}, {3, 5}, DType::f32},       {{3, 1}, {1, 5}, {5}, DType::f32},
                        {{2, 1, 4}, {3, 1}, {2, 3, 4}, DType::f32}, {{4, 6}, {6}, {4, 1}, DType::bf16},
                        {{4, 6}, {4, 6}, {6}, DType::f16},          {{2, 3}, {}, {2, 3}, DType::f32}};
  for (const Form& f : forms) {
    OpCase c;
    c.op = "where";
    c.name = "where_" + shape_name(f.cond) + "_" + shape_name(f.a) + "_" + shape_name(f.b) + "_" + dtype_tag(f.dtype);
    c.inputs = {mask_input(f.cond), {f.a, f.dtype}, {f.b, f.dtype}};
    if (f.dtype == DType::bf16) c.tolerance = 1e-5, c.grad_tolerance = 1e-2;  // the summed gradient rounds to bf16
    if (f.dtype == DType::f16) c.grad_tolerance = 2e-3;
    c.forward = [](const Inputs& t) { return ops::where(t[0], t[1], t[2]); };
    if (f.a == Shape{3, 5} && f.b == Shape{3, 5}) c.bench_shapes = {{2048, 2048}, {2048, 2048}, {2048, 2048}};
    if (f.dtype == DType::bf16) c.bench_shapes = {{1024, 1024}, {1024}, {1024, 1}};  // b's gradient: row sums
    c.reference = [shapes = std::vector<Shape>{f.cond, f.a, f.b}](const Values& v) {
      return broadcast_reference(v, shapes, [](const std::vector<double>& x) { return x[0] != 0 ? x[1] : x[2]; });
    };
    cases.push_back(c);
  }
  // A scalar for a or b, rounded to the tensor's dtype (1.5 and -2.25 are exact in every one).
  for (bool scalar_b : {true, false}) {
    OpCase c;
    c.op = "where";
    c.name = std::string("where_scalar_") + (scalar_b ? "b" : "a") + "_3x4_f32";
    c.inputs = {mask_input({3, 1}), {{3, 4}}};
    c.forward = [scalar_b](const Inputs& t) {
      return scalar_b ? ops::where(t[0], t[1], -2.25) : ops::where(t[0], 1.5, t[1]);
    };
    c.reference = [scalar_b](const Values& v) {
      return broadcast_reference({v[0], v[1]}, {{3, 1}, {3, 4}}, [&](const std::vector<double>& x) {
        return scalar_b ? (x[0] != 0 ? x[1] : -2.25) : (x[0] != 0 ? 1.5 : x[1]);
      });
    };
    cases.push_back(c);
  }
  {  // The same tensor as a and b: its gradient gathers both shares (dy everywhere).
    OpCase c;
    c.op = "where";
    c.name = "where_same_tensor_twice_3x4_f32";
    c.inputs = {mask_input({3, 4}), {{3, 4}}};
    c.forward = [](const Inputs& t) { return ops::where(t[0], t[1], t[1]); };
    c.reference = [](const Values& v) { return v[1]; };
    cases.push_back(c);
  }
  // Non-floating operands: elements move as they are; NaN and infinities pass through.
  for (DType dtype : {DType::i64, DType::boolean, DType::u8}) {
    OpCase c;
    c.op = "where";
    c.name = "where_2x3_3_" + dtype_tag(dtype);
    c.inputs = {mask_input({2, 3}), {{2, 3}, dtype, 0, 2}, {{3}, dtype, 0, 2}};
    if (dtype == DType::i64) c.inputs[1].lo = c.inputs[2].lo = -50, c.inputs[1].hi = c.inputs[2].hi = 50;
    c.differentiable = false;
    c.forward = [](const Inputs& t) { return ops::where(t[0], t[1], t[2]); };
    c.reference = [](const Values& v) {
      return broadcast_reference(v, {{2, 3}, {2, 3}, {3}},
                                 [](const std::vector<double>& x) { return x[0] != 0 ? x[1] : x[2]; });
    };
    cases.push_back(c);
  }
  OpCase c;
  c.op = "where";
  c.name = "where_specials_4x5_f32";
  c.inputs = {mask_input({4, 5}), compare_input({4, 5}, DType::f32), compare_input({4, 5}, DType::f32)};
  c.inputs[1].grad = c.inputs[2].grad = false;  // infinite outputs: no finite differences
  c.differentiable = false;
  c.forward = [](const Inputs& t) { return ops::where(t[0], t[1], t[2]); };
  c.reference = [](const Values& v) {
    std::vector<double> y(v[0].size());
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = v[0][i] != 0 ? v[1][i] : v[2][i];
    return y;
  };
  cases.push_back(c);
}

void masked_fill_cases(std::vector<OpCase>& cases) {
  struct Form {
    Shape x, mask;
    DType dtype;
    double value;
    const char* tag;
  };
  const Form forms[] = {{{3, 5}, {3, 5}, DType::f32, 2.5, "2p5"},
                        {{2, 3, 4, 4}, {4, 4}, DType::f32, -3.0, "m3"},
                        {{4}, {3, 4}, DType::f32, 2.0, "2"},  // x broadcast to the mask: its gradient sums
                        {{2, 4, 4}, {2, 1, 4}, DType::bf16, 0.1, "0p1"},
                        {{3, 4}, {4}, DType::f16, 6e4, "6e4"},  // 60000 is exact in f16
                        {{2, 2, 3, 3}, {3, 3}, DType::f32, -kInf, "neg_inf"},
                        {{3, 4}, {3, 4}, DType::i64, -7, "m7"},
                        {{3, 4}, {1, 4}, DType::boolean, 1, "true"}};
  for (const Form& f : forms) {
    OpCase c;
    c.op = "masked_fill";
    c.name = "masked_fill_" + shape_name(f.x) + "_" + shape_name(f.mask) + "_" + dtype_tag(f.dtype) + "_" + f.tag;
    c.inputs = {{f.x, f.dtype, -2, 2}, mask_input(f.mask)};
    if (f.dtype == DType::boolean) c.inputs[0].lo = 0;
    // The value as x's dtype holds it (0.1 rounded to bf16).
    double stored = f.value;
    if (f.dtype == DType::bf16) stored = 0.10009765625;  // 0.1f (0x3DCCCCCD) rounded to bf16: 0x3DCD
    const bool finite = std::isfinite(stored);
    if (!finite || !is_floating(f.dtype)) {
      c.differentiable = false;
      c.inputs[0].grad = false;
    }
    c.forward = [value = f.value](const Inputs& t) { return ops::masked_fill(t[0], t[1], value); };
    if (f.x == Shape{2, 3, 4, 4}) c.bench_shapes = {{8, 12, 256, 256}, {256, 256}};  // a causal mask over scores
    c.reference = [shapes = std::vector<Shape>{f.x, f.mask}, stored](const Values& v) {
      return broadcast_reference(v, shapes, [&](const std::vector<double>& x) { return x[1] != 0 ? stored : x[0]; });
    };
    cases.push_back(c);
  }
}

// Element i of a [.., R, C] tensor is kept by tril (c - r <= k) or triu (c - r >= k).
std::vector<double> triangle_reference(const std::vector<double>& x, int64_t rows, int64_t cols, int64_t k,
                                       bool upper) {
  std::vector<double> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const int64_t c = static_cast<int64_t>(i) % cols, r = static_cast<int64_t>(i) / cols % rows;
    y[i] = (upper ? c - r >= k : c - r <= k) ? x[i] : 0.0;
  }
  return y;
}

void triangle_cases(std::vector<OpCase>& cases) {
  struct Form {
    Shape x;
    int64_t diagonal;
    DType dtype;
  };
  const Form forms[] = {{{5, 5}, 0, DType::f32}, {{2, 3, 4, 6}, 1, DType::f32}, {{3, 7}, -2, DType::f32},
                        {{6, 3}, 2, DType::f32}, {{4, 4}, -9, DType::f32},      {{2, 5, 5}, 0, DType::bf16},
                        {{3, 4}, 1, DType::f16}, {{4, 4}, 0, DType::boolean},   {{3, 5}, -1, DType::i64}};
  for (bool upper : {false, true})
    for (const Form& f : forms) {
      OpCase c;
      c.op = upper ? "triu" : "tril";
      c.name = c.op + "_" + shape_name(f.x) + "_d" + (f.diagonal < 0 ? "m" : "") +
               std::to_string(std::abs(f.diagonal)) + "_" + dtype_tag(f.dtype);
      c.inputs = {{f.x, f.dtype, -2, 2}};
      if (f.dtype == DType::boolean) c.inputs[0].lo = 0;
      const bool all_zero = !upper && f.diagonal == -9;  // tril below every row: no gradient to check
      if (!is_floating(f.dtype) || all_zero) {
        c.differentiable = false;
        c.inputs[0].grad = false;
      }
      c.forward = [upper, k = f.diagonal](const Inputs& t) { return upper ? ops::triu(t[0], k) : ops::tril(t[0], k); };
      if (f.x == Shape{2, 3, 4, 6}) c.bench_shapes = {{8, 12, 256, 256}};
      c.reference = [upper, k = f.diagonal, rows = f.x[f.x.ndim() - 2], cols = f.x[f.x.ndim() - 1]](const Values& v) {
        return triangle_reference(v[0], rows, cols, k, upper);
      };
      cases.push_back(c);
    }
}

void arange_cases(std::vector<OpCase>& cases) {
  struct Form {
    const char* tag;
    double start, end, step;
    std::optional<DType> dtype;
  };
  const Form forms[] = {{"10", 0, 10, 1, std::nullopt},
                        {"2_11_3", 2, 11, 3, std::nullopt},
                        {"0_1_tenth", 0, 1, 0.1, std::nullopt},
                        {"5_m3_m2", 5, -3, -2, std::nullopt},
                        {"0_4_half_bf16", 0, 4, 0.5, DType::bf16},
                        {"m3_3_f16", -3, 3, 0.75, DType::f16},
                        {"m4_4_i32", -4, 4, 1, DType::i32},
                        {"1_6_f32", 1, 6, 1, DType::f32},
                        {"0_5p5_i64", 0, 5.5, 1, DType::i64}};
  for (const Form& f : forms) {
    OpCase c;
    c.op = "arange";
    c.name = std::string("arange_") + f.tag;
    c.inputs = {{{1}, DType::f32}};  // only its device: arange makes the output there
    c.inputs[0].grad = false;
    c.differentiable = false;
    c.forward = [f](const Inputs& t) { return ops::arange(f.start, f.end, f.step, f.dtype, t[0].device()); };
    c.reference = [f](const Values&) {
      std::vector<double> y;
      const auto n = static_cast<int64_t>(std::ceil((f.end - f.start) / f.step));
      for (int64_t i = 0; i < n; ++i) {
        const double v = f.start + static_cast<double>(i) * f.step;
        // As the dtype holds it: f32 (the default for a fractional step) rounds; bf16 and f16 are
        // exact for these values.
        y.push_back(f.dtype == DType::f32 || (!f.dtype && f.step != std::floor(f.step)) ? static_cast<float>(v) : v);
      }
      return y;
    };
    cases.push_back(c);
  }
  OpCase c;
  c.op = "arange";
  c.name = "arange_end_7";
  c.inputs = {{{1}, DType::f32}};
  c.inputs[0].grad = false;
  c.differentiable = false;
  c.forward = [](const Inputs& t) { return ops::arange(7, t[0].device()); };
  c.reference = [](const Values&) { return std::vector<double>{0, 1, 2, 3, 4, 5, 6}; };
  cases.push_back(c);
}

// ops::cast to bool (nonzero, NaN included, is true) and from bool (1 and 0).
void bool_cast_cases(std::vector<OpCase>& cases) {
  for (DType from : {DType::f32, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    OpCase c;
    c.op = "cast";
    c.name = "cast_" + dtype_tag(from) + "_to_bool";
    c.inputs = {compare_input({3, 5}, from)};
    if (from == DType::u8) c.inputs[0].lo = 0;
    c.differentiable = false;
    c.inputs[0].grad = false;
    c.forward = [](const Inputs& t) { return ops::cast(t[0], DType::boolean); };
    c.reference = [](const Values& v) { return map(v[0], truthy); };
    cases.push_back(c);
  }
  for (DType to : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8}) {
    OpCase c;
    c.op = "cast";
    c.name = "cast_bool_to_" + dtype_tag(to);
    c.inputs = {mask_input({4, 3})};
    c.differentiable = false;
    c.forward = [to](const Inputs& t) { return ops::cast(t[0], to); };
    c.reference = [](const Values& v) { return v[0]; };
    cases.push_back(c);
  }
}

// A causal mask over attention scores [B, H, T, T]: the future (column > row) filled, from a tril of
// ones (x holds values in [1, 2), never 0) and from comparing two aranges.
void causal_mask_cases(std::vector<OpCase>& cases) {
  constexpr int64_t T = 5;
  auto reference = [](const Values& v) {
    std::vector<double> y = v[0];
    for (std::size_t i = 0; i < y.size(); ++i)
      if (static_cast<int64_t>(i) % T > static_cast<int64_t>(i) / T % T) y[i] = -4.0;
    return y;
  };
  OpCase c;
  c.op = "masked_fill";
  c.name = "causal_mask_from_tril_2x2x5x5";
  c.inner_ops = {"tril", "eq"};
  c.inputs = {{{2, 2, T, T}}, {{T, T}, DType::f32, 1, 2}};
  c.inputs[1].grad = false;
  c.forward = [](const Inputs& t) { return ops::masked_fill(t[0], ops::eq(ops::tril(t[1]), 0.0), -4.0); };
  c.reference = reference;
  cases.push_back(c);

  OpCase a;
  a.op = "masked_fill";
  a.name = "causal_mask_from_arange_2x2x5x5";
  a.inner_ops = {"arange", "gt"};
  a.inputs = {{{2, 2, T, T}}};
  a.forward = [](const Inputs& t) {
    const Tensor i = ops::arange(T, t[0].device());
    return ops::masked_fill(t[0], ops::gt(ops::reshape(i, {1, T}), ops::reshape(i, {T, 1})), -4.0);
  };
  a.reference = reference;
  cases.push_back(a);
}

}  // namespace

CUMULUS_OP_CASES(compare) {
  comparison_cases(cases);
  scalar_comparison_cases(cases);
  logical_cases(cases);
  where_cases(cases);
  masked_fill_cases(cases);
  triangle_cases(cases);
  arange_cases(cases);
  bool_cast_cases(cases);
  causal_mask_cases(cases);
}

}  // namespace cumulus::testing
