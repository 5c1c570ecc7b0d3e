// kernels/cpu/vec_math.h's functions for AVX2 and FMA, the only file compiled with -mavx2 -mfma
// (CMakeLists.txt); called only after vec::available() found both on this CPU. Compiled with
// -ffp-contract=off, so the arithmetic around SLEEF's functions rounds as the scalar rules' does.
#include "kernels/cpu/vec_math.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <sleef.h>

// For the constants only: an inline function of it called here would be compiled for AVX2, and
// that copy could be the one the linker keeps for the whole library.
#include "kernels/pointwise_rules.h"

namespace cumulus::kernels::vec {
namespace {

using V = __m256;
V splat(float v) { return _mm256_set1_ps(v); }
V add(V a, V b) { return _mm256_add_ps(a, b); }
V sub(V a, V b) { return _mm256_sub_ps(a, b); }
V mul(V a, V b) { return _mm256_mul_ps(a, b); }

// y = f(x) over n floats, 8 at a time; a tail of under 8 goes through f padded with zeros.
template <typename F>
void map1(const float* x, float* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, f(_mm256_loadu_ps(x + i)));
  if (i == n) return;
  alignas(32) float xb[8] = {}, yb[8];
  for (int64_t k = i; k < n; ++k) xb[k - i] = x[k];
  _mm256_store_ps(yb, f(_mm256_load_ps(xb)));
  for (int64_t k = i; k < n; ++k) y[k] = yb[k - i];
}

// g = f(x, dy) over n floats, as map1.
template <typename F>
void map2(const float* x, const float* dy, float* g, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(g + i, f(_mm256_loadu_ps(x + i), _mm256_loadu_ps(dy + i)));
  if (i == n) return;
  alignas(32) float xb[8] = {}, db[8] = {}, gb[8];
  for (int64_t k = i; k < n; ++k) xb[k - i] = x[k], db[k - i] = dy[k];
  _mm256_store_ps(gb, f(_mm256_load_ps(xb), _mm256_load_ps(db)));
  for (int64_t k = i; k < n; ++k) g[k] = gb[k - i];
}

// kSqrt2OverPi * (x + kGeluTanhCubic * x * x * x): the argument of gelu_tanh's tanh.
V gelu_tanh_arg(V x) { return mul(splat(kSqrt2OverPi), add(x, mul(mul(mul(splat(kGeluTanhCubic), x), x), x))); }

}  // namespace

void tanh_f32(const float* x, float* y, int64_t n) {
  map1(x, y, n, [](V v) { return Sleef_tanhf8_u10avx2(v); });
}

void sigmoid_f32(const float* x, float* y, int64_t n) {
  map1(x, y, n, [](V v) {
    const V e = Sleef_expf8_u10avx2(sub(_mm256_setzero_ps(), v));
    return _mm256_div_ps(splat(1.0f), add(splat(1.0f), e));
  });
}

void gelu_f32(const float* x, float* y, int64_t n) {
  map1(x, y, n, [](V v) {
    const V erf = Sleef_erff8_u10avx2(mul(v, splat(kSqrt1_2)));
    return mul(mul(splat(0.5f), v), add(splat(1.0f), erf));
  });
}

void gelu_tanh_f32(const float* x, float* y, int64_t n) {
  map1(x, y, n, [](V v) {
    const V t = Sleef_tanhf8_u10avx2(gelu_tanh_arg(v));
    return mul(mul(splat(0.5f), v), add(splat(1.0f), t));
  });
}

void exp_f32(const float* x, float* y, int64_t n) {
  map1(x, y, n, [](V v) { return Sleef_expf8_u10avx2(v); });
}

void log_f32(const float* x, float* y, int64_t n) {
  map1(x, y, n, [](V v) { return Sleef_logf8_u10avx2(v); });
}

void gelu_grad_f32(const float* x, const float* dy, float* g, int64_t n) {
  map2(x, dy, g, n, [](V v, V d) {
    const V cdf = mul(splat(0.5f), add(splat(1.0f), Sleef_erff8_u10avx2(mul(v, splat(kSqrt1_2)))));
    const V pdf = mul(splat(kInvSqrt2Pi), Sleef_expf8_u10avx2(mul(mul(splat(-0.5f), v), v)));
    return mul(d, add(cdf, mul(v, pdf)));
  });
}

// One tanh per element, shared by both terms of the derivative.
void gelu_tanh_grad_f32(const float* x, const float* dy, float* g, int64_t n) {
  map2(x, dy, g, n, [](V v, V d) {
    const V t = Sleef_tanhf8_u10avx2(gelu_tanh_arg(v));
    const V inner_grad = mul(splat(kSqrt2OverPi), add(splat(1.0f), mul(mul(splat(3.0f * kGeluTanhCubic), v), v)));
    const V left = mul(splat(0.5f), add(splat(1.0f), t));
    const V right = mul(mul(mul(splat(0.5f), v), sub(splat(1.0f), mul(t, t))), inner_grad);
    return mul(d, add(left, right));
  });
}

}  // namespace cumulus::kernels::vec
#endif
