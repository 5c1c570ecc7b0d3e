// kernels/cpu/vec_math.h's functions for AVX2 and FMA, the only file compiled with -mavx2 -mfma
// (CMakeLists.txt); called only after vec::available() found both on this CPU. Compiled with
// -ffp-contract=off, so the arithmetic around SLEEF's functions rounds as the scalar rules' does.
#include "kernels/cpu/vec_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#include <sleef.h>

// For the constants only: an inline function of it called here would be compiled for AVX2, and
// that copy could be the one the linker keeps for the whole library.
#include "kernels/cpu/binary_vec_rows.h"
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

// 1 + e^-v, the denominator of sigmoid and silu: the bits of 1 + exp_any(-v), where exp_any
// (vec512's, with scalef) is e^x = p 2^n over the whole float range, x clamped to [-104, 88.73],
// in fewer instructions. The clamp's low end moves to -86, so that n >= -124 and p / 2 (p in
// [0.70, 1.42], halved exactly) times 2^n is a normal float: it is built by adding n to the exponent
// field, then doubled, one rounding of p 2^n as before (inf where that overflows: n = 128 with
// p >= 1). Below -86 e^x is under 2^-124 either way, far below 2^-24, so 1 + e^x is 1 both ways.
// NaN stays the same NaN (max and min return their second operand when either is NaN; n's
// conversion gives 0x80000000, whose shift adds 0 to the field). tests/test_pointwise.cpp
// compares these rows with vec512's bits; every one of the 2^32 inputs was compared with the
// two-factor code when it changed.
V one_plus_exp_minus(V v) {
  V n;
  const V p = exp_mantissa(_mm256_min_ps(splat(88.73f), _mm256_max_ps(splat(-86.0f), sub(_mm256_setzero_ps(), v))), n);
  const __m256i field = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
  const V half = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(mul(p, splat(0.5f))), field));
  return add(splat(1.0f), mul(half, splat(2.0f)));
}

// erf(z) from the table of Note [Vector erf] (vec_math.h); vec512's erf_of is the same steps.
V erf_of(V z) {
  const V sign = _mm256_and_ps(z, splat(-0.0f));
  const V t = _mm256_min_ps(splat(4.0f), _mm256_andnot_ps(splat(-0.0f), z));  // NaN stays
  const __m256i i = _mm256_min_epi32(_mm256_cvttps_epi32(mul(t, splat(2.0f))), _mm256_set1_epi32(7));
  const V u = sub(t, mul(_mm256_cvtepi32_ps(i), splat(0.5f)));
  V p = _mm256_permutevar8x32_ps(_mm256_loadu_ps(kErfPoly[7]), i);
  for (int k = 6; k >= 0; --k) p = _mm256_fmadd_ps(p, u, _mm256_permutevar8x32_ps(_mm256_loadu_ps(kErfPoly[k]), i));
  return _mm256_or_ps(_mm256_min_ps(splat(1.0f), p), sign);
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

// BinaryRows' lanes: 8 floats.
struct BinaryLanes {
  using V = __m256;
  static constexpr int64_t kWidth = 8;
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V splat(float v) { return _mm256_set1_ps(v); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
};

}  // namespace

void binary_f32(int op, const float* a, int64_t a_step, const float* b, int64_t b_step, float* y, int64_t n) {
  BinaryRows<BinaryLanes>::run(op, a, a_step, b, b_step, y, n);
}

void column_sums_f32(const float* x, int64_t rows, int64_t ld, float* out, int64_t n) {
  BinaryRows<BinaryLanes>::column_sums(x, rows, ld, out, n);
}

void relu_f32(const float* x, float* y, int64_t n) {
  map1(x, y, n, [](V v) { return _mm256_andnot_ps(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LE_OQ), v); });
}

void relu_grad_f32(const float* y, const float* dy, float* g, int64_t n) {
  map2(y, dy, g, n, [](V v, V d) { return _mm256_andnot_ps(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LE_OQ), d); });
}

void tanh_f32(const float* x, float* y, int64_t n) {
  map1(x, y, n, [](V v) { return Sleef_tanhf8_u10avx2(v); });
}

void sigmoid_f32(const float* x, float* y, int64_t n) {
  map1(x, y, n, [](V v) { return _mm256_div_ps(splat(1.0f), one_plus_exp_minus(v)); });
}

// silu_f32: the scalar rule's x / (1 + exp(-x)) with the vector exp; silu_grad_f32: its
// derivative s (1 + x (1 - s)), s = 1 / (1 + exp(-x)), recomputed from x.
void silu_f32(const float* x, float* y, int64_t n) {
  map1(x, y, n, [](V v) { return _mm256_div_ps(v, one_plus_exp_minus(v)); });
}

void silu_grad_f32(const float* x, const float* dy, float* g, int64_t n) {
  map2(x, dy, g, n, [](V v, V d) {
    const V s = _mm256_div_ps(splat(1.0f), one_plus_exp_minus(v));
    return mul(d, mul(s, add(splat(1.0f), mul(v, sub(splat(1.0f), s)))));
  });
}

void gelu_f32(const float* x, float* y, int64_t n) {
  map1(x, y, n, [](V v) { return mul(mul(splat(0.5f), v), add(splat(1.0f), erf_of(mul(v, splat(kSqrt1_2))))); });
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
    const V cdf = mul(splat(0.5f), add(splat(1.0f), erf_of(mul(v, splat(kSqrt1_2)))));
    const V pdf = mul(splat(kInvSqrt2Pi), exp_nonpositive(mul(mul(splat(-0.5f), v), v)));
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

namespace {

// The first k lanes of 8 as a maskload/maskstore mask, k in [0, 8].
__m256i lane_mask(int64_t k) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(k)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// The first k of 8 floats at p (k >= 8: all of them), the rest zero, and their store. A masked store
// (vmaskmovps) is slow on AMD's Zen cores, so whole vectors take plain loads and stores: the same
// values (the AVX2 attention tiles took 3.0x vec512's share of the small GPT's step, 1.5x after).
V load_first(const float* p, int64_t k) { return k >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lane_mask(k)); }
void store_first(float* p, int64_t k, V v) {
  if (k >= 8) _mm256_storeu_ps(p, v);
  else _mm256_maskstore_ps(p, lane_mask(k), v);
}

// r[i][j] becomes r[j][i]: an 8 x 8 block in registers transposed.
void transpose8(V (&r)[8]) {
  V t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// The terms x (w null) or x w of 8 floats under the mask `in` (zeros past it).
V term_at(const float* x, const float* w, int64_t i, __m256i in) {
  const V v = _mm256_maskload_ps(x + i, in);
  return w != nullptr ? mul(v, _mm256_maskload_ps(w + i, in)) : v;
}

// Adds the 8 floats of t to the double sums (lo: lanes 0-3, hi: 4-7).
void add_to(__m256d& lo, __m256d& hi, V t) {
  lo = _mm256_add_pd(lo, low_pd(t));
  hi = _mm256_add_pd(hi, high_pd(t));
}

// 8 * G rows of ordered_row_sums_f32 from row r: group g's lanes hold rows r + 8 g ..., each
// lane's sum taking its row's terms in order (a block of 8 columns transposed, then column by
// column); G groups so that G * 2 chains of adds overlap their latency.
template <int G>
void row_sums_group(const float* x, const float* w, int64_t r, int64_t n, float* out) {
  __m256d lo[G], hi[G];
  for (int g = 0; g < G; ++g) lo[g] = hi[g] = _mm256_setzero_pd();
  for (int64_t j = 0; j < n; j += 8) {
    const int64_t width = n - j < 8 ? n - j : 8;
    const __m256i in = lane_mask(width);
    for (int g = 0; g < G; ++g) {
      V t[8];
      for (int k = 0; k < 8; ++k) {
        const int64_t row = (r + 8 * g + k) * n;
        t[k] = term_at(x + row, w != nullptr ? w + row : nullptr, j, in);
      }
      transpose8(t);
      for (int64_t c = 0; c < width; ++c) add_to(lo[g], hi[g], t[c]);
    }
  }
  for (int g = 0; g < G; ++g)
    _mm256_storeu_ps(out + r + 8 * g, _mm256_set_m128(_mm256_cvtpd_ps(hi[g]), _mm256_cvtpd_ps(lo[g])));
}

// vec512's micro (vec_math_avx512.cpp), 8 lanes: one MR x (8 NV) block of c, the accumulators in
// registers over the whole k loop (MR * NV + NV + 1 of the 16). The last vector of a row is masked
// to `last` unless kFull.
template <int MR, int NV, bool kFull>
void micro(int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b, int64_t ldb, float* c, int64_t ldc,
           bool accumulate, __m256i last) {
  const auto load = [&](const float* p, int v) {
    return kFull || v < NV - 1 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, last);
  };
  V acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 3
    for (int v = 0; v < NV; ++v) acc[r][v] = accumulate ? load(c + r * ldc + 8 * v, v) : _mm256_setzero_ps();
  for (int64_t l = 0; l < k; ++l) {
    V bv[NV];
    const float* bl = b + l * ldb;
#pragma GCC unroll 3
    for (int v = 0; v < NV; ++v) bv[v] = load(bl + 8 * v, v);
    const float* al = a + l * a_cs;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const V ar = _mm256_broadcast_ss(al + r * a_rs);
#pragma GCC unroll 3
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(ar, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 3
    for (int v = 0; v < NV; ++v) {
      if (kFull || v < NV - 1) _mm256_storeu_ps(c + r * ldc + 8 * v, acc[r][v]);
      else _mm256_maskstore_ps(c + r * ldc + 8 * v, last, acc[r][v]);
    }
}

// Row blocks of 8, 6 or 4 rows for one, two or three vectors a row; a remainder of rows takes the
// block of its own height.
template <int NV, bool kFull>
void rows(int64_t m, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b, int64_t ldb, float* c,
          int64_t ldc, bool accumulate, __m256i last) {
  constexpr int kMR = NV == 1 ? 8 : NV == 2 ? 6 : 4;
  int64_t i = 0;
  for (; i + kMR <= m; i += kMR)
    micro<kMR, NV, kFull>(k, a + i * a_rs, a_rs, a_cs, b, ldb, c + i * ldc, ldc, accumulate, last);
  const float* ai = a + i * a_rs;
  float* ci = c + i * ldc;
  switch (m - i) {
    case 0: break;
    case 1: micro<1, NV, kFull>(k, ai, a_rs, a_cs, b, ldb, ci, ldc, accumulate, last); break;
    case 2: micro<2, NV, kFull>(k, ai, a_rs, a_cs, b, ldb, ci, ldc, accumulate, last); break;
    case 3: micro<3, NV, kFull>(k, ai, a_rs, a_cs, b, ldb, ci, ldc, accumulate, last); break;
    case 4: micro<4, NV, kFull>(k, ai, a_rs, a_cs, b, ldb, ci, ldc, accumulate, last); break;
    case 5: micro<5, NV, kFull>(k, ai, a_rs, a_cs, b, ldb, ci, ldc, accumulate, last); break;
    case 6: micro<6, NV, kFull>(k, ai, a_rs, a_cs, b, ldb, ci, ldc, accumulate, last); break;
    default: micro<7, NV, kFull>(k, ai, a_rs, a_cs, b, ldb, ci, ldc, accumulate, last); break;
  }
}

template <bool kFull>
void panel(int64_t nv, int64_t m, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b, int64_t ldb,
           float* c, int64_t ldc, bool accumulate, __m256i last) {
  switch (nv) {
    case 1: rows<1, kFull>(m, k, a, a_rs, a_cs, b, ldb, c, ldc, accumulate, last); break;
    case 2: rows<2, kFull>(m, k, a, a_rs, a_cs, b, ldb, c, ldc, accumulate, last); break;
    default: rows<3, kFull>(m, k, a, a_rs, a_cs, b, ldb, c, ldc, accumulate, last); break;
  }
}

float max_of_vector(V v) {
  alignas(32) float e[8];
  _mm256_store_ps(e, v);
  float r = e[0];
  for (int i = 1; i < 8; ++i) r = fmaxf(r, e[i]);
  return r;
}

float sum_of_vector(V v) {
  alignas(32) float e[8];
  _mm256_store_ps(e, v);
  return ((e[0] + e[1]) + (e[2] + e[3])) + ((e[4] + e[5]) + (e[6] + e[7]));
}

}  // namespace

void gemm_f32(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b, int64_t ldb,
              float* c, int64_t ldc, bool accumulate) {
  for (int64_t j0 = 0; j0 < n; j0 += 24) {
    const int64_t w = n - j0 < 24 ? n - j0 : 24, nv = (w + 7) / 8, tail = w - 8 * (nv - 1);
    if (tail == 8) panel<true>(nv, m, k, a, a_rs, a_cs, b + j0, ldb, c + j0, ldc, accumulate, _mm256_setzero_si256());
    else panel<false>(nv, m, k, a, a_rs, a_cs, b + j0, ldb, c + j0, ldc, accumulate, lane_mask(tail));
  }
}

// As vec512's: each row's maximum over its valid keys, the exponentials (zero past them, and past
// width nothing is written), the rescale of the row's sum and accumulator when the maximum rises.
void attention_softmax_tile_f32(float* s, int64_t lds, int64_t rows, const int64_t* valid, int64_t width, float scale,
                                float* m, double* sums, float* acc, int64_t d) {
  const V sc = splat(scale);
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * lds;
    const int64_t n = valid[r] < width ? valid[r] : width;
    if (n <= 0) {
      std::fill(sr, sr + width, 0.0f);
      continue;
    }
    V mx = splat(-INFINITY);
    for (int64_t j = 0; j < n; j += 8) {  // as vec512's max(m, x): a NaN score wins; lanes past n keep m
      const V raised = _mm256_max_ps(mx, mul(load_first(sr + j, n - j), sc));
      mx = n - j >= 8 ? raised : _mm256_blendv_ps(mx, raised, _mm256_castsi256_ps(lane_mask(n - j)));
    }
    const float tile_max = max_of_vector(mx);
    const float m_new = m[r] > tile_max ? m[r] : tile_max;
    const V mv = splat(m_new);
    V sum = _mm256_setzero_ps();
    for (int64_t j = 0; j < width; j += 8) {
      const V e = _mm256_and_ps(exp_nonpositive(sub(mul(load_first(sr + j, width - j), sc), mv)),
                                _mm256_castsi256_ps(lane_mask(n - j)));
      sum = add(sum, e);
      store_first(sr + j, width - j, e);
    }
    if (m_new != m[r]) {
      // The first tile finds m = -inf: alpha 0 (acc and the sum are still 0).
      const float alpha = std::exp(m[r] - m_new);
      sums[r] *= alpha;
      float* ar = acc + r * d;
      for (int64_t c = 0; c < d; c += 8) store_first(ar + c, d - c, mul(load_first(ar + c, d - c), splat(alpha)));
    }
    sums[r] += static_cast<double>(sum_of_vector(sum));
    m[r] = m_new;
  }
}

void attention_grad_tile_f32(float* s, float* dp, int64_t ld, int64_t rows, const int64_t* valid, int64_t width,
                             float scale, const float* lse, const float* delta) {
  const V sc = splat(scale);
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * ld;
    float* dr = dp + r * ld;
    const V l = splat(lse[r]), dl = splat(delta[r]);
    for (int64_t j = 0; j < width; j += 8) {
      const V p = _mm256_and_ps(exp_nonpositive(sub(mul(load_first(sr + j, width - j), sc), l)),
                                _mm256_castsi256_ps(lane_mask(valid[r] - j)));
      const V ds = mul(mul(p, sub(load_first(dr + j, width - j), dl)), sc);
      store_first(sr + j, width - j, p);
      store_first(dr + j, width - j, ds);
    }
  }
}

// Eight rows of eight at once through registers (unpack, shuffle, swap halves): the strided loads
// of a column-by-column copy miss a cache line per element where a head's rows lie far apart.
// Each strip of 8 rows first asks for the next strip's lines: in a training step attention's keys
// and values come from far caches, and a strip's loads stalled on them (the small GPT's step: the
// transposes 1.5% of its samples, 1.1% with the prefetches; prefetching a whole head ahead did not
// help). A prefetch changes no value.
void transpose_f32(const float* src, int64_t src_ld, int64_t rows, int64_t cols, float* dst, int64_t dst_ld) {
  int64_t r0 = 0;
  for (; r0 + 8 <= rows; r0 += 8) {
    for (int64_t i = r0 + 8, end = rows < r0 + 16 ? rows : r0 + 16; i < end; ++i)
      for (int64_t c = 0; c < cols; c += 16)
        _mm_prefetch(reinterpret_cast<const char*>(src + i * src_ld + c), _MM_HINT_T0);
    int64_t c0 = 0;
    for (; c0 + 8 <= cols; c0 += 8) {
      V r[8];
      for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + (r0 + i) * src_ld + c0);
      transpose8(r);
      for (int i = 0; i < 8; ++i) _mm256_storeu_ps(dst + (c0 + i) * dst_ld + r0, r[i]);
    }
    for (; c0 < cols; ++c0)
      for (int64_t i = r0; i < r0 + 8; ++i) dst[c0 * dst_ld + i] = src[i * src_ld + c0];
  }
  for (; r0 < rows; ++r0)
    for (int64_t c = 0; c < cols; ++c) dst[c * dst_ld + r0] = src[r0 * src_ld + c];
}

// Strided rows (attention's saved output, in the step's far caches) are asked for kAhead rows before
// their turn, as transpose_f32's strips: a prefetch changes no value.
void row_dots_f64(const float* a, int64_t a_ld, const float* b, int64_t b_ld, int64_t rows, int64_t n, float* out) {
  constexpr int64_t kAhead = 4;
  for (int64_t r = 0; r < rows; ++r) {
    const float* ar = a + r * a_ld;
    const float* br = b + r * b_ld;
    if (r + kAhead < rows)
      for (int64_t c = 0; c < n; c += 16) {
        _mm_prefetch(reinterpret_cast<const char*>(ar + kAhead * a_ld + c), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(br + kAhead * b_ld + c), _MM_HINT_T0);
      }
    __m256d sum[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()};
    for (int64_t c = 0; c < n; c += 8) {
      const __m256i in = lane_mask(n - c);
      const V x = _mm256_maskload_ps(ar + c, in), y = _mm256_maskload_ps(br + c, in);
      sum[0] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x)), _mm256_cvtps_pd(_mm256_castps256_ps128(y)),
                               sum[0]);
      sum[1] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)),
                               _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1)), sum[1]);
    }
    const __m256d s = _mm256_add_pd(sum[0], sum[1]);
    const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    out[r] = static_cast<float>(_mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h))));
  }
}

void ordered_row_sums_f32(const float* x, const float* w, int64_t rows, int64_t n, float* out) {
  int64_t r = 0;
  for (; r + 16 <= rows; r += 16) row_sums_group<2>(x, w, r, n, out);
  for (; r + 8 <= rows; r += 8) row_sums_group<1>(x, w, r, n, out);
  for (; r < rows; ++r) {
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) sum += w != nullptr ? x[r * n + j] * w[r * n + j] : x[r * n + j];
    out[r] = static_cast<float>(sum);
  }
}

// 32 columns at a time, their 8 chains of double adds (4 lanes each) in registers down the rows.
void ordered_column_sums_f32(const float* x, const float* w, int64_t rows, int64_t n, int64_t ld, float* out) {
  constexpr int kVectors = 4;
  for (int64_t c = 0; c < n; c += 8 * kVectors) {
    __m256i in[kVectors];
    __m256d lo[kVectors], hi[kVectors];
    for (int v = 0; v < kVectors; ++v) {
      in[v] = lane_mask(n - c - 8 * v);
      lo[v] = hi[v] = _mm256_setzero_pd();
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * ld;
      const float* wr = w != nullptr ? w + r * ld : nullptr;
      for (int v = 0; v < kVectors; ++v) add_to(lo[v], hi[v], term_at(xr, wr, c + 8 * v, in[v]));
    }
    for (int v = 0; v < kVectors; ++v)
      _mm256_maskstore_ps(out + c + 8 * v, in[v], _mm256_set_m128(_mm256_cvtpd_ps(hi[v]), _mm256_cvtpd_ps(lo[v])));
  }
}

// The maximum with the tail under a mask (-inf past it) rather than max_of's scalar tail (no lane
// holds a NaN: max_ps returns its second operand, the maximum so far, for one), and the terms
// exp(x - m) from exp_nonpositive (x - m <= 0), zero past the tail, in double lanes: even and odd
// vectors in their own sums, so the adds' latency overlaps (a row is a few vectors).
void cross_entropy_row_stats_f32(const float* x, int64_t n, float* max_out, float* log_sum_out) {
  V mx = splat(-INFINITY);
  for_each_vector(n, [&](int64_t i, const Lanes& in) {
    const V v = in.load(x + i);
    mx = _mm256_max_ps(in.tail ? _mm256_blendv_ps(splat(-INFINITY), v, _mm256_castsi256_ps(in.mask)) : v, mx);
  });
  mx = _mm256_max_ps(mx, _mm256_permute2f128_ps(mx, mx, 1));
  mx = _mm256_max_ps(mx, _mm256_permute_ps(mx, 0x4E));
  mx = _mm256_max_ps(mx, _mm256_permute_ps(mx, 0xB1));
  const float m = _mm256_cvtss_f32(mx);
  const V mv = splat(m);
  const auto term = [&](int64_t i, const Lanes& in) { return in.keep(exp_nonpositive(sub(in.load(x + i), mv))); };
  const Lanes all{false, _mm256_setzero_si256()};
  DoubleSum even, odd;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const V e0 = term(i, all), e1 = term(i + 8, all);
    even.add(low_pd(e0), high_pd(e0));
    odd.add(low_pd(e1), high_pd(e1));
  }
  for (; i < n; i += 8) {
    const V e = term(i, n - i >= 8 ? all : tail_lanes(n - i));
    even.add(low_pd(e), high_pd(e));
  }
  *max_out = m;
  *log_sum_out = static_cast<float>(std::log(even.total() + odd.total()));
}

void cross_entropy_grad_row_f32(const float* x, int64_t n, int64_t label, float m, float log_sum, float g, float beta,
                                float* dx) {
  const V mv = splat(m), lv = splat(log_sum), gv = splat(g), bv = splat(beta), one = splat(1.0f);
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), y = _mm256_set1_epi32(static_cast<int>(label));
  for_each_vector(n, [&](int64_t i, const Lanes& in) {
    const V e = exp_nonpositive(sub(sub(in.load(x + i), mv), lv));  // (x - m) - log_sum <= 0
    const __m256i at = _mm256_add_epi32(iota, _mm256_set1_epi32(static_cast<int>(i)));
    const V hit = _mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(at, y)), one);
    V v = mul(gv, sub(e, hit));
    if (beta != 0.0f) v = add(v, mul(bv, in.load(dx + i)));
    in.store(dx + i, v);
  });
}

}  // namespace cumulus::kernels::vec
#endif
