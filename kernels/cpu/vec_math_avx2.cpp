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

// e^x within 1.3 ulp (Cephes' expf: x = n ln 2 + r with |r| <= ln 2 / 2, ln 2 in two parts, a
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

// A sum in double of 8 floats at a time, in two vectors of 4 lanes (the order differs from a
// sequential sum's, which is within a rounding of the double result either way).
struct DoubleSum {
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  void add(__m256d a, __m256d b) {
    lo = _mm256_add_pd(lo, a);
    hi = _mm256_add_pd(hi, b);
  }
  double total() const {
    alignas(32) double v[4];
    _mm256_store_pd(v, _mm256_add_pd(lo, hi));
    return (v[0] + v[1]) + (v[2] + v[3]);
  }
};
__m256d low_pd(V v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
__m256d high_pd(V v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }
V from_pd(__m256d lo, __m256d hi) {
  return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm256_cvtpd_ps(lo)), _mm256_cvtpd_ps(hi), 1);
}

// out = f(a, b, c) over n floats, as map1: a tail goes through f padded with `pad` in a (b and c
// with zeros), so every element sees the same function. b, c may be null (zeros), and out (f is
// called for what it accumulates).
template <typename F>
void map3(const float* a, const float* b, const float* c, float* out, int64_t n, float pad, F f) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const V r =
        f(_mm256_loadu_ps(a + i), b ? _mm256_loadu_ps(b + i) : splat(0.0f), c ? _mm256_loadu_ps(c + i) : splat(0.0f));
    if (out != nullptr) _mm256_storeu_ps(out + i, r);
  }
  if (i == n) return;
  alignas(32) float ab[8] = {pad, pad, pad, pad, pad, pad, pad, pad}, bb[8] = {}, cb[8] = {}, ob[8];
  for (int64_t k = i; k < n; ++k) ab[k - i] = a[k], bb[k - i] = b ? b[k] : 0.0f, cb[k - i] = c ? c[k] : 0.0f;
  _mm256_store_ps(ob, f(_mm256_load_ps(ab), _mm256_load_ps(bb), _mm256_load_ps(cb)));
  if (out != nullptr)
    for (int64_t k = i; k < n; ++k) out[k] = ob[k - i];
}

float max_of(const float* x, int64_t n) {
  V m = splat(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m);  // a NaN in x is skipped, as fmax
  alignas(32) float v[8];
  _mm256_store_ps(v, m);
  float r = -INFINITY;
  for (float e : v) r = fmaxf(r, e);
  for (; i < n; ++i) r = fmaxf(r, x[i]);
  return r;
}

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
  map1(x, y, n, [](V v) { return mul(v, one_over_one_plus(exp_fast(mul(splat(-2.0f), gelu_tanh_arg(v))))); });
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
    const V inner_grad2 =
        mul(splat(2.0f * kSqrt2OverPi), add(splat(1.0f), mul(mul(splat(3.0f * kGeluTanhCubic), v), v)));
    return mul(d, add(s, mul(mul(v, ess), inner_grad2)));
  });
}

// The accumulators are locals, never captured: a capture by reference would keep them in memory,
// as every vector store may alias them.
void softmax_row_f32(bool log, const float* x, float* y, int64_t n) {
  const V m = splat(max_of(x, n));
  __m256d lo = _mm256_setzero_pd(), hi = lo;
  // exp(x - m) summed (a pad of -inf adds exp(-inf) = 0), and stored in y for softmax's scaling.
  map3(x, nullptr, nullptr, log ? nullptr : y, n, -INFINITY, [m, &lo, &hi](V v, V, V) {
    const V e = exp_fast(sub(v, m));
    lo = _mm256_add_pd(lo, low_pd(e));
    hi = _mm256_add_pd(hi, high_pd(e));
    return e;
  });
  const double sum = DoubleSum{lo, hi}.total();
  if (log) {
    const V log_s = splat(static_cast<float>(::log(sum)));
    map3(x, nullptr, nullptr, y, n, 0.0f, [m, log_s](V v, V, V) { return sub(sub(v, m), log_s); });
  } else {
    const V inv = splat(static_cast<float>(1.0 / sum));
    map3(y, nullptr, nullptr, y, n, 0.0f, [inv](V v, V, V) { return mul(v, inv); });
  }
}

void softmax_grad_row_f32(bool log, const float* y, const float* dy, float beta, float* dx, int64_t n) {
  __m256d lo = _mm256_setzero_pd(), hi = lo;  // log_softmax: sum(dy); softmax: sum(dy y), in double
  map3(y, dy, nullptr, nullptr, n, 0.0f, [log, &lo, &hi](V yv, V g, V) {
    lo = _mm256_add_pd(lo, log ? low_pd(g) : _mm256_mul_pd(low_pd(g), low_pd(yv)));
    hi = _mm256_add_pd(hi, log ? high_pd(g) : _mm256_mul_pd(high_pd(g), high_pd(yv)));
    return g;
  });
  const V s = splat(static_cast<float>(DoubleSum{lo, hi}.total())), b = splat(beta);
  map3(y, dy, beta == 0.0f ? nullptr : dx, dx, n, 0.0f, [log, s, b, beta](V yv, V g, V old) {
    const V v = log ? sub(g, mul(exp_fast(yv), s)) : mul(yv, sub(g, s));
    return beta == 0.0f ? v : add(v, mul(b, old));
  });
}

void layer_norm_row_f32(const float* x, const float* weight, const float* bias, int64_t n, float eps, float* y,
                        float* mean, float* rstd) {
  DoubleSum sum;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const V v = _mm256_loadu_ps(x + i);
    sum.add(low_pd(v), high_pd(v));
  }
  double s = sum.total();
  for (int64_t k = i; k < n; ++k) s += x[k];
  const double m = s / static_cast<double>(n);
  const __m256d md = _mm256_set1_pd(m);
  DoubleSum squares;
  for (i = 0; i + 8 <= n; i += 8) {
    const V v = _mm256_loadu_ps(x + i);
    const __m256d a = _mm256_sub_pd(low_pd(v), md), b = _mm256_sub_pd(high_pd(v), md);
    squares.add(_mm256_mul_pd(a, a), _mm256_mul_pd(b, b));
  }
  double ss = squares.total();
  for (int64_t k = i; k < n; ++k) ss += (x[k] - m) * (x[k] - m);
  const double inv = 1.0 / sqrt(ss / static_cast<double>(n) + eps);
  *mean = static_cast<float>(m);
  *rstd = static_cast<float>(inv);
  const __m256d invd = _mm256_set1_pd(inv);
  for (i = 0; i + 8 <= n; i += 8) {
    const V v = _mm256_loadu_ps(x + i);
    V out =
        from_pd(_mm256_mul_pd(_mm256_sub_pd(low_pd(v), md), invd), _mm256_mul_pd(_mm256_sub_pd(high_pd(v), md), invd));
    if (weight != nullptr) out = mul(out, _mm256_loadu_ps(weight + i));
    if (bias != nullptr) out = add(out, _mm256_loadu_ps(bias + i));
    _mm256_storeu_ps(y + i, out);
  }
  for (int64_t k = i; k < n; ++k) {
    float v = static_cast<float>((x[k] - m) * inv);
    if (weight != nullptr) v *= weight[k];
    if (bias != nullptr) v += bias[k];
    y[k] = v;
  }
}

void layer_norm_grad_row_f32(const float* x, const float* dy, const float* weight, float mean, float rstd, int64_t n,
                             float beta, float* dx) {
  const __m256d md = _mm256_set1_pd(mean), invd = _mm256_set1_pd(rstd);
  auto g_at = [&](int64_t i) {
    return weight != nullptr ? mul(_mm256_loadu_ps(dy + i), _mm256_loadu_ps(weight + i)) : _mm256_loadu_ps(dy + i);
  };
  DoubleSum sum_g, sum_g_xhat;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const V g = g_at(i), v = _mm256_loadu_ps(x + i);
    const __m256d glo = low_pd(g), ghi = high_pd(g);
    sum_g.add(glo, ghi);
    sum_g_xhat.add(_mm256_mul_pd(glo, _mm256_mul_pd(_mm256_sub_pd(low_pd(v), md), invd)),
                   _mm256_mul_pd(ghi, _mm256_mul_pd(_mm256_sub_pd(high_pd(v), md), invd)));
  }
  double sg = sum_g.total(), sgx = sum_g_xhat.total();
  for (int64_t k = i; k < n; ++k) {
    const double g = dy[k] * (weight != nullptr ? weight[k] : 1.0f);
    sg += g;
    sgx += g * ((static_cast<double>(x[k]) - mean) * rstd);
  }
  const auto mean_g = static_cast<float>(sg / static_cast<double>(n));
  const auto mean_g_xhat = static_cast<float>(sgx / static_cast<double>(n));
  const V mg = splat(mean_g), mgx = splat(mean_g_xhat), inv = splat(rstd), b = splat(beta);
  for (i = 0; i + 8 <= n; i += 8) {
    const V v = _mm256_loadu_ps(x + i);
    const V xhat =
        from_pd(_mm256_mul_pd(_mm256_sub_pd(low_pd(v), md), invd), _mm256_mul_pd(_mm256_sub_pd(high_pd(v), md), invd));
    V out = mul(inv, sub(sub(g_at(i), mg), mul(xhat, mgx)));
    if (beta != 0.0f) out = add(out, mul(b, _mm256_loadu_ps(dx + i)));
    _mm256_storeu_ps(dx + i, out);
  }
  for (int64_t k = i; k < n; ++k) {
    const float g = dy[k] * (weight != nullptr ? weight[k] : 1.0f);
    const auto xhat = static_cast<float>((static_cast<double>(x[k]) - mean) * rstd);
    const float v = rstd * (g - mean_g - xhat * mean_g_xhat);
    dx[k] = beta == 0.0f ? v : v + beta * dx[k];
  }
}

void tile_dots_f32(const float* x, const float* t, int64_t d, int64_t width, float* s) {
  int64_t j0 = 0;
  for (; j0 + 32 <= width; j0 += 32) {
    V a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t c = 0; c < d; ++c) {
      const V xc = splat(x[c]);
      const float* tc = t + c * width + j0;
      a0 = _mm256_fmadd_ps(xc, _mm256_loadu_ps(tc), a0);
      a1 = _mm256_fmadd_ps(xc, _mm256_loadu_ps(tc + 8), a1);
      a2 = _mm256_fmadd_ps(xc, _mm256_loadu_ps(tc + 16), a2);
      a3 = _mm256_fmadd_ps(xc, _mm256_loadu_ps(tc + 24), a3);
    }
    _mm256_storeu_ps(s + j0, a0);
    _mm256_storeu_ps(s + j0 + 8, a1);
    _mm256_storeu_ps(s + j0 + 16, a2);
    _mm256_storeu_ps(s + j0 + 24, a3);
  }
  for (; j0 + 8 <= width; j0 += 8) {
    V a = _mm256_setzero_ps();
    for (int64_t c = 0; c < d; ++c) a = _mm256_fmadd_ps(splat(x[c]), _mm256_loadu_ps(t + c * width + j0), a);
    _mm256_storeu_ps(s + j0, a);
  }
}

void add_weighted_rows_f32(const float* a, const float* rows, int64_t n, int64_t d, float* y) {
  int64_t c0 = 0;
  for (; c0 + 32 <= d; c0 += 32) {
    V y0 = _mm256_loadu_ps(y + c0), y1 = _mm256_loadu_ps(y + c0 + 8), y2 = _mm256_loadu_ps(y + c0 + 16),
      y3 = _mm256_loadu_ps(y + c0 + 24);
    for (int64_t j = 0; j < n; ++j) {
      const V aj = splat(a[j]);
      const float* r = rows + j * d + c0;
      y0 = _mm256_fmadd_ps(aj, _mm256_loadu_ps(r), y0);
      y1 = _mm256_fmadd_ps(aj, _mm256_loadu_ps(r + 8), y1);
      y2 = _mm256_fmadd_ps(aj, _mm256_loadu_ps(r + 16), y2);
      y3 = _mm256_fmadd_ps(aj, _mm256_loadu_ps(r + 24), y3);
    }
    _mm256_storeu_ps(y + c0, y0);
    _mm256_storeu_ps(y + c0 + 8, y1);
    _mm256_storeu_ps(y + c0 + 16, y2);
    _mm256_storeu_ps(y + c0 + 24, y3);
  }
  for (; c0 + 8 <= d; c0 += 8) {
    V yc = _mm256_loadu_ps(y + c0);
    for (int64_t j = 0; j < n; ++j) yc = _mm256_fmadd_ps(splat(a[j]), _mm256_loadu_ps(rows + j * d + c0), yc);
    _mm256_storeu_ps(y + c0, yc);
  }
  for (int64_t c = c0; c < d; ++c) {
    float v = y[c];
    for (int64_t j = 0; j < n; ++j) v = __builtin_fmaf(a[j], rows[j * d + c], v);
    y[c] = v;
  }
}

}  // namespace cumulus::kernels::vec
#endif
