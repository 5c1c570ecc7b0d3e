// kernels/cpu/rms_norm_rows.h's vec:: functions, 8 lanes: compiled for AVX2 and FMA without
// contraction, as vec_math_avx2.cpp (CMakeLists.txt).
#include "kernels/cpu/rms_norm_rows.h"

#if defined(__x86_64__)
#include "kernels/cpu/rms_norm_vec.h"

namespace cumulus::kernels::vec {

void rms_norm_row_f32(const float* x, const float* weight, int64_t n, float eps, float* y, float* rstd) {
  RmsNormRows<8>::forward(x, weight, n, eps, y, rstd);
}

void rms_norm_grad_row_f32(const float* x, const float* dy, const float* weight, float rstd, int64_t n, float beta,
                           float* dx, float* pw) {
  RmsNormRows<8>::grad(x, dy, weight, rstd, n, beta, dx, pw);
}

}  // namespace cumulus::kernels::vec
#endif
