// kernels/cpu/vec_math.h's vec512 functions, the only file compiled with -mavx512f -mfma
// (CMakeLists.txt); called only after vec512::available() found both on this CPU. Compiled with
// -ffp-contract=off: every fused multiply-add below is written out.
#include <cmath>
#include <cstdint>

#include "kernels/cpu/vec_math.h"

#if defined(__x86_64__)
#include <immintrin.h>

// GCC 12 warns inside its own AVX-512 headers (the undefined vector that masked intrinsics start
// from), not about this file's code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC diagnostic ignored "-Wuninitialized"

// For the constants only (as in vec_math_avx2.cpp).
#include "kernels/cpu/binary_vec_rows.h"
#include "kernels/pointwise_rules.h"

namespace cumulus::kernels::vec512 {
namespace {

using V = __m512;
V splat(float v) { return _mm512_set1_ps(v); }

// The lanes [0, n) of a vector, n in [0, 16].
__mmask16 lanes(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n < 0 ? 0 : n)) - 1u);
}

// e^x = 2^n e^r: n = round(x / ln 2), r = x - n ln 2 (ln 2 in two parts, Cody and Waite), e^r by
// the polynomial; the caller scales by 2^n.
V exp_mantissa(V x, V& n) {
  n = _mm512_roundscale_ps(_mm512_mul_ps(x, splat(1.44269504088896341f)),
                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  V r = _mm512_fnmadd_ps(n, splat(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, splat(-2.12194440e-4f), r);
  static constexpr float kPoly[] = {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f,
                                    5.0000001201e-1f};
  V p = splat(1.9875691500e-4f);
  for (float c : kPoly) p = _mm512_fmadd_ps(p, r, splat(c));
  return _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, splat(1.0f)));
}

// f(i, in) for each vector [i, i + 16) of a row of n: the whole vectors with every lane on (so the
// masks compile away, and with them the mask's arithmetic each vector), then the tail under its mask.
template <typename F>
void for_each_vector(int64_t n, F f) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) f(i, static_cast<__mmask16>(0xFFFF));
  if (i < n) f(i, lanes(n - i));
}

// y = f(x) (or g = f(x, dy)) over n floats, 16 at a time; a tail goes through f under a mask.
template <typename F>
void map2(const float* x, const float* dy, float* g, int64_t n, F f) {
  for_each_vector(n, [&](int64_t i, __mmask16 in) {
    _mm512_mask_storeu_ps(g + i, in, f(_mm512_maskz_loadu_ps(in, x + i), _mm512_maskz_loadu_ps(in, dy + i)));
  });
}

// 2^z = 2^n 2^f: n = round(z), f = z - n in [-1/2, 1/2] (exact), 2^f by a degree-5 polynomial
// (minimax for the relative error on [-1/2, 1/2]: 7.5e-8 before rounding; degree 4's 2.6e-6 is
// too coarse for GELU's 2 ulp); the caller scales by 2^n.
V exp2_mantissa(V z, V& n) {
  n = _mm512_roundscale_ps(z, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const V f = _mm512_sub_ps(z, n);
  static constexpr float kPoly[] = {5.550713092088699e-2f, 2.4022120237350464e-1f, 6.931469440460205e-1f,
                                    1.0000001192092896f};
  V p = _mm512_fmadd_ps(splat(1.3276472454890609e-3f), f, splat(9.675540961325169e-3f));
  for (float c : kPoly) p = _mm512_fmadd_ps(p, f, splat(c));
  return p;
}

// GELU-tanh as x s and its derivative from s = 1 / (1 + e), e = e^z, z = -2u = x (a + b x^2) (the
// constants of u folded in), with e computed as 2^(z log2 e) (log2 e folded into a and b too: the
// exponent's reduction is then one exact subtraction), and two instructions AVX2 lacks: scalef for
// 2^n, and rcp14's 14-bit estimate of 1/d refined by one Newton step (an error near 2^-28 before
// rounding) instead of a division, whose 16 lanes cost as much as the rest of the function. z is
// clamped to [-110, 80] (in base 2, [-158.7, 115.4]): below, e is exactly 0 (as exp_nonpositive's
// flush); above, e stays finite and s is set to 0, so x s is -0 for a finite x and NaN for -inf,
// as 1 / (1 + inf) gave.
constexpr float kGeluZ1 = -2.0f * kSqrt2OverPi, kGeluZ3 = -2.0f * kSqrt2OverPi * kGeluTanhCubic;
constexpr float kLog2E = 1.44269504088896341f, kGeluZ2Max = 115.4156f;  // 80 log2 e
V gelu_tanh_z2(V x) {
  return _mm512_mul_ps(x, _mm512_fmadd_ps(splat(kGeluZ3 * kLog2E), _mm512_mul_ps(x, x), splat(kGeluZ1 * kLog2E)));
}
V sigmoid_of_minus(V z2, V& e) {
  V n;
  const V p = exp2_mantissa(_mm512_min_ps(splat(kGeluZ2Max), _mm512_max_ps(splat(-158.7f), z2)), n);
  e = _mm512_scalef_ps(p, n);
  const V d = _mm512_add_ps(splat(1.0f), e);
  const V r = _mm512_rcp14_ps(d);
  const V s = _mm512_fmadd_ps(_mm512_fnmadd_ps(d, r, splat(1.0f)), r, r);
  return _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(z2, splat(kGeluZ2Max), _CMP_GT_OQ), _mm512_setzero_ps());
}

// e^x for x <= 0 (an attention score less its row's maximum or log-sum-exp, a softmax row's x less
// its maximum, a log-probability) with vec_math_avx2.cpp's exp_nonpositive's bits (the same
// constants and steps; scalef's one rounding by 2^n is the AVX2 code's exact multiply):
// within 1.3 ulp, 0 below -87.34 (so exp(-inf) = 0), NaN stays NaN. No clamps: scalef needs none,
// and the blend replaces whatever the polynomial made of x below -87.34.
V exp_nonpositive(V x) {
  V n;
  const V p = exp_mantissa(x, n);
  return _mm512_mask_mov_ps(_mm512_scalef_ps(p, n), _mm512_cmp_ps_mask(x, splat(-87.33654f), _CMP_LT_OQ),
                            _mm512_setzero_ps());
}

// e^x over the whole float range (x clamped to [-104, 88.73]): p 2^n, scalef's one rounding;
// vec_math_avx2.cpp's one_plus_exp_minus gives 1 + this with the same bits.
V exp_any(V x) {
  V n;
  const V p = exp_mantissa(_mm512_min_ps(splat(88.73f), _mm512_max_ps(splat(-104.0f), x)), n);
  return _mm512_scalef_ps(p, n);
}

// erf(z) from the table of Note [Vector erf] (vec_math.h): vec_math_avx2.cpp's erf_of, the same
// steps (a table of 8 in the low half of a vector; the index is never above 7).
V erf_of(V z) {
  const V sign = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(z), _mm512_set1_epi32(INT32_MIN)));
  const V t = _mm512_min_ps(splat(4.0f), _mm512_abs_ps(z));  // NaN stays
  const __m512i i = _mm512_min_epi32(_mm512_cvttps_epi32(_mm512_mul_ps(t, splat(2.0f))), _mm512_set1_epi32(7));
  const V u = _mm512_sub_ps(t, _mm512_mul_ps(_mm512_cvtepi32_ps(i), splat(0.5f)));
  const auto coefficient = [&](int k) { return _mm512_permutexvar_ps(i, _mm512_maskz_loadu_ps(0xFF, vec::kErfPoly[k])); };
  V p = coefficient(7);
  for (int k = 6; k >= 0; --k) p = _mm512_fmadd_ps(p, u, coefficient(k));
  const V r = _mm512_min_ps(splat(1.0f), p);
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(r), _mm512_castps_si512(sign)));
}

// One MR x (16 NV) block of c, the last vector of each row masked to `last` where kMasked: the
// accumulators stay in registers over the whole k loop (MR * NV of the 32). Whole panels go
// without masks: a masked load in the k loop measured up to 1.4x slower (the same values).
template <int MR, int NV, bool kMasked>
void micro(int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b, int64_t ldb, float* c, int64_t ldc,
           bool accumulate, __mmask16 last) {
  V acc[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      acc[r][v] = !accumulate              ? _mm512_setzero_ps()
                  : kMasked && v == NV - 1 ? _mm512_maskz_loadu_ps(last, c + r * ldc + 16 * v)
                                           : _mm512_loadu_ps(c + r * ldc + 16 * v);
  for (int64_t l = 0; l < k; ++l) {
    V bv[NV];
    const float* bl = b + l * ldb;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      bv[v] = kMasked && v == NV - 1 ? _mm512_maskz_loadu_ps(last, bl + 16 * v) : _mm512_loadu_ps(bl + 16 * v);
    const float* al = a + l * a_cs;
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const V ar = _mm512_set1_ps(al[r * a_rs]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(ar, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      if (kMasked && v == NV - 1) _mm512_mask_storeu_ps(c + r * ldc + 16 * v, last, acc[r][v]);
      else _mm512_storeu_ps(c + r * ldc + 16 * v, acc[r][v]);
    }
}

// Row blocks: 16 accumulators for one or two vectors a row (8 rows), 12 or 16 for three or four
// (4 rows); a remainder of rows takes the block of its own height.
template <int NV, bool kMasked>
void rows(int64_t m, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b, int64_t ldb, float* c,
          int64_t ldc, bool accumulate, __mmask16 last) {
  constexpr int kMR = NV <= 2 ? 8 : 4;
  int64_t i = 0;
  for (; i + kMR <= m; i += kMR)
    micro<kMR, NV, kMasked>(k, a + i * a_rs, a_rs, a_cs, b, ldb, c + i * ldc, ldc, accumulate, last);
  const float* ai = a + i * a_rs;
  float* ci = c + i * ldc;
  switch (m - i) {
    case 0: break;
    case 1: micro<1, NV, kMasked>(k, ai, a_rs, a_cs, b, ldb, ci, ldc, accumulate, last); break;
    case 2: micro<2, NV, kMasked>(k, ai, a_rs, a_cs, b, ldb, ci, ldc, accumulate, last); break;
    case 3: micro<3, NV, kMasked>(k, ai, a_rs, a_cs, b, ldb, ci, ldc, accumulate, last); break;
    case 4: micro<4, NV, kMasked>(k, ai, a_rs, a_cs, b, ldb, ci, ldc, accumulate, last); break;
    case 5: micro<5, NV, kMasked>(k, ai, a_rs, a_cs, b, ldb, ci, ldc, accumulate, last); break;
    case 6: micro<6, NV, kMasked>(k, ai, a_rs, a_cs, b, ldb, ci, ldc, accumulate, last); break;
    default: micro<7, NV, kMasked>(k, ai, a_rs, a_cs, b, ldb, ci, ldc, accumulate, last); break;
  }
}

template <int NV>
void panel(int64_t m, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b, int64_t ldb, float* c,
           int64_t ldc, bool accumulate, __mmask16 last) {
  if (last == 0xFFFF) rows<NV, false>(m, k, a, a_rs, a_cs, b, ldb, c, ldc, accumulate, last);
  else rows<NV, true>(m, k, a, a_rs, a_cs, b, ldb, c, ldc, accumulate, last);
}

// BinaryRows' lanes: 16 floats.
struct BinaryLanes {
  using V = __m512;
  static constexpr int64_t kWidth = 16;
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V splat(float v) { return _mm512_set1_ps(v); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
};

}  // namespace

void binary_f32(int op, const float* a, int64_t a_step, const float* b, int64_t b_step, float* y, int64_t n) {
  BinaryRows<BinaryLanes>::run(op, a, a_step, b, b_step, y, n);
}

void column_sums_f32(const float* x, int64_t rows, int64_t ld, float* out, int64_t n) {
  BinaryRows<BinaryLanes>::column_sums(x, rows, ld, out, n);
}

void relu_f32(const float* x, float* y, int64_t n) {
  map2(x, x, y, n, [](V v, V) { return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_NLE_UQ), v); });
}

void relu_grad_f32(const float* y, const float* dy, float* g, int64_t n) {
  map2(y, dy, g, n, [](V v, V d) { return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_NLE_UQ), d); });
}

void sigmoid_f32(const float* x, float* y, int64_t n) {
  map2(x, x, y, n, [](V v, V) {
    const V e = exp_any(_mm512_sub_ps(_mm512_setzero_ps(), v));
    return _mm512_div_ps(splat(1.0f), _mm512_add_ps(splat(1.0f), e));
  });
}

// As vec::silu_f32 and vec::silu_grad_f32.
void silu_f32(const float* x, float* y, int64_t n) {
  map2(x, x, y, n, [](V v, V) {
    return _mm512_div_ps(v, _mm512_add_ps(splat(1.0f), exp_any(_mm512_sub_ps(_mm512_setzero_ps(), v))));
  });
}

void silu_grad_f32(const float* x, const float* dy, float* g, int64_t n) {
  map2(x, dy, g, n, [](V v, V d) {
    const V e = exp_any(_mm512_sub_ps(_mm512_setzero_ps(), v));
    const V s = _mm512_div_ps(splat(1.0f), _mm512_add_ps(splat(1.0f), e));
    const V slope = _mm512_add_ps(splat(1.0f), _mm512_mul_ps(v, _mm512_sub_ps(splat(1.0f), s)));
    return _mm512_mul_ps(d, _mm512_mul_ps(s, slope));
  });
}

void gelu_f32(const float* x, float* y, int64_t n) {
  map2(x, x, y, n, [](V v, V) {
    const V erf = erf_of(_mm512_mul_ps(v, splat(kSqrt1_2)));
    return _mm512_mul_ps(_mm512_mul_ps(splat(0.5f), v), _mm512_add_ps(splat(1.0f), erf));
  });
}

void gelu_grad_f32(const float* x, const float* dy, float* g, int64_t n) {
  map2(x, dy, g, n, [](V v, V d) {
    const V cdf = _mm512_mul_ps(splat(0.5f), _mm512_add_ps(splat(1.0f), erf_of(_mm512_mul_ps(v, splat(kSqrt1_2)))));
    const V pdf = _mm512_mul_ps(splat(kInvSqrt2Pi), exp_nonpositive(_mm512_mul_ps(_mm512_mul_ps(splat(-0.5f), v), v)));
    return _mm512_mul_ps(d, _mm512_add_ps(cdf, _mm512_mul_ps(v, pdf)));
  });
}

void gelu_tanh_f32(const float* x, float* y, int64_t n) {
  map2(x, x, y, n, [](V v, V) {
    V e;
    return _mm512_mul_ps(v, sigmoid_of_minus(gelu_tanh_z2(v), e));
  });
}

// d/dx x s(z) = s + x e s^2 (-dz/dx), -dz/dx = 2 sqrt(2/pi) (1 + 3 c x^2).
void gelu_tanh_grad_f32(const float* x, const float* dy, float* g, int64_t n) {
  map2(x, dy, g, n, [](V v, V d) {
    V e;
    const V s = sigmoid_of_minus(gelu_tanh_z2(v), e);
    const V ess = _mm512_mul_ps(_mm512_mul_ps(e, s), s);
    const V minus_dz = _mm512_fmadd_ps(splat(-3.0f * kGeluZ3), _mm512_mul_ps(v, v), splat(-kGeluZ1));
    return _mm512_mul_ps(d, _mm512_fmadd_ps(_mm512_mul_ps(v, ess), minus_dz, s));
  });
}

namespace {
// The two halves of 16 floats as 8 doubles each.
__m512d low_pd(V v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
__m512d high_pd(V v) { return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))); }

// Note [Blocked float sums]
// A row's sums (softmax's sum of exp, its gradient's sum(dy y) or sum(dy), layer norm's gradient
// sums) add kSumBlock vectors in float lanes, then each block's 16 lanes in double: one float add
// or FMA a vector instead of two conversions and two double adds, which cost as much as the rest of
// the row's arithmetic. A lane of a block adds at most kSumBlock terms, so a block's error is at
// most kSumBlock - 1 roundings of its terms' magnitudes at any width (a plain float sum's grows
// with the width: 1e-3 at a million), and adding the blocks in double adds nothing measurable.
// Layer norm's parameter sums take the same shape down the rows (layer_norm_backward_cpu).
constexpr int64_t kSumBlock = 8;

// The K sums over a row of n that term(acc, i, in) adds into acc[0..K) for the lanes [i, i + 16)
// (those under the mask `in`; the others must add zero).
// Even and odd vectors add into their own accumulators, so the adds' latency overlaps.
template <int K, typename Term>
void blocked_sums(int64_t n, double (&out)[K], Term term) {
  __m512d sum[K];
  for (int k = 0; k < K; ++k) sum[k] = _mm512_setzero_pd();
  for (int64_t b = 0; b < n; b += 16 * kSumBlock) {
    V even[K], odd[K];
    for (int k = 0; k < K; ++k) even[k] = odd[k] = _mm512_setzero_ps();
    const int64_t end = n - b < 16 * kSumBlock ? n : b + 16 * kSumBlock;
    int64_t i = b;
    for (; i + 32 <= end; i += 32) {  // every lane on, as for_each_vector's whole vectors
      term(even, i, static_cast<__mmask16>(0xFFFF));
      term(odd, i + 16, static_cast<__mmask16>(0xFFFF));
    }
    if (i < end) term(even, i, lanes(end - i));
    if (i + 16 < end) term(odd, i + 16, lanes(end - i - 16));
    for (int k = 0; k < K; ++k) {
      const V block = _mm512_add_ps(even[k], odd[k]);
      sum[k] = _mm512_add_pd(sum[k], _mm512_add_pd(low_pd(block), high_pd(block)));
    }
  }
  for (int k = 0; k < K; ++k) out[k] = _mm512_reduce_add_pd(sum[k]);
}

// The largest of n floats, NaN skipped (as fmax); -inf for none. Four accumulators, so the maxima's
// latency overlaps.
float row_max(const float* x, int64_t n) {
  V mx[4];
  for (V& m : mx) m = splat(-INFINITY);
  int64_t i = 0;  // max_ps(x, m) is m where x is NaN
  for (; i + 64 <= n; i += 64)
    for (int j = 0; j < 4; ++j) mx[j] = _mm512_max_ps(_mm512_loadu_ps(x + i + 16 * j), mx[j]);
  for_each_vector(n - i, [&](int64_t k, __mmask16 in) {
    mx[0] = _mm512_mask_max_ps(mx[0], in, _mm512_maskz_loadu_ps(in, x + i + k), mx[0]);
  });
  return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(mx[0], mx[1]), _mm512_max_ps(mx[2], mx[3])));
}

// Note [Prefetching the next row]
// The row kernels' callers walk rows that follow each other in memory, and a row of a few KiB is
// about a page: the hardware prefetchers stop at page boundaries, so each row's first pass waited
// for memory while the arithmetic of the row before had left it idle. So the last pass of the
// softmax rows and of layer norm's gradient row asks for line i of the next row of each operand as
// it reaches line i of its own, and the next row arrives while this one computes
// (bench/results/2026-11-27-cpu-row-ops: layer norm's backward about 1.5x faster with them than
// without). Layer norm's forward does without: its sums pass leaves little arithmetic to hide
// behind, and it measured slower with them. Only for rows up to kPrefetchRow floats (wider rows
// span pages the prefetchers follow, and a row ahead would be too far). Past the tensor's end the
// address names memory the program may not own: a prefetch never faults, and the address is
// computed as an integer.
constexpr int64_t kPrefetchRow = 4096;
enum class Next { kRead, kWrite };
template <Next kind>
void prefetch_next_row(const float* row, int64_t n, int64_t i) {
  const auto line = reinterpret_cast<std::uintptr_t>(row + i) + static_cast<std::uintptr_t>(n) * sizeof(float);
  __builtin_prefetch(reinterpret_cast<const void*>(line), kind == Next::kWrite ? 1 : 0, 3);
}
}  // namespace

void softmax_row_f32(bool log, const float* x, float* y, int64_t n) {
  const V m = splat(row_max(x, n));
  const bool ahead = n <= kPrefetchRow;  // Note [Prefetching the next row]
  double sum[1];
  blocked_sums<1>(n, sum, [&](V(&acc)[1], int64_t i, __mmask16 in) {
    if (ahead) {
      prefetch_next_row<Next::kRead>(x, n, i);
      prefetch_next_row<Next::kWrite>(y, n, i);
    }
    // x - max is never above 0 (+inf in x makes the max +inf and this NaN).
    const V e = _mm512_maskz_mov_ps(in, exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(in, x + i), m)));
    acc[0] = _mm512_add_ps(acc[0], e);
    if (!log) _mm512_mask_storeu_ps(y + i, in, e);
  });
  if (log) {
    const V log_s = splat(static_cast<float>(std::log(sum[0])));
    for_each_vector(n, [&](int64_t i, __mmask16 in) {
      _mm512_mask_storeu_ps(y + i, in, _mm512_sub_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(in, x + i), m), log_s));
    });
  } else {
    const V inv = splat(static_cast<float>(1.0 / sum[0]));
    for_each_vector(n, [&](int64_t i, __mmask16 in) {
      _mm512_mask_storeu_ps(y + i, in, _mm512_mul_ps(_mm512_maskz_loadu_ps(in, y + i), inv));
    });
  }
}

void softmax_grad_row_f32(bool log, const float* y, const float* dy, float beta, float* dx, int64_t n) {
  double sum[1];  // log_softmax: sum(dy); softmax: sum(dy y)
  if (log)
    blocked_sums<1>(n, sum, [&](V(&acc)[1], int64_t i, __mmask16 in) {
      acc[0] = _mm512_add_ps(acc[0], _mm512_maskz_loadu_ps(in, dy + i));
    });
  else
    blocked_sums<1>(n, sum, [&](V(&acc)[1], int64_t i, __mmask16 in) {
      acc[0] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(in, dy + i), _mm512_maskz_loadu_ps(in, y + i), acc[0]);
    });
  const V s = splat(static_cast<float>(sum[0])), b = splat(beta);
  const bool ahead = n <= kPrefetchRow;  // Note [Prefetching the next row]
  for_each_vector(n, [&](int64_t i, __mmask16 in) {
    if (ahead) {
      prefetch_next_row<Next::kRead>(y, n, i);
      prefetch_next_row<Next::kRead>(dy, n, i);
      prefetch_next_row<Next::kWrite>(dx, n, i);
    }
    const V yv = _mm512_maskz_loadu_ps(in, y + i), g = _mm512_maskz_loadu_ps(in, dy + i);
    // log_softmax's y = (x - max) - log(sum) is never above 0.
    V v = log ? _mm512_sub_ps(g, _mm512_mul_ps(exp_nonpositive(yv), s)) : _mm512_mul_ps(yv, _mm512_sub_ps(g, s));
    if (beta != 0.0f) v = _mm512_add_ps(v, _mm512_mul_ps(b, _mm512_maskz_loadu_ps(in, dx + i)));
    _mm512_mask_storeu_ps(dx + i, in, v);
  });
}

// Note [Layer norm's row in one pass and a float output]: the mean and the variance from one pass
// of double sums of d = x - x[0] and d^2 (the shift keeps the variance's subtraction safe: the
// square of the mean's distance from x[0] is at most n times the variance, as x[0] is one of the
// n terms, so the cancellation costs at most a factor n of double's precision). The output in
// float, x - mean as (x - m_hi) - m_lo with mean = m_hi + m_lo two floats (the second subtraction
// carries what rounding the mean to float would lose), then times rstd: three float operations a
// lane instead of the conversions and the double arithmetic of the sums.
void layer_norm_row_f32(const float* x, const float* weight, const float* bias, int64_t n, float eps, float* y,
                        float* mean, float* rstd) {
  const double k = n > 0 ? x[0] : 0.0;
  const __m512d kd = _mm512_set1_pd(k);
  __m512d s_lo = _mm512_setzero_pd(), s_hi = s_lo, q_lo = s_lo, q_hi = s_lo;
  for_each_vector(n, [&](int64_t i, __mmask16 in) {
    const V v = _mm512_maskz_loadu_ps(in, x + i);
    const __m512d a = _mm512_maskz_sub_pd(static_cast<__mmask8>(in), low_pd(v), kd);
    const __m512d b = _mm512_maskz_sub_pd(static_cast<__mmask8>(in >> 8), high_pd(v), kd);
    s_lo = _mm512_add_pd(s_lo, a);
    s_hi = _mm512_add_pd(s_hi, b);
    q_lo = _mm512_fmadd_pd(a, a, q_lo);
    q_hi = _mm512_fmadd_pd(b, b, q_hi);
  });
  const double d = _mm512_reduce_add_pd(_mm512_add_pd(s_lo, s_hi)) / static_cast<double>(n);
  const double q = _mm512_reduce_add_pd(_mm512_add_pd(q_lo, q_hi)) / static_cast<double>(n);
  const double m = k + d, var = q - d * d > 0.0 ? q - d * d : 0.0;
  const double inv = 1.0 / std::sqrt(var + eps);
  *mean = static_cast<float>(m);
  *rstd = static_cast<float>(inv);
  const auto m_hi = static_cast<float>(m);
  const V mh = splat(m_hi), ml = splat(static_cast<float>(m - m_hi)), iv = splat(static_cast<float>(inv));
  for_each_vector(n, [&](int64_t i, __mmask16 in) {  // no prefetches: Note [Prefetching the next row]
    const V v = _mm512_maskz_loadu_ps(in, x + i);
    V out = _mm512_mul_ps(_mm512_sub_ps(_mm512_sub_ps(v, mh), ml), iv);
    if (weight != nullptr) out = _mm512_mul_ps(out, _mm512_maskz_loadu_ps(in, weight + i));
    if (bias != nullptr) out = _mm512_add_ps(out, _mm512_maskz_loadu_ps(in, bias + i));
    _mm512_mask_storeu_ps(y + i, in, out);
  });
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)) with xhat = t rstd, t = x - mean, taken as
// a g + (b t + c): a = rstd, b = -rstd^2 mean(g xhat), c = -rstd mean(g) (t keeps the large mean
// out of the fold, as a fold around x itself would cancel), and sum(g xhat) as rstd sum(g t):
// four operations a vector for dx and two for the sums, where the formula as written takes nine.
// The parameter sums take xhat on the way.
void layer_norm_grad_row_f32(const float* x, const float* dy, const float* weight, float mean, float rstd, int64_t n,
                             float beta, float* dx, float* pw, float* pb) {
  const V mf = splat(mean);
  const auto g_at = [&](int64_t i, __mmask16 in) {
    const V d = _mm512_maskz_loadu_ps(in, dy + i);
    return weight != nullptr ? _mm512_mul_ps(d, _mm512_maskz_loadu_ps(in, weight + i)) : d;
  };
  const auto t_at = [&](int64_t i, __mmask16 in) { return _mm512_sub_ps(_mm512_maskz_loadu_ps(in, x + i), mf); };
  double sums[2];  // sum(g), sum(g t)
  blocked_sums<2>(n, sums, [&](V(&acc)[2], int64_t i, __mmask16 in) {
    const V g = g_at(i, in);  // zero past n
    acc[0] = _mm512_add_ps(acc[0], g);
    acc[1] = _mm512_fmadd_ps(g, t_at(i, in), acc[1]);
  });
  const double mean_g = sums[0] / static_cast<double>(n), mean_g_xhat = rstd * sums[1] / static_cast<double>(n);
  const V a = splat(rstd), b = splat(static_cast<float>(-static_cast<double>(rstd) * rstd * mean_g_xhat)),
          c = splat(static_cast<float>(-rstd * mean_g)), inv = splat(rstd), bv = splat(beta);
  const bool ahead = n <= kPrefetchRow;  // Note [Prefetching the next row]
  for_each_vector(n, [&](int64_t i, __mmask16 in) {
    if (ahead) {
      prefetch_next_row<Next::kRead>(x, n, i);
      prefetch_next_row<Next::kRead>(dy, n, i);
      prefetch_next_row<Next::kWrite>(dx, n, i);
    }
    const V g = g_at(i, in), t = t_at(i, in);
    V out = _mm512_fmadd_ps(a, g, _mm512_fmadd_ps(b, t, c));
    if (beta != 0.0f) out = _mm512_fmadd_ps(bv, _mm512_maskz_loadu_ps(in, dx + i), out);
    _mm512_mask_storeu_ps(dx + i, in, out);
    if (pw != nullptr) {  // the parameter sums take dy itself, not g = dy weight
      const V d = weight != nullptr ? _mm512_maskz_loadu_ps(in, dy + i) : g, xhat = _mm512_mul_ps(t, inv);
      _mm512_mask_storeu_ps(pw + i, in, _mm512_fmadd_ps(d, xhat, _mm512_maskz_loadu_ps(in, pw + i)));
      _mm512_mask_storeu_ps(pb + i, in, _mm512_add_ps(_mm512_maskz_loadu_ps(in, pb + i), d));
    }
  });
}

void cross_entropy_row_stats_f32(const float* x, int64_t n, float* max_out, float* log_sum_out) {
  const float m = row_max(x, n);
  const V mv = splat(m);
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  for_each_vector(n, [&](int64_t i, __mmask16 in) {
    const V e = _mm512_maskz_mov_ps(in, exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(in, x + i), mv)));
    lo = _mm512_add_pd(lo, low_pd(e));
    hi = _mm512_add_pd(hi, high_pd(e));
  });
  *max_out = m;
  *log_sum_out = static_cast<float>(std::log(_mm512_reduce_add_pd(_mm512_add_pd(lo, hi))));
}

void cross_entropy_grad_row_f32(const float* x, int64_t n, int64_t label, float m, float log_sum, float g, float beta,
                                float* dx) {
  const V mv = splat(m), lv = splat(log_sum), gv = splat(g), bv = splat(beta);
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i y = _mm512_set1_epi32(static_cast<int>(label));
  for_each_vector(n, [&](int64_t i, __mmask16 in) {
    const V e = exp_nonpositive(_mm512_sub_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(in, x + i), mv), lv));
    const __mmask16 hit = _mm512_cmpeq_epi32_mask(_mm512_add_epi32(iota, _mm512_set1_epi32(static_cast<int>(i))), y);
    V v = _mm512_mul_ps(gv, _mm512_mask_sub_ps(e, hit, e, splat(1.0f)));
    if (beta != 0.0f) v = _mm512_add_ps(v, _mm512_mul_ps(bv, _mm512_maskz_loadu_ps(in, dx + i)));
    _mm512_mask_storeu_ps(dx + i, in, v);
  });
}

void layer_norm_param_grads_row_f32(const float* x, const float* dy, double mean, double rstd, int64_t n, double* sw,
                                    double* sb) {
  const __m512d md = _mm512_set1_pd(mean), invd = _mm512_set1_pd(rstd);
  // 8 floats at a time, loaded under a 16-lane mask (a masked 8-lane load would need AVX-512VL).
  const auto load8 = [](__mmask16 in, const float* p) {
    return _mm512_cvtps_pd(_mm512_castps512_ps256(_mm512_maskz_loadu_ps(in, p)));
  };
  for (int64_t i = 0; i < n; i += 8) {
    const __mmask16 in16 = lanes(n - i < 8 ? n - i : 8);
    const auto in = static_cast<__mmask8>(in16);
    const __m512d g = load8(in16, dy + i);
    const __m512d xhat = _mm512_mul_pd(_mm512_sub_pd(load8(in16, x + i), md), invd);
    _mm512_mask_storeu_pd(sw + i, in, _mm512_add_pd(_mm512_maskz_loadu_pd(in, sw + i), _mm512_mul_pd(g, xhat)));
    _mm512_mask_storeu_pd(sb + i, in, _mm512_add_pd(_mm512_maskz_loadu_pd(in, sb + i), g));
  }
}

void add_float_sums(float* partial, int64_t n, double* sums) {
  for_each_vector(n, [&](int64_t i, __mmask16 in) {
    const V p = _mm512_maskz_loadu_ps(in, partial + i);
    const auto lo = static_cast<__mmask8>(in), hi = static_cast<__mmask8>(in >> 8);
    _mm512_mask_storeu_pd(sums + i, lo, _mm512_add_pd(_mm512_maskz_loadu_pd(lo, sums + i), low_pd(p)));
    _mm512_mask_storeu_pd(sums + i + 8, hi, _mm512_add_pd(_mm512_maskz_loadu_pd(hi, sums + i + 8), high_pd(p)));
    _mm512_mask_storeu_ps(partial + i, in, _mm512_setzero_ps());
  });
}

void gemm_f32(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b, int64_t ldb,
              float* c, int64_t ldc, bool accumulate) {
  for (int64_t j0 = 0; j0 < n; j0 += 64) {
    const int64_t w = n - j0 < 64 ? n - j0 : 64, nv = (w + 15) / 16;
    const __mmask16 last = lanes(w - 16 * (nv - 1));
    switch (nv) {
      case 1: panel<1>(m, k, a, a_rs, a_cs, b + j0, ldb, c + j0, ldc, accumulate, last); break;
      case 2: panel<2>(m, k, a, a_rs, a_cs, b + j0, ldb, c + j0, ldc, accumulate, last); break;
      case 3: panel<3>(m, k, a, a_rs, a_cs, b + j0, ldb, c + j0, ldc, accumulate, last); break;
      default: panel<4>(m, k, a, a_rs, a_cs, b + j0, ldb, c + j0, ldc, accumulate, last); break;
    }
  }
}

void attention_softmax_tile_f32(float* s, int64_t lds, int64_t rows, const int64_t* valid, int64_t width, float scale,
                                float* m, double* sums, float* acc, int64_t d) {
  const V sc = splat(scale);
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * lds;
    const int64_t n = valid[r] < width ? valid[r] : width;
    if (n <= 0) {
      for (int64_t j = 0; j < width; j += 16) _mm512_mask_storeu_ps(sr + j, lanes(width - j), _mm512_setzero_ps());
      continue;
    }
    V mx = splat(-INFINITY);
    for (int64_t j = 0; j < n; j += 16)
      mx = _mm512_mask_max_ps(mx, lanes(n - j), mx, _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes(n - j), sr + j), sc));
    const float tile_max = _mm512_reduce_max_ps(mx);
    const float m_new = m[r] > tile_max ? m[r] : tile_max;
    const V mv = splat(m_new);
    V sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < width; j += 16) {
      const __mmask16 in = lanes(n - j);
      const V e =
          _mm512_maskz_mov_ps(in, exp_nonpositive(_mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(sr + j), sc), mv)));
      sum = _mm512_add_ps(sum, e);
      _mm512_mask_storeu_ps(sr + j, lanes(width - j), e);
    }
    if (m_new != m[r]) {
      // The first tile finds m = -inf: alpha 0 (acc and the sum are still 0).
      const float alpha = std::exp(m[r] - m_new);
      sums[r] *= alpha;
      float* ar = acc + r * d;
      for (int64_t c = 0; c < d; c += 16) {
        const __mmask16 in = lanes(d - c);
        _mm512_mask_storeu_ps(ar + c, in, _mm512_mul_ps(_mm512_maskz_loadu_ps(in, ar + c), splat(alpha)));
      }
    }
    sums[r] += static_cast<double>(_mm512_reduce_add_ps(sum));
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
    for (int64_t j = 0; j < width; j += 16) {
      const __mmask16 all = lanes(width - j), in = lanes(valid[r] - j);
      const V p = _mm512_maskz_mov_ps(
          in, exp_nonpositive(_mm512_sub_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(all, sr + j), sc), l)));
      const V ds = _mm512_mul_ps(_mm512_mul_ps(p, _mm512_sub_ps(_mm512_maskz_loadu_ps(all, dr + j), dl)), sc);
      _mm512_mask_storeu_ps(sr + j, all, p);
      _mm512_mask_storeu_ps(dr + j, all, ds);
    }
  }
}

}  // namespace cumulus::kernels::vec512
#endif
