// Op cases (Note [Op cases] in op_case.h): the reductions sum and mean, cross_entropy, argmax.
#include <algorithm>
#include <cmath>
#include <string>

#include "cumulus/ops/loss.h"
#include "cumulus/ops/reduce.h"
#include "op_case.h"
#include "references.h"

namespace cumulus::testing {

namespace {

OpCase sum_case(bool mean) {
  OpCase c;
  c.op = mean ? "mean" : "sum";
  c.name = c.op + "_2x3x5_f32";
  c.grad_tolerance = 1e-5;
  c.inputs = {{{2, 3, 5}, DType::f32}};
  c.forward = [mean](const Inputs& t) { return mean ? ops::mean(t[0]) : ops::sum(t[0]); };
  c.reference = [mean](const Values& v) {
    return ref::Vec{ref::sum(v[0]) / (mean ? static_cast<double>(v[0].size()) : 1.0)};
  };
  c.bench_shapes = {{1024, 4096}};
  return c;
}

// logits [B, C] of `dtype` in [-4, 4) (a spread of logit scales), labels [B] i32 in [0, C).
OpCase cross_entropy_case(int64_t B, int64_t C, DType dtype, ops::Reduction r) {
  OpCase c;
  const bool mean = r == ops::Reduction::Mean;
  c.op = "cross_entropy";
  c.name =
      "cross_entropy_" + std::to_string(B) + "x" + std::to_string(C) + (mean ? "_mean_" : "_sum_") + dtype_name(dtype);
  c.inputs = {{{B, C}, dtype, -4, 4}, {{B}, DType::i32, 0, static_cast<double>(C)}};
  c.forward = [r](const Inputs& t) { return ops::cross_entropy(t[0], t[1], r); };
  c.reference = [C, mean](const Values& v) { return ref::Vec{ref::cross_entropy(v[0], v[1], C, mean)}; };
  // The loss is f32 from the (exact) 16-bit logits; the logits' gradient rounds to their type.
  c.grad_tolerance = dtype == DType::f32 ? 1e-5 : dtype == DType::bf16 ? 5e-3 : 1e-3;
  c.bench_shapes = {{1024, 1000}, {1024}};
  return c;
}

// With nan_rows, rows 0 to 3 hold NaN: in the middle, first, twice, last (rows >= 4, cols >= 5).
OpCase argmax_case(int64_t rows, int64_t cols, DType dtype, bool nan_rows = false) {
  OpCase c;
  c.op = "argmax";
  c.name =
      "argmax_" + std::to_string(rows) + "x" + std::to_string(cols) + (nan_rows ? "_nan_" : "_") + dtype_name(dtype);
  c.inputs = {{{rows, cols}, dtype, -3, 3}};
  if (nan_rows)
    c.inputs[0].edit = [cols](std::vector<float>& x) {
      x[0 * cols + 2] = x[1 * cols + 0] = x[2 * cols + 1] = x[2 * cols + 3] = x[3 * cols + cols - 1] = NAN;
    };
  c.differentiable = false;
  c.forward = [](const Inputs& t) { return ops::argmax(t[0]); };
  // torch.argmax: the first NaN of a row, else its first maximum (ties, which 16-bit rounding
  // makes likely, go to the first).
  c.reference = [rows, cols](const Values& v) {
    ref::Vec idx(static_cast<std::size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) {
      const double* row = v[0].data() + i * cols;
      int64_t best = std::find_if(row, row + cols, [](double x) { return std::isnan(x); }) - row;
      if (best == cols) best = std::max_element(row, row + cols) - row;
      idx[i] = static_cast<double>(best);
    }
    return idx;
  };
  c.tolerance = 0;  // indices are exact
  c.bench_shapes = {{1024, 1000}};
  return c;
}

}  // namespace

CUMULUS_OP_CASES(reduce) {
  cases.push_back(sum_case(false));
  cases.push_back(sum_case(true));
  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (ops::Reduction r : {ops::Reduction::Sum, ops::Reduction::Mean})
      cases.push_back(cross_entropy_case(5, 4, dtype, r));
  cases.push_back(cross_entropy_case(7, 10, DType::f32, ops::Reduction::Mean));
  cases.push_back(cross_entropy_case(1, 3, DType::f32, ops::Reduction::Sum));
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) cases.push_back(argmax_case(6, 7, dtype));
  cases.push_back(argmax_case(37, 10, DType::f32));
  for (DType dtype : {DType::f32, DType::bf16}) cases.push_back(argmax_case(6, 7, dtype, true));
}

}  // namespace cumulus::testing
