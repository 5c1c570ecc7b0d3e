// Op cases (Note [Op cases] in op_case.h) of the strided views (Note [Strided views] in
// engine/ops/view.cpp): permute up to 8 dimensions, expand, unsqueeze and squeeze, views of views,
// contiguous, reshape of a strided view (a copy), reshape with -1. The references index the
// input's row-major values directly.
#include <numeric>
#include <string>

#include "cumulus/ops/linear.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/shape.h"
#include "op_case.h"

namespace cumulus::testing {

namespace {

std::vector<int64_t> dims_of(const Shape& s) {
  std::vector<int64_t> d;
  for (int i = 0; i < s.ndim(); ++i) d.push_back(s[i]);
  return d;
}

std::vector<int64_t> row_major_strides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i)
    s[static_cast<std::size_t>(i)] = s[static_cast<std::size_t>(i) + 1] * dims[static_cast<std::size_t>(i) + 1];
  return s;
}

// y[i] = x[at(i)] for every index i of `out` in row-major order; `at` maps an output index to the
// input's flat position.
std::vector<double> gather(const std::vector<double>& x, const std::vector<int64_t>& out,
                           const std::function<int64_t(const std::vector<int64_t>&)>& at) {
  int64_t n = 1;
  for (int64_t d : out) n *= d;
  std::vector<double> y;
  std::vector<int64_t> idx(out.size(), 0);
  for (int64_t e = 0; e < n; ++e) {
    y.push_back(x[static_cast<std::size_t>(at(idx))]);
    for (int k = static_cast<int>(out.size()) - 1; k >= 0; --k) {
      if (++idx[static_cast<std::size_t>(k)] < out[static_cast<std::size_t>(k)]) break;
      idx[static_cast<std::size_t>(k)] = 0;
    }
  }
  return y;
}

std::vector<double> permute_reference(const std::vector<double>& x, const Shape& shape, const std::vector<int>& perm) {
  const std::vector<int64_t> in = dims_of(shape), stride = row_major_strides(in);
  std::vector<int64_t> out;
  for (int p : perm) out.push_back(in[static_cast<std::size_t>(p)]);
  return gather(x, out, [&](const std::vector<int64_t>& i) {
    int64_t pos = 0;
    for (std::size_t k = 0; k < perm.size(); ++k) pos += i[k] * stride[static_cast<std::size_t>(perm[k])];
    return pos;
  });
}

OpCase view_case(const std::string& op, const std::string& name, const Shape& shape, DType dtype) {
  OpCase c;
  c.op = op;
  c.name = name + "_" + dtype_name(dtype);
  c.inputs = {{shape, dtype, -1, 1}};
  c.view = true;
  c.tolerance = 0;  // views move values, they never round them
  c.grad_tolerance = dtype == DType::f32 ? 1e-5 : 1e-2;
  return c;
}

void add_permute_cases(std::vector<OpCase>& cases) {
  struct P {
    Shape shape;
    std::vector<int> perm;
    const char* name;
  };
  const std::vector<P> perms = {
      {{2, 5, 3, 4}, {0, 2, 1, 3}, "permute_heads_2x5x3x4"},  // [B, T, H, D] -> [B, H, T, D]
      {{3, 4, 5}, {2, 0, 1}, "permute_3x4x5_201"},
      {{2, 3, 2, 2, 3, 2, 2, 2}, {7, 0, 6, 1, 5, 2, 4, 3}, "permute_8d"},
  };
  for (const P& p : perms)
    for (DType dtype : {DType::f32, DType::bf16}) {
      if (dtype != DType::f32 && p.shape.ndim() == 8) continue;
      OpCase c = view_case("permute", p.name, p.shape, dtype);
      c.forward = [perm = p.perm](const Inputs& t) { return ops::permute(t[0], perm); };
      c.reference = [p](const Values& v) { return permute_reference(v[0], p.shape, p.perm); };
      cases.push_back(c);
    }
}

void add_expand_cases(std::vector<OpCase>& cases) {
  OpCase c = view_case("expand", "expand_3x1x4_to_2x3x5x4", {3, 1, 4}, DType::f32);
  c.forward = [](const Inputs& t) { return ops::expand(t[0], {2, -1, 5, 4}); };
  c.reference = [](const Values& v) {
    return gather(v[0], {2, 3, 5, 4}, [](const std::vector<int64_t>& i) { return i[1] * 4 + i[3]; });
  };
  cases.push_back(c);
  // An expanded operand read by an op: the op's contiguous copy, the gradient summed back.
  OpCase m = view_case("mul", "expand_then_mul_4x1", {4, 1}, DType::f32);
  m.inputs.push_back({{4, 3}, DType::f32, -1, 1});
  m.inner_ops = {"expand", "contiguous"};
  m.view = false;
  m.tolerance = 1e-6;
  m.forward = [](const Inputs& t) { return ops::mul(ops::expand(t[0], {4, 3}), t[1]); };
  m.reference = [](const Values& v) {
    std::vector<double> y(12);
    for (std::size_t i = 0; i < 12; ++i) y[i] = v[0][i / 3] * v[1][i];
    return y;
  };
  cases.push_back(m);
}

void add_squeeze_cases(std::vector<OpCase>& cases) {
  OpCase u = view_case("unsqueeze", "unsqueeze_3x4_at_1", {3, 4}, DType::f32);
  u.forward = [](const Inputs& t) { return ops::unsqueeze(t[0], 1); };
  u.reference = [](const Values& v) { return v[0]; };
  cases.push_back(u);
  OpCase s = view_case("squeeze", "squeeze_3x1x4_at_m2", {3, 1, 4}, DType::f32);
  s.forward = [](const Inputs& t) { return ops::squeeze(t[0], -2); };
  s.reference = [](const Values& v) { return v[0]; };
  cases.push_back(s);
}

// Views of views, and the copies that make them dense.
void add_chained_cases(std::vector<OpCase>& cases) {
  const Shape shape{4, 6, 5};
  OpCase c = view_case("narrow", "narrow_of_transpose_4x6x5", shape, DType::f32);
  c.inner_ops = {"transpose"};
  c.forward = [](const Inputs& t) { return ops::narrow(ops::transpose(t[0], 0, 2), 1, 2, 3); };  // [5, 3, 4]
  c.reference = [](const Values& v) {
    return gather(v[0], {5, 3, 4}, [](const std::vector<int64_t>& i) { return i[2] * 30 + (i[1] + 2) * 5 + i[0]; });
  };
  cases.push_back(c);

  for (DType dtype : {DType::f32, DType::f16}) {
    OpCase d = view_case("contiguous", "contiguous_of_permute_4x6x5", shape, dtype);
    d.view = false;
    d.inner_ops = {"permute"};
    d.forward = [](const Inputs& t) { return ops::contiguous(ops::permute(t[0], {1, 2, 0})); };
    d.reference = [shape](const Values& v) { return permute_reference(v[0], shape, {1, 2, 0}); };
    cases.push_back(d);
  }

  OpCase r = view_case("contiguous", "reshape_m1_of_transpose_4x6x5", shape, DType::f32);
  r.view = false;  // a strided input: reshape copies it (contiguous)
  r.inner_ops = {"transpose", "reshape"};
  r.forward = [](const Inputs& t) { return ops::reshape(ops::transpose(t[0], 1, 2), {-1, 6}); };
  r.reference = [shape](const Values& v) { return permute_reference(v[0], shape, {0, 2, 1}); };
  cases.push_back(r);

  // A qkv projection's k slice split into heads: the strides allow a view, so nothing is copied.
  OpCase h = view_case("reshape", "reshape_heads_of_narrow_2x3x12", {2, 3, 12}, DType::f32);
  h.inner_ops = {"narrow"};
  h.forward = [](const Inputs& t) {
    const Tensor k = ops::narrow(t[0], -1, 4, 8);  // [2, 3, 8], strides [36, 12, 1]
    const Tensor heads = ops::reshape(k, {2, 3, 2, 4});
    CUMULUS_CHECK(heads.shares_storage(t[0]), Error, "the heads are not a view");
    return heads;
  };
  h.reference = [](const Values& v) {
    return gather(v[0], {2, 3, 2, 4},
                  [](const std::vector<int64_t>& i) { return (i[0] * 3 + i[1]) * 12 + 4 + i[2] * 4 + i[3]; });
  };
  cases.push_back(h);
}

// matmul of transposed dense operands ([B, H, T, D] x k^T): read through the GEMM's transpose flags,
// so nothing is copied (an allocation named `contiguous` would fail the case's memory check).
void add_transposed_matmul_cases(std::vector<OpCase>& cases) {
  for (int which = 1; which <= 3; ++which) {  // 1: b transposed, 2: a, 3: both
    const bool ta = which & 2, tb = which & 1;
    const int64_t B = 2, H = 3, m = 4, k = 5, n = 6;
    OpCase c;
    c.op = "matmul";
    c.name = std::string("matmul_transposed_") + (ta ? "a" : "") + (tb ? "b" : "") + "_2x3x4x5_5x6";
    c.inputs = {{ta ? Shape{B, H, k, m} : Shape{B, H, m, k}, DType::f32},
                {tb ? Shape{B, H, n, k} : Shape{B, H, k, n}, DType::f32}};
    c.inner_ops = {"transpose"};
    c.forward = [ta, tb](const Inputs& t) {
      return ops::matmul(ta ? ops::transpose(t[0], -2, -1) : t[0], tb ? ops::transpose(t[1], -1, -2) : t[1]);
    };
    c.reference = [=](const Values& v) {
      std::vector<double> y;
      for (int64_t p = 0; p < B * H; ++p)
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double acc = 0;
            for (int64_t l = 0; l < k; ++l)
              acc += v[0][p * m * k + (ta ? l * m + i : i * k + l)] * v[1][p * k * n + (tb ? j * k + l : l * n + j)];
            y.push_back(acc);
          }
      return y;
    };
    cases.push_back(c);
  }
}

}  // namespace

CUMULUS_OP_CASES(view) {
  add_transposed_matmul_cases(cases);
  add_permute_cases(cases);
  add_expand_cases(cases);
  add_squeeze_cases(cases);
  add_chained_cases(cases);
}

}  // namespace cumulus::testing
