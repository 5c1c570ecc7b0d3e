// CPU launchers of rms_norm (engine/ops/rms_norm.cpp) over the last dimension: x [rows, cols].
// Templated over the storage type T (float, BFloat16, Half): f32 arithmetic with each row's sum of
// squares in double (or in float blocks added in double on the vector path: Note [Blocked float
// sums] in vec_math_avx512.cpp), one rounding per 16-bit store. Gradients take a beta (0
// overwrites without reading the destination, 1 adds to it: Note [Gradient sinks]).
#pragma once

#include <cstdint>

#include "kernels/float16.h"

namespace cumulus::kernels {

// y = x * rstd * weight with rstd = 1 / sqrt(mean(x^2) + eps) per row; weight f32 [cols] or null
// (1). Writes each row's rstd (f32) for the backward.
template <typename T>
void rms_norm_forward_cpu(const T* x, const float* weight, int64_t rows, int64_t cols, float eps, T* y, float* rstd);

// dx = rstd * (g - x_hat * mean(g * x_hat)) + beta * dx with g = dy * weight and x_hat = x * rstd
// (dx skipped when null); dweight = sum_rows dy * x_hat + beta_dw * dweight (skipped when null).
// With the vector path and both wanted, one pass over x and dy (Note [RMS norm's backward in one
// pass] in rms_norm.cpp).
template <typename T>
void rms_norm_backward_cpu(const T* x, const T* dy, const float* weight, const float* rstd, int64_t rows, int64_t cols,
                           float beta, T* dx, float beta_dw, float* dweight);

}  // namespace cumulus::kernels
