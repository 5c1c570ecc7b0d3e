// The vector rows of rms_norm (kernels/cpu/rms_norm.cpp), declared for both widths: vec:: (AVX2,
// rms_norm_avx2.cpp) and vec512:: (AVX-512, rms_norm_avx512.cpp), each called only after its
// available() (kernels/cpu/vec_math.h). No engine types, for the reason vec_math.h gives.
#pragma once

#include <cstdint>

namespace cumulus::kernels::vec {
// One row of n: *rstd = 1 / sqrt(mean(x^2) + eps) (the sum of squares in float blocks, then
// double), y = x * rstd * weight (weight null: 1) in float.
void rms_norm_row_f32(const float* x, const float* weight, int64_t n, float eps, float* y, float* rstd);
// One row's dx = rstd * g - x * (rstd^3 * mean(g * x)), g = dy * weight, blended into dx with beta
// (dx not read when beta is 0); with pw (else null) the row's share of dweight on the way:
// pw[c] += dy[c] * (x[c] * rstd) in float.
void rms_norm_grad_row_f32(const float* x, const float* dy, const float* weight, float rstd, int64_t n, float beta,
                           float* dx, float* pw);
}  // namespace cumulus::kernels::vec

namespace cumulus::kernels::vec512 {
// vec::rms_norm_row_f32 and vec::rms_norm_grad_row_f32 16 lanes at a time (the same operations;
// the sums' blocks hold twice as many terms, so a sum may differ in its last bits).
void rms_norm_row_f32(const float* x, const float* weight, int64_t n, float eps, float* y, float* rstd);
void rms_norm_grad_row_f32(const float* x, const float* dy, const float* weight, float rstd, int64_t n, float beta,
                           float* dx, float* pw);
}  // namespace cumulus::kernels::vec512
