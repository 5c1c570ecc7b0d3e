// Op cases (Note [Op cases] in op_case.h) of rms_norm (ops/normalization.h): PyTorch's F.rms_norm
// in double, over one and two trailing dimensions, with and without a weight, PyTorch's default eps
// and a given one, each floating type; rows wider than the vector lanes with a tail (33, 70), and a
// row of one element. 16-bit cases round the output and the input gradient once to the type, so the
// tolerances are 1e-2 (bf16) and 2e-3 (f16) of the largest value, as layer norm's.
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "cumulus/ops/normalization.h"
#include "op_case.h"

namespace cumulus::testing {

namespace {

std::string dims_name(const Shape& s) {
  std::string out;
  for (int i = 0; i < s.ndim(); ++i) out += (i ? "x" : "") + std::to_string(s[i]);
  return out;
}

// x / sqrt(mean(x^2) + eps) * weight over rows of `cols`; the weight in v[1] when given.
std::vector<double> rms_norm_ref(const Values& v, int64_t cols, bool weighted, double eps) {
  const std::vector<double>& x = v[0];
  std::vector<double> y(x.size());
  for (std::size_t r = 0; r * cols < x.size(); ++r) {
    double squares = 0;
    for (int64_t c = 0; c < cols; ++c) squares += x[r * cols + c] * x[r * cols + c];
    const double inv = 1.0 / std::sqrt(squares / static_cast<double>(cols) + eps);
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = x[r * cols + c] * inv * (weighted ? v[1][c] : 1.0);
  }
  return y;
}

struct Form {
  Shape x_shape, normalized_shape;
  bool weighted;
  std::optional<float> eps;
};

void add_rms_norm_cases(std::vector<OpCase>& cases) {
  const Form forms[] = {
      {{3, 7}, {7}, true, std::nullopt}, {{2, 3, 33}, {33}, true, std::nullopt},  {{2, 3, 33}, {33}, false, 1e-5f},
      {{5, 70}, {70}, true, 1e-6f},      {{2, 3, 4}, {3, 4}, true, std::nullopt}, {{4, 1}, {1}, true, std::nullopt},
  };
  for (const Form& form : forms)
    for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
      const int64_t cols = form.normalized_shape.numel();
      if (dtype != DType::f32 && cols < 33) continue;
      OpCase c;
      c.op = "rms_norm";
      c.name = "rms_norm_" + dims_name(form.x_shape) + "_over_" + dims_name(form.normalized_shape) +
               (form.weighted ? "_weight" : "") + (form.eps ? "_eps" : "") + "_" + dtype_name(dtype);
      c.inputs = {{form.x_shape, dtype, -2, 2}};
      if (form.weighted) c.inputs.push_back({form.normalized_shape, DType::f32, 0.5, 1.5});
      // Width 1: y = sign(x) * weight (up to eps), whose gradient in x is 0 but at 0: nothing to check.
      if (cols == 1) c.inputs[0].grad = false;
      const Shape normalized = form.normalized_shape;
      const std::optional<float> eps = form.eps;
      const bool weighted = form.weighted;
      c.forward = [normalized, weighted, eps](const Inputs& t) {
        // The benchmark's shapes differ: normalize over x's last dimension there.
        const Shape over = t[0].shape().ndim() == 2 && normalized.ndim() == 1 ? Shape{t[0].size(-1)} : normalized;
        return ops::rms_norm(t[0], over, weighted ? t[1] : Tensor(), eps);
      };
      const double e = eps.value_or(std::numeric_limits<float>::epsilon());
      c.reference = [cols, weighted, e](const Values& v) { return rms_norm_ref(v, cols, weighted, e); };
      if (form.x_shape == Shape{5, 70}) c.bench_shapes = {{4096, 1024}, {1024}};
      if (dtype == DType::bf16) c.tolerance = c.grad_tolerance = 1e-2;
      if (dtype == DType::f16) c.tolerance = c.grad_tolerance = 2e-3;
      cases.push_back(c);
    }
}

}  // namespace

CUMULUS_OP_CASES(rms_norm) { add_rms_norm_cases(cases); }

}  // namespace cumulus::testing
