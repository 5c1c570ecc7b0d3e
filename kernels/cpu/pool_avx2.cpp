// kernels/cpu/pool_rows.h's vec:: functions, 8 windows a step: compiled for AVX2 and FMA without
// contraction, as vec_math_avx2.cpp (CMakeLists.txt).
//
// A step reads 16 floats of each input row: a shuffle takes the windows' left elements and another
// their right ones, in the window order [0, 1, 4, 5, 2, 3, 6, 7] (the shuffle works within 128-bit
// halves); g and y are permuted to that order and back (swapping the middle 64-bit quarters), and
// the gradient rows are interleaved back by unpacklo / unpackhi, which undo the shuffle's order.
// The last step of a row, under 8 windows, takes them with masked loads and stores.
#include "kernels/cpu/pool_rows.h"

#if defined(__x86_64__)
#include <immintrin.h>

namespace cumulus::kernels::vec {
namespace {

// The four elements of 8 windows, and which one each window picks (masks of all-ones lanes).
struct Windows {
  __m256 a, b, c, d;
  __m256 pick_a, pick_b, pick_c, pick_d;
  __m256 value;  // the picked element
};

// Lanes [0, n) of 8 all ones (n may be <= 0 or >= 8).
__m256i first_lanes(int64_t n) {
  const int lanes = n < 0 ? 0 : (n > 8 ? 8 : static_cast<int>(n));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Swaps the middle 64-bit quarters: [0, 1, 2, 3, 4, 5, 6, 7] <-> [0, 1, 4, 5, 2, 3, 6, 7].
__m256 swap_middle(__m256 v) {
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(v), _MM_SHUFFLE(3, 1, 2, 0)));
}

// 16 floats from p, or its first m (the rest 0) with masked loads.
struct Pair {
  __m256 lo, hi;
};
Pair load16(const float* p, int64_t m) {
  if (m >= 16) return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
  return {_mm256_maskload_ps(p, first_lanes(m)), _mm256_maskload_ps(p + 8, first_lanes(m - 8))};
}

// lo and hi to 16 floats at p, or to its first m with masked stores (slow on AMD's cores: only the
// row's last step takes them).
void store16(float* p, int64_t m, __m256 lo, __m256 hi) {
  if (m >= 16) {
    _mm256_storeu_ps(p, lo);
    _mm256_storeu_ps(p + 8, hi);
    return;
  }
  _mm256_maskstore_ps(p, first_lanes(m), lo);
  _mm256_maskstore_ps(p + 8, first_lanes(m - 8), hi);
}

// pool_window_argmax's rule in order a, b, c, d: a later element wins if larger or NaN.
Windows pick(const float* r0, const float* r1, int64_t n) {
  const Pair x0 = load16(r0, 2 * n), x1 = load16(r1, 2 * n);
  const __m256 r0_lo = x0.lo, r0_hi = x0.hi, r1_lo = x1.lo, r1_hi = x1.hi;
  Windows w;
  w.a = _mm256_shuffle_ps(r0_lo, r0_hi, _MM_SHUFFLE(2, 0, 2, 0));
  w.b = _mm256_shuffle_ps(r0_lo, r0_hi, _MM_SHUFFLE(3, 1, 3, 1));
  w.c = _mm256_shuffle_ps(r1_lo, r1_hi, _MM_SHUFFLE(2, 0, 2, 0));
  w.d = _mm256_shuffle_ps(r1_lo, r1_hi, _MM_SHUFFLE(3, 1, 3, 1));
  const auto takes = [](__m256 x, __m256 best) {
    return _mm256_or_ps(_mm256_cmp_ps(x, best, _CMP_GT_OQ), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  };
  __m256 best = w.a;
  const __m256 take_b = takes(w.b, best);
  best = _mm256_blendv_ps(best, w.b, take_b);
  const __m256 take_c = takes(w.c, best);
  best = _mm256_blendv_ps(best, w.c, take_c);
  const __m256 take_d = takes(w.d, best);
  w.value = _mm256_blendv_ps(best, w.d, take_d);
  w.pick_d = take_d;
  w.pick_c = _mm256_andnot_ps(take_d, take_c);
  w.pick_b = _mm256_andnot_ps(_mm256_or_ps(take_c, take_d), take_b);
  w.pick_a = _mm256_andnot_ps(_mm256_or_ps(take_b, _mm256_or_ps(take_c, take_d)), _mm256_castsi256_ps(first_lanes(8)));
  return w;
}

}  // namespace

void max_pool_2x2_row_f32(const float* r0, const float* r1, int64_t out_w, float* y) {
  for (int64_t j = 0; j < out_w; j += 8) {
    const int64_t n = out_w - j;
    const Windows w = pick(r0 + 2 * j, r1 + 2 * j, n);
    if (n >= 8) _mm256_storeu_ps(y + j, swap_middle(w.value));
    else _mm256_maskstore_ps(y + j, first_lanes(n), swap_middle(w.value));
  }
}

void max_pool_2x2_row_grad_f32(const float* r0, const float* r1, const float* g, int64_t out_w, float* d0, float* d1) {
  for (int64_t j = 0; j < out_w; j += 8) {
    const int64_t n = out_w - j;
    const Windows w = pick(r0 + 2 * j, r1 + 2 * j, n);
    const __m256 gv = swap_middle(n >= 8 ? _mm256_loadu_ps(g + j) : _mm256_maskload_ps(g + j, first_lanes(n)));
    const __m256 da = _mm256_and_ps(w.pick_a, gv), db = _mm256_and_ps(w.pick_b, gv);
    const __m256 dc = _mm256_and_ps(w.pick_c, gv), dd = _mm256_and_ps(w.pick_d, gv);
    store16(d0 + 2 * j, 2 * n, _mm256_unpacklo_ps(da, db), _mm256_unpackhi_ps(da, db));
    store16(d1 + 2 * j, 2 * n, _mm256_unpacklo_ps(dc, dd), _mm256_unpackhi_ps(dc, dd));
  }
}

}  // namespace cumulus::kernels::vec
#endif
