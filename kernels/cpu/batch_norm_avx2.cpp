// kernels/cpu/batch_norm_rows.h's functions: batch_norm_planes.h's loops for f32, compiled for
// AVX2 without contraction, as vec_math_avx2.cpp (CMakeLists.txt).
#include "kernels/cpu/batch_norm_rows.h"

#if defined(__x86_64__)
#include "kernels/cpu/batch_norm_planes.h"

namespace cumulus::kernels::vec {

double batch_norm_plane_sum_f32(const float* p, int64_t n) { return plane_sum(p, n); }

double batch_norm_plane_squared_deviation_f32(const float* p, int64_t n, float mean) {
  return plane_squared_deviation(p, n, mean);
}

void batch_norm_normalize_plane_f32(const float* p, int64_t n, float mean, float scale, float beta, float* q) {
  normalize_plane(p, n, mean, scale, beta, q);
}

void batch_norm_plane_grad_sums_f32(const float* p, const float* g, int64_t n, float mean, double* sum_g,
                                    double* sum_gd) {
  plane_grad_sums(p, g, n, mean, sum_g, sum_gd);
}

void batch_norm_plane_dx_f32(const float* p, const float* g, int64_t n, bool training, float mean, float invstd,
                             float scale, float mean_dy, float mean_dy_xhat, float beta, float* q) {
  plane_dx_of(p, g, n, training, mean, invstd, scale, mean_dy, mean_dy_xhat, beta, q);
}

}  // namespace cumulus::kernels::vec
#endif
