// kernels/cpu/vec_math.h's functions for AVX2 and FMA, the only file compiled with -mavx2 -mfma
// (CMakeLists.txt); called only after vec::available() found both on this CPU. Compiled with
// -ffp-contract=off, so the arithmetic around SLEEF's functions rounds as the scalar rules' does.
#include "kernels/cpu/vec_math.h"

#include <cstdint>

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

// e^r's polynomial for x = n ln 2 + r, |r| <= ln 2 / 2 (Cephes' expf: ln 2 in two parts, degree 7);
// the caller scales by 2^n.
V exp_mantissa(V xc, V& n) {
  n = _mm256_round_ps(mul(xc, splat(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  V r = _mm256_fnmadd_ps(n, splat(0.693359375f), xc);
  r = _mm256_fnmadd_ps(n, splat(-2.12194440e-4f), r);
  static constexpr float kPoly[] = {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f,
                                    5.0000001201e-1f};
  V p = splat(1.9875691500e-4f);
  for (float c : kPoly) p = _mm256_fmadd_ps(p, r, splat(c));
  return _mm256_fmadd_ps(p, mul(r, r), add(r, splat(1.0f)));
}

// e^x for x <= 0 (a softmax row's x less its maximum, a log-probability) within 1.3 ulp
// (exp_mantissa, then times 2^n: n is at most 0, so one factor does and nothing overflows), in
// about half the instructions of SLEEF's expf8_u10. Results below FLT_MIN (x < -87.34) are 0 rather
// than subnormal, NaN stays NaN (max returns its second operand when either is NaN, and the
// comparison below is false for it).
V exp_nonpositive(V x) {
  V n;
  const V p = exp_mantissa(_mm256_max_ps(splat(-87.34f), x), n);
  const V y = mul(p, pow2(_mm256_cvtps_epi32(n)));
  return _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, splat(-87.33654f), _CMP_LT_OQ));
}

// GELU-tanh as x s and its derivative from s = 1 / (1 + e), e = e^z, z = -2u (vec512's form, 8
// lanes): e as 2^z2, z2 = z log2 e, with log2 e folded into the cubic's constants, so the exponent's
// reduction is one exact subtraction, and a degree-5 polynomial for 2^f (the AVX-512 one). z2 is
// clamped to [-126, 115.4]: below, e is 0 (as exp_nonpositive's flush); above (z past 80), e stays finite
// and s is set to 0, so x s is -0 for a finite x and NaN for -inf, as 1 / (1 + inf) gave. A
// division for s: the reciprocal estimate with a Newton step would save about 15% but doubles the
// error (2 ulp to 3).
constexpr float kLog2E = 1.44269504088896341f, kGeluZ2Max = 115.4156f;  // 80 log2 e
constexpr float kGeluZ1 = -2.0f * kSqrt2OverPi, kGeluZ3 = -2.0f * kSqrt2OverPi * kGeluTanhCubic;
V gelu_tanh_z2(V x) { return mul(x, _mm256_fmadd_ps(splat(kGeluZ3 * kLog2E), mul(x, x), splat(kGeluZ1 * kLog2E))); }
V sigmoid_of_minus(V z2, V& e) {
  const V zc = _mm256_min_ps(splat(kGeluZ2Max), _mm256_max_ps(splat(-126.0f), z2));
  const V n = _mm256_round_ps(zc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), f = sub(zc, n);
  static constexpr float kPoly[] = {5.550713092088699e-2f, 2.4022120237350464e-1f, 6.931469440460205e-1f,
                                    1.0000001192092896f};
  V p = _mm256_fmadd_ps(splat(1.3276472454890609e-3f), f, splat(9.675540961325169e-3f));
  for (float c : kPoly) p = _mm256_fmadd_ps(p, f, splat(c));
  e = _mm256_blendv_ps(mul(p, pow2(_mm256_cvtps_epi32(n))), _mm256_setzero_ps(),
                       _mm256_cmp_ps(z2, splat(-126.0f), _CMP_LT_OQ));
  const V s = _mm256_div_ps(splat(1.0f), add(splat(1.0f), e));
  return _mm256_blendv_ps(s, _mm256_setzero_ps(), _mm256_cmp_ps(z2, splat(kGeluZ2Max), _CMP_GT_OQ));
}

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
// and no cancellation in 1 + tanh(u) where u is very negative (sigmoid_of_minus).
void gelu_tanh_f32(const float* x, float* y, int64_t n) {
  map1(x, y, n, [](V v) {
    V e;
    return mul(v, sigmoid_of_minus(gelu_tanh_z2(v), e));
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

// d/dx x s(2u) = s + x 2 u' s (1 - s), s = 1 / (1 + e), e = exp(-2u), with s (1 - s) = e s s (no
// cancellation where s is near 1): one exp, recomputed from x rather than saved by the forward (a
// saved s would cost a write and a read of n floats, more than the exp). Where z is past the clamp,
// s is 0 and so is e s s.
void gelu_tanh_grad_f32(const float* x, const float* dy, float* g, int64_t n) {
  map2(x, dy, g, n, [](V v, V d) {
    V e;
    const V s = sigmoid_of_minus(gelu_tanh_z2(v), e);
    const V ess = mul(mul(e, s), s);
    const V minus_dz = _mm256_fmadd_ps(splat(-3.0f * kGeluZ3), mul(v, v), splat(-kGeluZ1));
    return mul(d, _mm256_fmadd_ps(mul(v, ess), minus_dz, s));
  });
}

namespace {

// Which lanes of a row's 8 floats at i a pass touches: all of them (a whole vector: plain loads and
// stores), or the tail's under a mask (masked loads give zeros past it; masked stores leave it).
// for_each_vector below hands the whole vectors a Lanes whose `tail` is a constant false, so the
// compiler drops the masked forms from the main loop.
struct Lanes {
  bool tail;
  __m256i mask;
  V load(const float* p) const { return tail ? _mm256_maskload_ps(p, mask) : _mm256_loadu_ps(p); }
  void store(float* p, V v) const {
    if (tail) _mm256_maskstore_ps(p, mask, v);
    else _mm256_storeu_ps(p, v);
  }
  V keep(V v) const { return tail ? _mm256_and_ps(v, _mm256_castsi256_ps(mask)) : v; }  // zeros past the tail
};
Lanes tail_lanes(int64_t k) {  // the first k of 8, k in [1, 8)
  return Lanes{true,
               _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(k)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))};
}

// f(i, lanes) for each vector [i, i + 8) of a row of n: the whole ones, then the tail.
template <typename F>
void for_each_vector(int64_t n, F f) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) f(i, Lanes{false, _mm256_setzero_si256()});
  if (i < n) f(i, tail_lanes(n - i));
}

// Note [Blocked float sums] (vec_math_avx512.cpp), 8 lanes a vector: the K sums over a row of n
// that term(acc, i, lanes) adds into acc[0..K) (zero past the row's end), in float over blocks of
// kSumBlock vectors, even and odd vectors in their own accumulators, the blocks in double.
constexpr int64_t kSumBlock = 8;
template <int K, typename Term>
void blocked_sums(int64_t n, double (&out)[K], Term term) {
  DoubleSum sum[K];
  for (int64_t b = 0; b < n; b += 8 * kSumBlock) {
    V even[K], odd[K];
    for (int k = 0; k < K; ++k) even[k] = odd[k] = _mm256_setzero_ps();
    const int64_t end = n - b < 8 * kSumBlock ? n : b + 8 * kSumBlock;
    int64_t i = b;
    for (; i + 16 <= end; i += 16) {
      term(even, i, Lanes{false, _mm256_setzero_si256()});
      term(odd, i + 8, Lanes{false, _mm256_setzero_si256()});
    }
    if (i + 8 <= end) {
      term(even, i, Lanes{false, _mm256_setzero_si256()});
      i += 8;
    }
    if (i < end) term(odd, i, tail_lanes(end - i));
    for (int k = 0; k < K; ++k) {
      const V block = add(even[k], odd[k]);
      sum[k].add(low_pd(block), high_pd(block));
    }
  }
  for (int k = 0; k < K; ++k) out[k] = sum[k].total();
}

// Note [Prefetching the next row] (vec_math_avx512.cpp).
constexpr int64_t kPrefetchRow = 4096;
void prefetch_next_row(const float* row, int64_t n, int64_t i, bool write) {
  const auto line = reinterpret_cast<std::uintptr_t>(row + i) + static_cast<std::uintptr_t>(n) * sizeof(float);
  if (write) __builtin_prefetch(reinterpret_cast<const void*>(line), 1, 3);
  else __builtin_prefetch(reinterpret_cast<const void*>(line), 0, 3);
}

}  // namespace

// As vec512::softmax_row_f32, 8 lanes at a time.
void softmax_row_f32(bool log, const float* x, float* y, int64_t n) {
  const V m = splat(max_of(x, n));
  const bool ahead = n <= kPrefetchRow;
  double sum[1];
  blocked_sums<1>(n, sum, [&](V(&acc)[1], int64_t i, const Lanes& in) {
    if (ahead && i % 16 == 0) {  // one line of each operand a 16 floats
      prefetch_next_row(x, n, i, false);
      prefetch_next_row(y, n, i, true);
    }
    const V e = in.keep(exp_nonpositive(sub(in.load(x + i), m)));  // x - max <= 0
    acc[0] = add(acc[0], e);
    if (!log) in.store(y + i, e);
  });
  if (log) {
    const V log_s = splat(static_cast<float>(::log(sum[0])));
    for_each_vector(n, [&](int64_t i, const Lanes& in) { in.store(y + i, sub(sub(in.load(x + i), m), log_s)); });
  } else {
    const V inv = splat(static_cast<float>(1.0 / sum[0]));
    for_each_vector(n, [&](int64_t i, const Lanes& in) { in.store(y + i, mul(in.load(y + i), inv)); });
  }
}

void softmax_grad_row_f32(bool log, const float* y, const float* dy, float beta, float* dx, int64_t n) {
  double sum[1];  // log_softmax: sum(dy); softmax: sum(dy y)
  if (log)
    blocked_sums<1>(n, sum, [&](V(&acc)[1], int64_t i, const Lanes& in) { acc[0] = add(acc[0], in.load(dy + i)); });
  else
    blocked_sums<1>(n, sum, [&](V(&acc)[1], int64_t i, const Lanes& in) {
      acc[0] = _mm256_fmadd_ps(in.load(dy + i), in.load(y + i), acc[0]);
    });
  const V s = splat(static_cast<float>(sum[0])), b = splat(beta);
  const bool ahead = n <= kPrefetchRow;
  for_each_vector(n, [&](int64_t i, const Lanes& in) {
    if (ahead && i % 16 == 0) {
      prefetch_next_row(y, n, i, false);
      prefetch_next_row(dy, n, i, false);
      prefetch_next_row(dx, n, i, true);
    }
    const V yv = in.load(y + i), g = in.load(dy + i);
    V v = log ? sub(g, mul(exp_nonpositive(yv), s)) : mul(yv, sub(g, s));  // log_softmax's y <= 0
    if (beta != 0.0f) v = add(v, mul(b, in.load(dx + i)));
    in.store(dx + i, v);
  });
}

// As vec512::layer_norm_row_f32 (Note [Layer norm's row in one pass and a float output] there).
void layer_norm_row_f32(const float* x, const float* weight, const float* bias, int64_t n, float eps, float* y,
                        float* mean, float* rstd) {
  const double k = n > 0 ? x[0] : 0.0;
  const __m256d kd = _mm256_set1_pd(k);
  DoubleSum s, q;
  for_each_vector(n, [&](int64_t i, const Lanes& in) {
    const V v = in.load(x + i);
    __m256d a = _mm256_sub_pd(low_pd(v), kd), b = _mm256_sub_pd(high_pd(v), kd);
    if (in.tail) {  // zeros past the row's end
      const V kept = in.keep(splat(1.0f));
      a = _mm256_mul_pd(a, low_pd(kept));
      b = _mm256_mul_pd(b, high_pd(kept));
    }
    s.add(a, b);
    q.add(_mm256_mul_pd(a, a), _mm256_mul_pd(b, b));
  });
  const double d = s.total() / static_cast<double>(n), sq = q.total() / static_cast<double>(n);
  const double m = k + d, var = sq - d * d > 0.0 ? sq - d * d : 0.0;
  const double inv = 1.0 / sqrt(var + eps);
  *mean = static_cast<float>(m);
  *rstd = static_cast<float>(inv);
  const auto m_hi = static_cast<float>(m);
  const V mh = splat(m_hi), ml = splat(static_cast<float>(m - m_hi)), iv = splat(static_cast<float>(inv));
  for_each_vector(n, [&](int64_t i, const Lanes& in) {
    V out = mul(sub(sub(in.load(x + i), mh), ml), iv);
    if (weight != nullptr) out = mul(out, in.load(weight + i));
    if (bias != nullptr) out = add(out, in.load(bias + i));
    in.store(y + i, out);
  });
}

// As vec512::layer_norm_grad_row_f32: dx = a g + (b t + c), t = x - mean.
void layer_norm_grad_row_f32(const float* x, const float* dy, const float* weight, float mean, float rstd, int64_t n,
                             float beta, float* dx, float* pw, float* pb) {
  const V mf = splat(mean);
  const auto g_at = [&](int64_t i, const Lanes& in) {
    const V d = in.load(dy + i);
    return weight != nullptr ? mul(d, in.load(weight + i)) : d;
  };
  double sums[2];  // sum(g), sum(g t)
  blocked_sums<2>(n, sums, [&](V(&acc)[2], int64_t i, const Lanes& in) {
    const V g = g_at(i, in);  // zero past n
    acc[0] = add(acc[0], g);
    acc[1] = _mm256_fmadd_ps(g, sub(in.load(x + i), mf), acc[1]);
  });
  const double mean_g = sums[0] / static_cast<double>(n), mean_g_xhat = rstd * sums[1] / static_cast<double>(n);
  const V a = splat(rstd), b = splat(static_cast<float>(-static_cast<double>(rstd) * rstd * mean_g_xhat)),
          c = splat(static_cast<float>(-rstd * mean_g)), inv = splat(rstd), bv = splat(beta);
  const bool ahead = n <= kPrefetchRow;
  for_each_vector(n, [&](int64_t i, const Lanes& in) {
    if (ahead && i % 16 == 0) {
      prefetch_next_row(x, n, i, false);
      prefetch_next_row(dy, n, i, false);
      prefetch_next_row(dx, n, i, true);
    }
    const V g = g_at(i, in), t = sub(in.load(x + i), mf);
    V out = _mm256_fmadd_ps(a, g, _mm256_fmadd_ps(b, t, c));
    if (beta != 0.0f) out = _mm256_fmadd_ps(bv, in.load(dx + i), out);
    in.store(dx + i, out);
    if (pw != nullptr) {  // the parameter sums take dy itself, not g = dy weight
      const V d = weight != nullptr ? in.load(dy + i) : g, xhat = mul(t, inv);
      in.store(pw + i, _mm256_fmadd_ps(d, xhat, in.load(pw + i)));
      in.store(pb + i, add(in.load(pb + i), d));
    }
  });
}

void add_float_sums(float* partial, int64_t n, double* sums) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const V p = _mm256_loadu_ps(partial + i);
    _mm256_storeu_pd(sums + i, _mm256_add_pd(_mm256_loadu_pd(sums + i), low_pd(p)));
    _mm256_storeu_pd(sums + i + 4, _mm256_add_pd(_mm256_loadu_pd(sums + i + 4), high_pd(p)));
    _mm256_storeu_ps(partial + i, _mm256_setzero_ps());
  }
  for (; i < n; ++i) {
    sums[i] += partial[i];
    partial[i] = 0.0f;
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
