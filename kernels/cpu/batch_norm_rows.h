// The f32 planes of batch_norm2d at AVX2's width (kernels/cpu/batch_norm_planes.h, compiled by
// batch_norm_avx2.cpp), called only after vec::available() (kernels/cpu/vec_math.h). No engine
// types, for the reason vec_math.h gives.
#pragma once

#include <cstdint>

namespace cumulus::kernels::vec {
double batch_norm_plane_sum_f32(const float* p, int64_t n);
double batch_norm_plane_squared_deviation_f32(const float* p, int64_t n, float mean);
void batch_norm_normalize_plane_f32(const float* p, int64_t n, float mean, float scale, float beta, float* q);
void batch_norm_plane_grad_sums_f32(const float* p, const float* g, int64_t n, float mean, double* sum_g,
                                    double* sum_gd);
void batch_norm_plane_dx_f32(const float* p, const float* g, int64_t n, bool training, float mean, float invstd,
                             float scale, float mean_dy, float mean_dy_xhat, float beta, float* q);
}  // namespace cumulus::kernels::vec
