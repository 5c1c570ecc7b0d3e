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

// 2^k for integers k in [-126, 127], built in the exponent field.
V pow2(__m256i k) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23)); }

// e^x to about 1 ulp (Cephes' expf: x = n ln 2 + r with |r| <= ln 2 / 2, ln 2 in two parts, a
// degree-7 polynomial for e^r, then times 2^n in two halves, so that n = 128 near the overflow stays
// finite), in about half the instructions of SLEEF's expf8_u10. Results below FLT_MIN (x < -87.34)
// are 0 rather than subnormal, x > 88.72 is inf, NaN stays NaN (min and max return their second
// operand when either is NaN, and the comparisons below are false for it).
V exp_fast(V x) {
  const V xc = _mm256_min_ps(splat(88.72283f), _mm256_max_ps(splat(-87.34f), x));
  const V n = _mm256_round_ps(mul(xc, splat(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  V r = _mm256_fnmadd_ps(n, splat(0.693359375f), xc);
  r = _mm256_fnmadd_ps(n, splat(-2.12194440e-4f), r);
  static constexpr float kPoly[] = {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f,
                                    5.0000001201e-1f};
  V p = splat(1.9875691500e-4f);
  for (float c : kPoly) p = _mm256_fmadd_ps(p, r, splat(c));
  p = _mm256_fmadd_ps(p, mul(r, r), add(r, splat(1.0f)));
  const __m256i k = _mm256_cvtps_epi32(n), half = _mm256_srai_epi32(k, 1);
  V y = mul(mul(p, pow2(half)), pow2(_mm256_sub_epi32(k, half)));
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, splat(-87.33654f), _CMP_LT_OQ));
  return _mm256_blendv_ps(y, splat(INFINITY), _mm256_cmp_ps(x, splat(88.72283f), _CMP_GT_OQ));
}

// 1 / (1 + e), with e = inf giving 0. A division: the reciprocal estimate with a Newton step saves
// about 15% of gelu_tanh's time but doubles its error (2 ulp to 3).
V one_over_one_plus(V e) { return _mm256_div_ps(splat(1.0f), add(splat(1.0f), e)); }

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

// 0.5 x (1 + tanh(u)) = x sigmoid(2u) = x / (1 + exp(-2u)): one exp, about a third of a tanh's cost,
// and no cancellation in 1 + tanh(u) where u is very negative. exp(-2u) = inf gives x * 0 (NaN at
// x = -inf, as the tanh form).
void gelu_tanh_f32(const float* x, float* y, int64_t n) {
  map1(x, y, n, [](V v) {
    return mul(v, one_over_one_plus(exp_fast(mul(splat(-2.0f), gelu_tanh_arg(v)))));
  });
}

void gelu_grad_f32(const float* x, const float* dy, float* g, int64_t n) {
  map2(x, dy, g, n, [](V v, V d) {
    const V cdf = mul(splat(0.5f), add(splat(1.0f), Sleef_erff8_u10avx2(mul(v, splat(kSqrt1_2)))));
    const V pdf = mul(splat(kInvSqrt2Pi), Sleef_expf8_u10avx2(mul(mul(splat(-0.5f), v), v)));
    return mul(d, add(cdf, mul(v, pdf)));
  });
}

// d/dx x s(2u) = s + x 2 u' s (1 - s), s = 1 / (1 + e), e = exp(-2u), with s (1 - s) = e s s (no
// cancellation where s is near 1): one exp, recomputed from x rather than saved by the forward (a
// saved s would cost a write and a read of n floats, more than the exp). Where e is inf, s is 0 and
// so is e s s (inf * 0 would be NaN).
void gelu_tanh_grad_f32(const float* x, const float* dy, float* g, int64_t n) {
  map2(x, dy, g, n, [](V v, V d) {
    const V e = exp_fast(mul(splat(-2.0f), gelu_tanh_arg(v)));
    const V s = one_over_one_plus(e);
    const V finite = _mm256_cmp_ps(e, splat(INFINITY), _CMP_NEQ_UQ);
    const V ess = _mm256_and_ps(finite, mul(mul(e, s), s));
    const V inner_grad2 = mul(splat(2.0f * kSqrt2OverPi), add(splat(1.0f), mul(mul(splat(3.0f * kGeluTanhCubic), v), v)));
    return mul(d, add(s, mul(mul(v, ess), inner_grad2)));
  });
}

}  // namespace cumulus::kernels::vec
#endif
