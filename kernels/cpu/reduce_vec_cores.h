// The vector cores of the sums over dimensions (kernels/cpu/vec_reduce.h) at either width, as
// ReduceCores<Lanes>: included only by reduce_avx2.cpp and reduce_avx512.cpp, each compiled for its
// instruction set, whose Lanes type holds 8 double accumulators:
//   Acc8, zero(), add(Acc8&, __m256 f) (acc += f widened to double), plus(a, b) (lane by lane),
//   store(const Acc8&, double divisor, float* y) (y[0..7] = float(acc / divisor)),
//   total(const Acc8&) (its 8 lanes' sum by partials_total) and kColumnVecs (loads of 8 per term
//   in a row of columns).
// Loads are 8 floats wide at both widths; only the double lanes differ. The columns give each
// output a lane and add its terms in term order; the rows keep each output's 8 partial sums (Note
// [Sums over dimensions across outputs] in reduce_dims.cpp) in a register of its own, or, for runs
// under 8 terms, in a lane of 8 registers: the scalar loops' bits.
// Everything sits in an anonymous namespace and calls no std:: template: no inline function the
// library shares gets a copy with wider instructions.
#pragma once

#include <immintrin.h>

#include "kernels/cpu/vec_reduce.h"

namespace cumulus::kernels {
namespace {

// Elements i.. i + 7 of x widened to f32 (exact for every storage).
template <ReduceStorage S>
__m256 load8(const void* x, int64_t i) {
  if constexpr (S == ReduceStorage::f32) {
    return _mm256_loadu_ps(static_cast<const float*>(x) + i);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(x) + i));
    if constexpr (S == ReduceStorage::bf16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    else return _mm256_cvtph_ps(h);
  }
}

template <ReduceStorage S>
float load1(const void* x, int64_t i) {
  if constexpr (S == ReduceStorage::f32) {
    return static_cast<const float*>(x)[i];
  } else {
    const uint16_t h = static_cast<const uint16_t*>(x)[i];
    if constexpr (S == ReduceStorage::bf16) return _mm_cvtss_f32(_mm_castsi128_ps(_mm_cvtsi32_si128(h << 16)));
    else return _cvtsh_ss(h);
  }
}

// The sum of 8 partial sums, lo = p[0..3] and hi = p[4..7], in the tree of Note [Sums over
// dimensions across outputs]: ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)).
inline double partials_total(__m256d lo, __m256d hi) {
  const __m256d s4 = _mm256_add_pd(lo, hi);
  const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
}

template <typename Lanes>
struct ReduceCores {
  // Outputs i0 .. i0 + 8 kVecs - 1 of a row of columns: kVecs loads of 8 per term.
  template <ReduceStorage S, int kVecs>
  static void columns_block(const void* x, int64_t i0, const int64_t* run_offsets, int64_t runs, int64_t run_len,
                            int64_t step, double divisor, float* y) {
    typename Lanes::Acc8 acc[kVecs];
    for (typename Lanes::Acc8& a : acc) a = Lanes::zero();
    for (int64_t q = 0; q < runs; ++q)
      for (int64_t j = 0, at = run_offsets[q] + i0; j < run_len; ++j, at += step)
#pragma GCC unroll 8
        for (int v = 0; v < kVecs; ++v) Lanes::add(acc[v], load8<S>(x, at + 8 * v));
    for (int v = 0; v < kVecs; ++v) Lanes::store(acc[v], divisor, y + i0 + 8 * v);
  }

  // One output of a row of columns, scalar: the tail under 8.
  template <ReduceStorage S>
  static float column_scalar(const void* x, int64_t i, const int64_t* run_offsets, int64_t runs, int64_t run_len,
                             int64_t step, double divisor) {
    double s = 0.0;
    for (int64_t q = 0; q < runs; ++q)
      for (int64_t j = 0, at = run_offsets[q] + i; j < run_len; ++j, at += step)
        s += static_cast<double>(load1<S>(x, at));
    return static_cast<float>(s / divisor);
  }

  template <ReduceStorage S>
  static void columns(const void* x, const int64_t* run_offsets, int64_t runs, int64_t run_len, int64_t step, int64_t n,
                      double divisor, float* y) {
    int64_t i = 0;
    for (; i + 8 * Lanes::kColumnVecs <= n; i += 8 * Lanes::kColumnVecs)
      columns_block<S, Lanes::kColumnVecs>(x, i, run_offsets, runs, run_len, step, divisor, y);
    for (; i + 8 <= n; i += 8) columns_block<S, 1>(x, i, run_offsets, runs, run_len, step, divisor, y);
    for (; i < n; ++i) y[i] = column_scalar<S>(x, i, run_offsets, runs, run_len, step, divisor);
  }

  // Elements at .. at + n - 1 widened into lanes 0 .. n - 1, zeros in the rest (n < 8): a run's
  // last terms. Adding +0.0 keeps a partial sum's bits (it starts at +0.0, so it is never -0.0).
  template <ReduceStorage S>
  static __m256 tail8(const void* x, int64_t at, int64_t n) {
    if constexpr (S == ReduceStorage::f32) {
      const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), lanes);
      return _mm256_maskload_ps(static_cast<const float*>(x) + at, mask);
    } else {
      alignas(16) uint16_t h[8] = {};
      for (int64_t k = 0; k < n; ++k) h[k] = static_cast<const uint16_t*>(x)[at + k];
      return load8<S>(h, 0);
    }
  }

  // G rows of runs of 8 terms or more, each row's 8 partial sums in its own register (Note [Sums
  // over dimensions across outputs]): per run, whole loads of 8 terms and a tail. Each register's
  // adds are one chain, so the G rows are what overlaps.
  template <ReduceStorage S, int G>
  static void row_block(const void* x, const int64_t* bases, const int64_t* run_offsets, int64_t runs, int64_t run_len,
                        double divisor, float* y) {
    typename Lanes::Acc8 acc[G];
    for (typename Lanes::Acc8& a : acc) a = Lanes::zero();
    for (int64_t q = 0; q < runs; ++q) {
      int64_t at[G];
      for (int h = 0; h < G; ++h) at[h] = bases[h] + run_offsets[q];
      int64_t j = 0;
      for (; j + 8 <= run_len; j += 8)
#pragma GCC unroll 8
        for (int h = 0; h < G; ++h) Lanes::add(acc[h], load8<S>(x, at[h] + j));
      if (j < run_len)
        for (int h = 0; h < G; ++h) Lanes::add(acc[h], tail8<S>(x, at[h] + j, run_len - j));
    }
    for (int h = 0; h < G; ++h) y[h] = static_cast<float>(Lanes::total(acc[h]) / divisor);
  }

  // 8 rows of runs of kLen < 8 terms, a row a lane: acc[k]'s lane i is row i's partial k, and the
  // tree runs across the registers. Partials that get no term stay +0.0, which an add leaves the
  // other side's bits: they are left out of the tree.
  template <ReduceStorage S, int kLen>
  static void short_row_block(const void* x, const int64_t* b, const int64_t* run_offsets, int64_t runs, double divisor,
                              float* y) {
    using L = Lanes;
    typename L::Acc8 acc[8];
    for (typename L::Acc8& a : acc) a = L::zero();
    for (int64_t q = 0; q < runs; ++q) {
      const int64_t o = run_offsets[q];
#pragma GCC unroll 8
      for (int k = 0; k < kLen; ++k)
        L::add(acc[k], _mm256_setr_ps(load1<S>(x, b[0] + o + k), load1<S>(x, b[1] + o + k), load1<S>(x, b[2] + o + k),
                                      load1<S>(x, b[3] + o + k), load1<S>(x, b[4] + o + k), load1<S>(x, b[5] + o + k),
                                      load1<S>(x, b[6] + o + k), load1<S>(x, b[7] + o + k)));
    }
    typename L::Acc8 total;
    if constexpr (kLen == 1) total = acc[0];
    else if constexpr (kLen == 2) total = L::plus(acc[0], acc[1]);
    else if constexpr (kLen <= 4) total = L::plus(L::plus(acc[0], acc[2]), L::plus(acc[1], acc[3]));
    else
      total = L::plus(L::plus(L::plus(acc[0], acc[4]), L::plus(acc[2], acc[6])),
                      L::plus(L::plus(acc[1], acc[5]), L::plus(acc[3], acc[7])));
    L::store(total, divisor, y);
  }

  template <ReduceStorage S>
  static void short_rows(const void* x, const int64_t* b, const int64_t* run_offsets, int64_t runs, int64_t run_len,
                         double divisor, float* y) {
    switch (run_len) {
      case 1: return short_row_block<S, 1>(x, b, run_offsets, runs, divisor, y);
      case 2: return short_row_block<S, 2>(x, b, run_offsets, runs, divisor, y);
      case 3: return short_row_block<S, 3>(x, b, run_offsets, runs, divisor, y);
      case 4: return short_row_block<S, 4>(x, b, run_offsets, runs, divisor, y);
      case 5: return short_row_block<S, 5>(x, b, run_offsets, runs, divisor, y);
      case 6: return short_row_block<S, 6>(x, b, run_offsets, runs, divisor, y);
      default: return short_row_block<S, 7>(x, b, run_offsets, runs, divisor, y);
    }
  }

  // Rows whose sums run side by side: 8 chains (16 registers at AVX2's width) took a sum over the
  // last dimension of [8, 64, 128] to 5.7 us (AVX-512) and 7.1 us (AVX2) on Zen 4, against 6.0 and
  // 7.6 us at 4 and 6.7 and 8.7 us at 2.
  static constexpr int kRowsAtOnce = 8;

  // Blocks of kRowsAtOnce rows, the last padded with repeats of its first row (dropped), or alone
  // if it is one row of long runs (its chain is still 8 times shorter than the scalar loop's). The
  // offsets and outputs go through local arrays: with the caller's arrays GCC kept the rows'
  // pointers on the stack.
  template <ReduceStorage S>
  static void rows(const void* x, const int64_t* bases, int64_t count, const int64_t* run_offsets, int64_t runs,
                   int64_t run_len, double divisor, float* y) {
    constexpr int kWide = kRowsAtOnce;
    for (int64_t k = 0; k < count; k += kWide) {
      const int64_t n = count - k < kWide ? count - k : kWide;
      if (n == 1 && run_len >= 8) {
        row_block<S, 1>(x, bases + k, run_offsets, runs, run_len, divisor, y + k);
        continue;
      }
      int64_t padded[kWide];
      float out[kWide];
      for (int i = 0; i < kWide; ++i) padded[i] = bases[k + (i < n ? i : 0)];
      if (run_len >= 8) row_block<S, kWide>(x, padded, run_offsets, runs, run_len, divisor, out);
      else short_rows<S>(x, padded, run_offsets, runs, run_len, divisor, out);
      for (int64_t i = 0; i < n; ++i) y[k + i] = out[i];
    }
  }

  static void sum_columns(const void* x, ReduceStorage storage, const int64_t* run_offsets, int64_t runs,
                          int64_t run_len, int64_t step, int64_t n, double divisor, float* y) {
    switch (storage) {
      case ReduceStorage::f32: return columns<ReduceStorage::f32>(x, run_offsets, runs, run_len, step, n, divisor, y);
      case ReduceStorage::bf16: return columns<ReduceStorage::bf16>(x, run_offsets, runs, run_len, step, n, divisor, y);
      case ReduceStorage::f16: return columns<ReduceStorage::f16>(x, run_offsets, runs, run_len, step, n, divisor, y);
    }
  }

  static void sum_rows(const void* x, ReduceStorage storage, const int64_t* bases, int64_t count,
                       const int64_t* run_offsets, int64_t runs, int64_t run_len, double divisor, float* y) {
    switch (storage) {
      case ReduceStorage::f32: return rows<ReduceStorage::f32>(x, bases, count, run_offsets, runs, run_len, divisor, y);
      case ReduceStorage::bf16:
        return rows<ReduceStorage::bf16>(x, bases, count, run_offsets, runs, run_len, divisor, y);
      case ReduceStorage::f16: return rows<ReduceStorage::f16>(x, bases, count, run_offsets, runs, run_len, divisor, y);
    }
  }
};

}  // namespace
}  // namespace cumulus::kernels
