// Op cases (Note [Op cases] in op_case.h): the reductions over dimensions of cumulus/ops/reduce.h:
// sum, mean, amax and amin over sets of dimensions, max / min / argmax / argmin along one (values and indices),
// topk, multinomial. The references index the flat row-major values themselves.
#include <algorithm>
#include <cmath>
#include <string>

#include "cumulus/ops/reduce.h"
#include "op_case.h"
#include "references.h"

namespace cumulus::testing {

namespace {

std::string dims_name(const std::vector<int64_t>& dims) {
  std::string name = dims.empty() ? "all" : "d";
  for (int64_t d : dims) name += (d < 0 ? "m" : "") + std::to_string(d < 0 ? -d : d);
  return name;
}

// Row-major index i of `shape` as per-dimension indices.
std::vector<int64_t> unravel(int64_t i, const Shape& shape) {
  std::vector<int64_t> idx(static_cast<std::size_t>(shape.ndim()));
  for (int d = shape.ndim() - 1; d >= 0; --d) {
    idx[d] = i % shape[d];
    i /= shape[d];
  }
  return idx;
}

// sum (or mean) over dims from the definition: each input element adds into the output element its
// kept indices name. The output is row-major over the kept dimensions (keepdim does not move it).
ref::Vec reference_sum(const ref::Vec& x, const Shape& shape, std::vector<int64_t> dims, bool mean) {
  const int n = shape.ndim();
  std::vector<bool> reduced(static_cast<std::size_t>(n), dims.empty());
  for (int64_t d : dims)
    if (n > 0) reduced[(d + n) % n] = true;
  int64_t outputs = 1, terms = 1;
  for (int d = 0; d < n; ++d) (reduced[d] ? terms : outputs) *= shape[d];
  ref::Vec y(static_cast<std::size_t>(outputs), 0.0);
  for (int64_t i = 0; i < shape.numel(); ++i) {
    const std::vector<int64_t> idx = unravel(i, shape);
    int64_t o = 0;
    for (int d = 0; d < n; ++d)
      if (!reduced[d]) o = o * shape[d] + idx[d];
    y[o] += x[i];
  }
  if (mean)
    for (double& v : y) v /= static_cast<double>(terms);
  return y;
}

OpCase sum_dims_case(bool mean, Shape shape, std::vector<int64_t> dims, bool keepdim, DType dtype) {
  OpCase c;
  c.op = mean ? "mean" : "sum";
  c.name = c.op + "_" + shape_name(shape) + "_" + dims_name(dims) + (keepdim ? "_keep_" : "_") + dtype_name(dtype);
  c.inputs = {{shape, dtype}};
  c.forward = [mean, dims, keepdim](const Inputs& t) {
    return mean ? ops::mean(t[0], dims, keepdim) : ops::sum(t[0], dims, keepdim);
  };
  c.reference = [shape, dims, mean](const Values& v) { return reference_sum(v[0], shape, dims, mean); };
  // 16 bits: the result is rounded once to its type; so is the mean's gradient w / terms.
  const double rounding = dtype == DType::bf16 ? 1.0 / 256 : dtype == DType::f16 ? 1.0 / 2048 : 0;
  c.tolerance = dtype == DType::f32 ? 1e-6 : 2 * rounding;
  c.grad_tolerance = dtype == DType::f32 ? 1e-5 : 2 * rounding;
  return c;
}

// amax / amin over dims from the definition: the largest (smallest) of each output's terms, NaN
// where one is NaN.
ref::Vec reference_extreme(const ref::Vec& x, const Shape& shape, std::vector<int64_t> dims, bool largest) {
  const int n = shape.ndim();
  std::vector<bool> reduced(static_cast<std::size_t>(n), dims.empty());
  for (int64_t d : dims)
    if (n > 0) reduced[(d + n) % n] = true;
  int64_t outputs = 1;
  for (int d = 0; d < n; ++d) outputs *= reduced[d] ? 1 : shape[d];
  ref::Vec y(static_cast<std::size_t>(outputs), largest ? -INFINITY : INFINITY);
  for (int64_t i = 0; i < shape.numel(); ++i) {
    const std::vector<int64_t> idx = unravel(i, shape);
    int64_t o = 0;
    for (int d = 0; d < n; ++d)
      if (!reduced[d]) o = o * shape[d] + idx[d];
    if (std::isnan(y[o])) continue;
    y[o] = std::isnan(x[i]) ? x[i] : largest ? std::max(y[o], x[i]) : std::min(y[o], x[i]);
  }
  return y;
}

// Uniform inputs: no ties, so the gradient is the selected element's alone (a tie's even share is
// no derivative finite differences can check; tests/test_reduce_dims.cpp checks it).
OpCase extreme_case(bool largest, Shape shape, std::vector<int64_t> dims, bool keepdim, DType dtype) {
  OpCase c;
  c.op = largest ? "amax" : "amin";
  c.name = c.op + "_" + shape_name(shape) + "_" + dims_name(dims) + (keepdim ? "_keep_" : "_") + dtype_name(dtype);
  c.inputs = {{shape, dtype}};
  c.forward = [largest, dims, keepdim](const Inputs& t) {
    return largest ? ops::amax(t[0], dims, keepdim) : ops::amin(t[0], dims, keepdim);
  };
  c.reference = [shape, dims, largest](const Values& v) { return reference_extreme(v[0], shape, dims, largest); };
  c.tolerance = 0;
  c.grad_tolerance = 1e-5;
  return c;
}

// A row of a million terms of order 1: f32 accumulation in order would be off by thousands of
// units in the last place; the result must be within one rounding of the exact sum.
OpCase long_row_sum_case() {
  OpCase c = sum_dims_case(false, {2, 1000000}, {1}, false, DType::f32);
  c.inputs[0].lo = 0.5;
  c.inputs[0].hi = 1.5;
  c.tolerance = 1e-7;  // relative to the sum, ~1e6: half a unit in the last place is 3e-8
  c.fd_samples = 3;
  c.fd_step = 1e-3;
  return c;
}

// x viewed along dim as [outer, size, inner].
struct Slab3 {
  int64_t outer = 1, dim = 1, inner = 1;
};
Slab3 slab3(const Shape& shape, int64_t dim) {
  Slab3 s;
  if (shape.ndim() == 0) return s;
  const int d = static_cast<int>((dim + shape.ndim()) % shape.ndim());
  for (int i = 0; i < shape.ndim(); ++i) (i < d ? s.outer : i == d ? s.dim : s.inner) *= shape[i];
  return s;
}

// Whether a ranks before b from the definitions (torch): further toward the wanted end, NaN the
// largest value (and, for max / min, before every number: both propagate NaN), ties to the lower index.
bool before(double a, int64_t ia, double b, int64_t ib, bool largest, bool nan_first) {
  if (std::isnan(a) || std::isnan(b)) {
    if (std::isnan(a) && std::isnan(b)) return ia < ib;
    return std::isnan(a) == nan_first;
  }
  if (a != b) return largest ? a > b : a < b;
  return ia < ib;
}

// The k first-ranking (value, index) pairs of each row along dim, [outer, k, inner] row-major, by
// sorting each row.
std::pair<ref::Vec, ref::Vec> reference_select(const ref::Vec& x, const Shape& shape, int64_t dim, int64_t k,
                                               bool largest, bool nan_first) {
  const Slab3 s = slab3(shape, dim);
  ref::Vec values(static_cast<std::size_t>(s.outer * k * s.inner)), indices(values.size());
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t i = 0; i < s.inner; ++i) {
      std::vector<int64_t> order(static_cast<std::size_t>(s.dim));
      for (int64_t d = 0; d < s.dim; ++d) order[d] = d;
      auto at = [&](int64_t d) { return x[(o * s.dim + d) * s.inner + i]; };
      std::sort(order.begin(), order.end(),
                [&](int64_t a, int64_t b) { return before(at(a), a, at(b), b, largest, nan_first); });
      for (int64_t j = 0; j < k; ++j) {
        values[(o * k + j) * s.inner + i] = at(order[j]);
        indices[(o * k + j) * s.inner + i] = static_cast<double>(order[j]);
      }
    }
  return {values, indices};
}

// Values in {-2, -1, 0, 1}: most rows tie; with nans, some NaN too.
std::function<void(std::vector<float>&)> ties(bool nans) {
  return [nans](std::vector<float>& x) {
    for (float& v : x) v = std::floor(2 * v);
    if (nans)
      for (std::size_t i = 3; i < x.size(); i += 7) x[i] = NAN;
  };
}

enum class Out { values, indices };

// max / min (values or indices), argmax / argmin (indices).
OpCase select_one_case(const std::string& op, Shape shape, int64_t dim, bool keepdim, DType dtype, Out out,
                       bool tied = false, bool nans = false) {
  OpCase c;
  c.op = op;
  const bool largest = op == "max" || op == "argmax";
  c.name = op + (out == Out::indices && op.rfind("arg", 0) != 0 ? "_indices_" : "_") + shape_name(shape) + "_d" +
           (dim < 0 ? "m" : "") + std::to_string(std::abs(dim)) + (keepdim ? "_keep" : "") + (tied ? "_ties" : "") +
           (nans ? "_nan_" : "_") + dtype_name(dtype);
  c.inputs = {{shape, dtype, -1, 1}};
  if (tied) c.inputs[0].edit = ties(nans);
  c.forward = [op, dim, keepdim, out](const Inputs& t) {
    if (op == "argmax") return ops::argmax(t[0], dim, keepdim);
    if (op == "argmin") return ops::argmin(t[0], dim, keepdim);
    const ops::ValuesAndIndices r = op == "max" ? ops::max(t[0], dim, keepdim) : ops::min(t[0], dim, keepdim);
    return out == Out::values ? r.values : r.indices;
  };
  c.reference = [shape, dim, largest, out](const Values& v) {
    const auto r = reference_select(v[0], shape, dim, 1, largest, true);
    return out == Out::values ? r.first : r.second;
  };
  c.differentiable = out == Out::values;
  c.tolerance = 0;  // a selection copies its value
  c.grad_tolerance = 1e-5;
  return c;
}

OpCase topk_case(Shape shape, int64_t k, int64_t dim, bool largest, DType dtype, Out out, bool tied = false,
                 bool nans = false) {
  OpCase c;
  c.op = "topk";
  c.name = std::string("topk_") + (out == Out::indices ? "indices_" : "") + shape_name(shape) + "_k" +
           std::to_string(k) + "_d" + (dim < 0 ? "m" : "") + std::to_string(std::abs(dim)) +
           (largest ? "_largest" : "_smallest") + (tied ? "_ties" : "") + (nans ? "_nan_" : "_") + dtype_name(dtype);
  c.inputs = {{shape, dtype, -1, 1}};
  if (tied) c.inputs[0].edit = ties(nans);
  c.forward = [k, dim, largest, out](const Inputs& t) {
    const ops::ValuesAndIndices r = ops::topk(t[0], k, dim, largest);
    return out == Out::values ? r.values : r.indices;
  };
  c.reference = [shape, k, dim, largest, out](const Values& v) {
    const auto r = reference_select(v[0], shape, dim, k, largest, largest);
    return out == Out::values ? r.first : r.second;
  };
  c.differentiable = out == Out::values;
  c.tolerance = 0;
  c.grad_tolerance = 1e-5;
  return c;
}

// Inverse CDF sampling from the definition (Note [Multinomial draw]) with the op's documented
// uniforms, ops::multinomial_uniform.
ref::Vec reference_multinomial(const ref::Vec& w, int64_t rows, int64_t n, int64_t samples, bool replacement,
                               uint64_t seed) {
  ref::Vec out;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<bool> taken(static_cast<std::size_t>(n), false);
    for (int64_t s = 0; s < samples; ++s) {
      double total = 0;
      for (int64_t c = 0; c < n; ++c)
        if (!taken[c]) total += w[r * n + c];
      const double target = ops::multinomial_uniform(seed, r, s) * total;
      double running = 0;
      int64_t pick = -1;
      for (int64_t c = 0; c < n; ++c) {
        if (taken[c] || w[r * n + c] <= 0) continue;
        running += w[r * n + c];
        pick = c;
        if (target < running) break;
      }
      if (!replacement) taken[pick] = true;
      out.push_back(static_cast<double>(pick));
    }
  }
  return out;
}

OpCase multinomial_case(Shape shape, int64_t samples, bool replacement, DType dtype) {
  OpCase c;
  c.op = "multinomial";
  c.name = "multinomial_" + shape_name(shape) + "_s" + std::to_string(samples) + (replacement ? "_replacement_" : "_") +
           dtype_name(dtype);
  c.inputs = {{shape, dtype, 0, 2}};
  c.inputs[0].edit = [](std::vector<float>& w) {  // some categories never drawn
    for (std::size_t i = 2; i < w.size(); i += 5) w[i] = 0;
  };
  const uint64_t seed = 1234;
  c.forward = [samples, replacement, seed](const Inputs& t) {
    return ops::multinomial(t[0], samples, replacement, seed);
  };
  const int64_t n = shape[shape.ndim() - 1], rows = shape.ndim() == 2 ? shape[0] : 1;
  c.reference = [rows, n, samples, replacement, seed](const Values& v) {
    return reference_multinomial(v[0], rows, n, samples, replacement, seed);
  };
  c.differentiable = false;
  c.tolerance = 0;
  return c;
}

}  // namespace

CUMULUS_OP_CASES(reduce_dims) {
  // sum / mean over one dimension, several (neighbouring and not), all, with keepdim.
  for (bool mean : {false, true}) {
    cases.push_back(sum_dims_case(mean, {2, 3, 4}, {1}, false, DType::f32));
    cases.push_back(sum_dims_case(mean, {2, 3, 4}, {-1}, true, DType::f32));
    cases.push_back(sum_dims_case(mean, {2, 3, 4}, {0, 2}, false, DType::f32));
    cases.push_back(sum_dims_case(mean, {2, 3, 4, 5}, {3, 0, 1}, true, DType::f32));
    cases.push_back(sum_dims_case(mean, {2, 3, 4}, {}, false, DType::f32));
    cases.push_back(sum_dims_case(mean, {}, {0}, false, DType::f32));
    cases.push_back(sum_dims_case(mean, {3, 1, 5}, {1}, false, DType::f32));
    for (DType dtype : {DType::bf16, DType::f16}) cases.push_back(sum_dims_case(mean, {4, 6}, {0}, false, dtype));
  }
  cases.push_back(long_row_sum_case());
  // ops::sum(x) / mean(x) of a 16-bit x (summed as sum(x, {})).
  for (bool mean : {false, true}) {
    OpCase c = sum_dims_case(mean, {3, 5}, {}, false, DType::bf16);
    c.name = c.op + "_all_3x5_bf16";
    c.forward = [mean](const Inputs& t) { return mean ? ops::mean(t[0]) : ops::sum(t[0]); };
    cases.push_back(c);
  }

  for (bool largest : {true, false}) {
    cases.push_back(extreme_case(largest, {3, 5, 4}, {1}, false, DType::f32));
    cases.push_back(extreme_case(largest, {3, 5, 4}, {0, 2}, true, DType::f32));
    cases.push_back(extreme_case(largest, {3, 5, 4}, {}, false, DType::f32));
    cases.push_back(extreme_case(largest, {}, {-1}, false, DType::f32));
    cases.push_back(extreme_case(largest, {4, 6}, {-1}, false, DType::f16));
  }

  for (const char* op : {"max", "min"}) {
    cases.push_back(select_one_case(op, {3, 5, 4}, 1, false, DType::f32, Out::values));
    cases.push_back(select_one_case(op, {3, 5, 4}, -1, true, DType::f32, Out::values));
    cases.push_back(select_one_case(op, {6, 5}, 0, false, DType::bf16, Out::values));
    cases.push_back(select_one_case(op, {}, 0, false, DType::f32, Out::values));
    cases.push_back(select_one_case(op, {3, 5, 4}, 1, false, DType::f32, Out::indices, true, true));
    cases.push_back(select_one_case(op, {6, 7}, -1, true, DType::f16, Out::indices, true, false));
  }
  for (const char* op : {"argmax", "argmin"}) {
    cases.push_back(select_one_case(op, {4, 3, 5}, 0, false, DType::f32, Out::indices, true, true));
    cases.push_back(select_one_case(op, {4, 9}, -1, true, DType::bf16, Out::indices, true, false));
    cases.push_back(select_one_case(op, {7}, 0, false, DType::f32, Out::indices));
  }

  for (bool largest : {true, false}) {
    cases.push_back(topk_case({4, 7}, 3, -1, largest, DType::f32, Out::values));
    cases.push_back(topk_case({5, 3, 2}, 2, 0, largest, DType::f32, Out::values));
    cases.push_back(topk_case({4, 7}, 7, 1, largest, DType::bf16, Out::values));
    cases.push_back(topk_case({4, 9}, 4, -1, largest, DType::f32, Out::indices, true, true));
    cases.push_back(topk_case({3, 6, 2}, 6, 1, largest, DType::f32, Out::indices, true, true));
  }

  // Rows of 1024 elements or more: CUDA's block-per-row selection.
  cases.push_back(topk_case({2, 1100}, 5, -1, true, DType::f32, Out::indices, true, true));
  {
    OpCase c = topk_case({3, 1500}, 4, 1, true, DType::f32, Out::values);
    c.fd_samples = 64;  // the elements checked are raised above the rest, so each row's top 4 are among them
    c.inputs[0].edit = [](std::vector<float>& x) {
      for (std::size_t s = 0; s < 64; ++s) x[s * (x.size() - 1) / 63] = 1.0f + 0.01f * static_cast<float>(s);
    };
    cases.push_back(c);
  }

  for (bool replacement : {true, false}) {
    cases.push_back(multinomial_case({12}, 5, replacement, DType::f32));
    cases.push_back(multinomial_case({4, 11}, 6, replacement, DType::f32));
    cases.push_back(multinomial_case({3, 9}, 7, replacement, DType::bf16));
  }
  cases.push_back(multinomial_case({2, 5}, 40, true, DType::f16));
}

}  // namespace cumulus::testing
