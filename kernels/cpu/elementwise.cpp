// Elementwise ops and reductions on the CPU: plain loops the compiler vectorizes. Where beta is 0
// the destination is never read (it may hold stale values or NaN).
#include <algorithm>
#include <cmath>

#include "kernels/cpu/kernels.h"

namespace cumulus::kernels {

namespace {
inline float blend(float value, float beta, float old) { return beta == 0.0f ? value : value + beta * old; }
}  // namespace

void narrow_cpu(const float* x, uint16_t* y, int64_t n, Float16 type) {
  if (type == Float16::bf16) for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(x[i]);
  else for (int64_t i = 0; i < n; ++i) y[i] = f32_to_f16(x[i]);
}

void widen_cpu(const uint16_t* x, float* y, int64_t n, Float16 type) {
  if (type == Float16::bf16) for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(x[i]);
  else for (int64_t i = 0; i < n; ++i) y[i] = f16_to_f32(x[i]);
}

void broadcast_rows_cpu(const float* row, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r) std::copy(row, row + cols, out + r * cols);
}

void sum_rows_cpu(const float* x, int64_t rows, int64_t cols, float beta, float* out) {
  if (beta == 0.0f) std::fill(out, out + cols, 0.0f);
  else if (beta != 1.0f) for (int64_t c = 0; c < cols; ++c) out[c] *= beta;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    for (int64_t c = 0; c < cols; ++c) out[c] += xr[c];
  }
}

void sum_all_cpu(const float* x, int64_t n, float scale, float* out) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  out[0] = static_cast<float>(s * scale);
}

// ReLU propagates NaN, as PyTorch's does: `x <= 0 ? 0 : x` is false for NaN, which passes through
// (`x > 0 ? x : 0` and fmax(x, 0) both turn it into 0 and hide a diverged model). Backward follows
// PyTorch's threshold rule on the output: 0 where y <= 0, dy elsewhere, NaN outputs included.
void relu_forward_cpu(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] <= 0.0f ? 0.0f : x[i];
}

void relu_backward_cpu(const float* y, const float* dy, float beta, float* dx, int64_t n) {
  // Two loops rather than blend() per element: a branch on beta inside the loop keeps the
  // compiler from vectorizing it, and this runs over every activation of the model.
  if (beta == 0.0f) {
    for (int64_t i = 0; i < n; ++i) dx[i] = y[i] <= 0.0f ? 0.0f : dy[i];
  } else {
    for (int64_t i = 0; i < n; ++i) dx[i] = (y[i] <= 0.0f ? 0.0f : dy[i]) + beta * dx[i];
  }
}

void fill_cpu(float* out, float value, int64_t n) { std::fill(out, out + n, value); }

void fill_from_scalar_cpu(const float* scalar, float scale, float beta, float* out, int64_t n) {
  const float v = scale * scalar[0];
  for (int64_t i = 0; i < n; ++i) out[i] = blend(v, beta, out[i]);
}

void accumulate_cpu(const float* x, float beta, float* y, int64_t n) {
  if (beta == 0.0f) std::copy(x, x + n, y);
  else for (int64_t i = 0; i < n; ++i) y[i] = x[i] + beta * y[i];
}

void argmax_rows_cpu(const float* x, int64_t rows, int64_t cols, int32_t* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    out[r] = static_cast<int32_t>(std::max_element(xr, xr + cols) - xr);
  }
}

}  // namespace cumulus::kernels
