// Op cases (Note [Op cases] in op_case.h) for the ops over leading dimensions (issue 40): linear
// on [..., in] and [in], cross_entropy on logits [..., C] with labels [...] (i32 and i64; reductions
// None, Sum and Mean; ignore_index), softmax / log_softmax along any dimension, layer_norm over
// several trailing dimensions, matmul with 1-D operands and broadcast batch dimensions, embedding
// and index_select with i64 indices. References in double, from PyTorch's definitions.
#include <cmath>
#include <string>
#include <vector>

#include "cumulus/ops/linear.h"
#include "cumulus/ops/loss.h"
#include "cumulus/ops/normalization.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/shape.h"
#include "op_case.h"
#include "references.h"

namespace cumulus::testing {

namespace {

using ref::Vec;

// 16-bit storage with f32 arithmetic: a few roundings of the type (bf16 2^-8, f16 2^-11 relative).
void set_tolerances(OpCase& c, DType dtype) {
  if (dtype == DType::bf16) c.tolerance = c.grad_tolerance = 1e-2;
  if (dtype == DType::f16) c.tolerance = c.grad_tolerance = 2e-3;
}

// ---- linear ----

void add_linear(std::vector<OpCase>& cases, const Shape& x, int64_t out, bool bias, ops::Activation act, DType dtype) {
  const bool relu = act == ops::Activation::relu;
  const int64_t in = x[x.ndim() - 1], rows = x.numel() / in;
  OpCase c;
  c.op = relu ? "linear+relu" : "linear";
  c.name = std::string(relu ? "linear_relu_" : "linear_") + shape_name(x) + "_to_" + std::to_string(out) +
           (bias ? "" : "_nobias") + "_" + dtype_name(dtype);
  c.inputs = {{x, dtype}, {{out, in}, DType::f32}};
  if (bias) c.inputs.push_back({{out}, DType::f32});
  c.inner_ops = {"reshape"};
  c.forward = [bias, act](const Inputs& t) { return ops::linear(t[0], t[1], bias ? t[2] : Tensor(), act); };
  c.reference = [=](const Values& v) {
    const Vec y = ref::linear(v[0], v[1], bias ? v[2] : Vec(), rows, in, out);
    return relu ? ref::relu(y) : y;
  };
  c.grad_tolerance = 1e-5;
  // A 16-bit x multiplies a rounded copy of the weight (Note [Mixed precision]): cases_linear's bounds.
  if (dtype == DType::bf16) c.tolerance = c.grad_tolerance = 1e-2;
  if (dtype == DType::f16) c.tolerance = c.grad_tolerance = 2e-3;
  c.flops = 2.0 * rows * in * out;
  cases.push_back(c);
}

// ---- cross_entropy ----

// Each position's loss (NaN-free: labels in range or ignored), then the reduction.
Vec cross_entropy_ref(const Vec& logits, const Vec& labels, int64_t C, ops::Reduction r, int64_t ignore) {
  const int64_t N = static_cast<int64_t>(labels.size());
  Vec loss(static_cast<std::size_t>(N), 0.0);
  double total = 0, kept = 0;
  for (int64_t i = 0; i < N; ++i) {
    const auto y = static_cast<int64_t>(labels[i]);
    if (y == ignore) continue;
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, logits[i * C + c]);
    for (int64_t c = 0; c < C; ++c) s += std::exp(logits[i * C + c] - m);
    loss[i] = m + std::log(s) - logits[i * C + y];
    total += loss[i];
    kept += 1;
  }
  if (r == ops::Reduction::None) return loss;
  return Vec{r == ops::Reduction::Mean ? total / kept : total};
}

const char* reduction_name(ops::Reduction r) {
  return r == ops::Reduction::None ? "none" : r == ops::Reduction::Sum ? "sum" : "mean";
}

// labels uniform in [label_lo, label_hi); ignore_index as given.
void add_cross_entropy(std::vector<OpCase>& cases, const std::string& tag, const Shape& logits, ops::Reduction r,
                       DType dtype, DType label_type, int64_t ignore, double label_lo, double label_hi) {
  const int64_t C = logits[logits.ndim() - 1];
  Shape labels;
  for (int d = 0; d + 1 < logits.ndim(); ++d) labels.push_back(logits[d]);
  OpCase c;
  c.op = "cross_entropy";
  c.name = "cross_entropy_" + tag + "_" + shape_name(logits) + "_" + reduction_name(r) + "_" + dtype_name(label_type) +
           "_" + dtype_name(dtype);
  c.inputs = {{logits, dtype, -3, 3}, {labels, label_type, label_lo, label_hi}};
  c.forward = [r, ignore](const Inputs& t) { return ops::cross_entropy(t[0], t[1], r, ignore); };
  c.reference = [=](const Values& v) { return cross_entropy_ref(v[0], v[1], C, r, ignore); };
  set_tolerances(c, dtype);
  cases.push_back(c);
}

// ---- softmax / log_softmax along a dimension ----

Vec softmax_ref(const Vec& x, const Shape& s, int dim, bool log) {
  int64_t outer = 1, n = s[dim], inner = 1;
  for (int i = 0; i < s.ndim(); ++i) {
    if (i < dim) outer *= s[i];
    if (i > dim) inner *= s[i];
  }
  Vec y(x.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t j) { return static_cast<std::size_t>((o * n + j) * inner + i); };
      double m = -INFINITY, sum = 0;
      for (int64_t j = 0; j < n; ++j) m = std::max(m, x[at(j)]);
      for (int64_t j = 0; j < n; ++j) sum += std::exp(x[at(j)] - m);
      for (int64_t j = 0; j < n; ++j) y[at(j)] = log ? x[at(j)] - m - std::log(sum) : std::exp(x[at(j)] - m) / sum;
    }
  return y;
}

void add_softmax(std::vector<OpCase>& cases, const Shape& x, int dim, bool log, DType dtype) {
  const int d = dim < 0 ? dim + x.ndim() : dim;
  OpCase c;
  c.op = log ? "log_softmax" : "softmax";
  c.name = c.op + "_" + shape_name(x) + "_dim" + (dim < 0 ? "m" + std::to_string(-dim) : std::to_string(dim)) + "_" +
           dtype_name(dtype);
  c.inputs = {{x, dtype, -2, 2}};
  c.inner_ops = {"transpose", "contiguous"};  // another dim than the last: moved last and back
  c.forward = [dim, log](const Inputs& t) { return log ? ops::log_softmax(t[0], dim) : ops::softmax(t[0], dim); };
  c.reference = [=](const Values& v) { return softmax_ref(v[0], x, d, log); };
  set_tolerances(c, dtype);
  cases.push_back(c);
}

// ---- layer_norm over several trailing dimensions ----

void add_layer_norm(std::vector<OpCase>& cases, const Shape& x, const Shape& normalized) {
  const int64_t cols = normalized.numel(), rows = x.numel() / cols;
  OpCase c;
  c.op = "layer_norm";
  c.name = "layer_norm_" + shape_name(x) + "_over_" + shape_name(normalized);
  c.inputs = {{x, DType::f32, -2, 2}, {normalized, DType::f32, 0.5, 1.5}, {normalized, DType::f32}};
  c.inner_ops = {"reshape"};
  c.forward = [normalized](const Inputs& t) { return ops::layer_norm(t[0], normalized, t[1], t[2]); };
  c.reference = [=](const Values& v) {
    Vec y(v[0].size());
    for (int64_t r = 0; r < rows; ++r) {
      double mean = 0, var = 0;
      for (int64_t j = 0; j < cols; ++j) mean += v[0][r * cols + j];
      mean /= cols;
      for (int64_t j = 0; j < cols; ++j) var += (v[0][r * cols + j] - mean) * (v[0][r * cols + j] - mean);
      var /= cols;
      for (int64_t j = 0; j < cols; ++j)
        y[r * cols + j] = (v[0][r * cols + j] - mean) / std::sqrt(var + 1e-5) * v[1][j] + v[2][j];
    }
    return y;
  };
  c.grad_tolerance = 1e-3;
  cases.push_back(c);
}

// ---- matmul with PyTorch's shapes ----

// Batch dimensions of a [..., n, k] (as given, 1-D operands already made 2-D) broadcast; c's index
// of a batch position p in the broadcast shape `batch` for an operand of batch shape `own`.
int64_t operand_batch(int64_t p, const std::vector<int64_t>& batch, const std::vector<int64_t>& own) {
  int64_t index = 0, stride = 1;
  for (int i = static_cast<int>(batch.size()) - 1, j = static_cast<int>(own.size()) - 1; i >= 0; --i, --j) {
    const int64_t pos = p % batch[i];
    p /= batch[i];
    if (j < 0) continue;
    index += (own[j] == 1 ? 0 : pos) * stride;
    stride *= own[j];
  }
  return index;
}

Vec matmul_ref(const Vec& a, const Shape& as, const Vec& b, const Shape& bs) {
  std::vector<int64_t> ad(as.ndim() == 1 ? 1 : 0, 1), bd;
  for (int i = 0; i < as.ndim(); ++i) ad.push_back(as[i]);
  for (int i = 0; i < bs.ndim(); ++i) bd.push_back(bs[i]);
  if (bs.ndim() == 1) bd.push_back(1);
  const int64_t n = ad[ad.size() - 2], k = ad.back(), m = bd.back();
  const std::vector<int64_t> abatch(ad.begin(), ad.end() - 2), bbatch(bd.begin(), bd.end() - 2);
  std::vector<int64_t> batch(std::max(abatch.size(), bbatch.size()), 1);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const auto ia = static_cast<int64_t>(i) - static_cast<int64_t>(batch.size() - abatch.size());
    const auto ib = static_cast<int64_t>(i) - static_cast<int64_t>(batch.size() - bbatch.size());
    batch[i] = std::max(ia >= 0 ? abatch[ia] : 1, ib >= 0 ? bbatch[ib] : 1);
  }
  int64_t P = 1;
  for (int64_t d : batch) P *= d;
  Vec c(static_cast<std::size_t>(P * n * m));
  for (int64_t p = 0; p < P; ++p) {
    const int64_t pa = operand_batch(p, batch, abatch), pb = operand_batch(p, batch, bbatch);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) {
        double s = 0;
        for (int64_t l = 0; l < k; ++l) s += a[(pa * n + i) * k + l] * b[(pb * k + l) * m + j];
        c[(p * n + i) * m + j] = s;
      }
  }
  return c;
}

void add_matmul(std::vector<OpCase>& cases, const Shape& a, const Shape& b, DType dtype,
                std::vector<std::string> inner = {}) {
  OpCase c;
  c.op = "matmul";
  c.name = "matmul_" + shape_name(a) + "_at_" + shape_name(b) + "_" + dtype_name(dtype);
  c.inputs = {{a, dtype}, {b, dtype}};
  c.inner_ops = std::move(inner);
  c.forward = [](const Inputs& t) { return ops::matmul(t[0], t[1]); };
  c.reference = [a, b](const Values& v) { return matmul_ref(v[0], a, v[1], b); };
  set_tolerances(c, dtype);
  cases.push_back(c);
}

}  // namespace

CUMULUS_OP_CASES(leading_dims) {
  using ops::Activation;
  using ops::Reduction;
  // linear over any leading shape, and a 1-D input
  for (DType dt : {DType::f32, DType::bf16}) add_linear(cases, {2, 3, 4}, 5, true, Activation::none, dt);
  add_linear(cases, {2, 3, 4}, 5, true, Activation::relu, DType::f32);
  add_linear(cases, {2, 1, 3, 4}, 3, false, Activation::none, DType::f32);
  add_linear(cases, {4}, 3, true, Activation::none, DType::f32);
  add_linear(cases, {4}, 3, true, Activation::relu, DType::f16);

  // cross_entropy: N-D logits, every reduction, i32 and i64 labels, 16-bit logits
  for (Reduction r : {Reduction::None, Reduction::Sum, Reduction::Mean})
    for (DType lt : {DType::i32, DType::i64}) add_cross_entropy(cases, "nd", {2, 3, 5}, r, DType::f32, lt, -100, 0, 5);
  add_cross_entropy(cases, "nd", {2, 3, 5}, Reduction::Mean, DType::bf16, DType::i64, -100, 0, 5);
  add_cross_entropy(cases, "nd", {2, 3, 5}, Reduction::None, DType::f16, DType::i32, -100, 0, 5);
  add_cross_entropy(cases, "2d", {6, 7}, Reduction::Mean, DType::f32, DType::i64, -100, 0, 7);
  add_cross_entropy(cases, "1d", {5}, Reduction::Mean, DType::f32, DType::i64, -100, 0, 5);
  add_cross_entropy(cases, "4d", {2, 2, 3, 4}, Reduction::Sum, DType::f32, DType::i32, -100, 0, 4);
  // ignore_index: a class (positions with label 2 ignored), and a value outside the classes (5,
  // drawn among the labels)
  for (Reduction r : {Reduction::None, Reduction::Sum, Reduction::Mean}) {
    add_cross_entropy(cases, "ignore2", {3, 4, 5}, r, DType::f32, DType::i64, 2, 0, 5);
    add_cross_entropy(cases, "ignore5", {3, 4, 5}, r, DType::f32, DType::i32, 5, 0, 6);
  }
  add_cross_entropy(cases, "ignore5", {3, 4, 5}, Reduction::Mean, DType::bf16, DType::i32, 5, 0, 6);
  // Every position ignored (a zero gradient, which finite differences cannot check, and Mean's
  // NaN): tests/test_ops.cpp, CrossEntropyIgnoresIgnoreIndex.

  // softmax / log_softmax along each dimension
  for (bool log : {false, true})
    for (int dim : {0, 1, -1, 2}) add_softmax(cases, {3, 4, 5}, dim, log, DType::f32);
  add_softmax(cases, {3, 4, 5}, 0, false, DType::bf16);
  add_softmax(cases, {3, 4, 5}, 1, true, DType::f16);
  add_softmax(cases, {6, 5}, 0, true, DType::f32);

  // layer_norm over the last two dimensions
  add_layer_norm(cases, {2, 3, 4}, {3, 4});
  add_layer_norm(cases, {3, 2, 5}, {5});

  // matmul: 4-D batches, broadcast batches, 1-D operands
  add_matmul(cases, {2, 3, 4, 5}, {2, 3, 5, 4}, DType::f32);
  add_matmul(cases, {2, 3, 4, 5}, {2, 3, 5, 4}, DType::bf16);
  add_matmul(cases, {2, 1, 3, 4}, {3, 4, 2}, DType::f32, {"expand", "contiguous"});  // both operands broadcast
  add_matmul(cases, {3, 4}, {2, 4, 5}, DType::f32);                                  // a repeated: a batch stride of 0
  add_matmul(cases, {1, 3, 4}, {2, 2, 4, 5}, DType::bf16, {"reshape"});
  add_matmul(cases, {1, 3, 4}, {2, 2, 4, 5}, DType::f32, {"reshape"});
  add_matmul(cases, {2, 3, 4}, {1, 4, 5}, DType::f32, {"reshape"});  // b repeated: a batch stride of 0
  add_matmul(cases, {2, 2, 3, 4}, {4, 5}, DType::f16);
  add_matmul(cases, {4}, {2, 4, 5}, DType::f32, {"reshape"});
  add_matmul(cases, {2, 3, 4}, {4}, DType::f32, {"reshape"});
  add_matmul(cases, {4}, {4}, DType::f32, {"reshape"});
  add_matmul(cases, {4}, {4, 3}, DType::f32, {"reshape"});

  // i64 indices
  {
    OpCase c;
    c.op = "embedding";
    c.name = "embedding_i64_2x3_of_7x4_f32";
    c.inputs = {{{2, 3}, DType::i64, 0, 7}, {{7, 4}, DType::f32}};
    c.forward = [](const Inputs& t) { return ops::embedding(t[0], t[1]); };
    c.reference = [](const Values& v) {
      Vec y;
      for (double i : v[0])
        for (int64_t j = 0; j < 4; ++j) y.push_back(v[1][static_cast<std::size_t>(i) * 4 + j]);
      return y;
    };
    cases.push_back(c);
  }
  {
    OpCase c;
    c.op = "index_select";
    c.name = "index_select_i64_dim1_3x5x2_f32";
    c.inputs = {{{3, 5, 2}, DType::f32}, {{4}, DType::i64, 0, 5}};
    c.forward = [](const Inputs& t) { return ops::index_select(t[0], 1, t[1]); };
    c.reference = [](const Values& v) {
      Vec y;
      for (int64_t o = 0; o < 3; ++o)
        for (double i : v[1])
          for (int64_t j = 0; j < 2; ++j) y.push_back(v[0][(o * 5 + static_cast<int64_t>(i)) * 2 + j]);
      return y;
    };
    cases.push_back(c);
  }
}

}  // namespace cumulus::testing
