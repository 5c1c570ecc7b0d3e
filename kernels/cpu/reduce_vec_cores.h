// The vector cores of the sums over dimensions (kernels/cpu/vec_reduce.h) at either width, as
// ReduceCores<Lanes>: included only by reduce_avx2.cpp and reduce_avx512.cpp, each compiled for its
// instruction set, whose Lanes type holds the double accumulator of 8 floats:
//   Acc8, zero(), add(Acc8&, __m256 f) (acc += f widened to double), store(const Acc8&, double
//   divisor, float* y) (y[0..7] = float(acc / divisor)), and kColumnVecs (loads of 8 per term in a
//   row of columns).
// Loads and transposes are 8 floats wide at both widths; only the double lanes differ. Each lane
// adds one output's terms in term order, in double, and divides and rounds once, as the scalar loop
// (Note [Sums over dimensions across outputs] in reduce_dims.cpp): the same bits. Everything sits in
// an anonymous namespace and calls no std:: template: no inline function the library shares gets a
// copy with wider instructions.
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

// r[t] = column t of the 8 x 8 floats r[0..7] (row k's element t to lane k).
inline void transpose8(__m256* r) {
  __m256 t[8], u[8];
  for (int k = 0; k < 8; k += 2) {
    t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
    t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
  }
  for (int k = 0; k < 8; k += 4) {
    u[k] = _mm256_shuffle_ps(t[k], t[k + 2], 0x44);
    u[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], 0xEE);
    u[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0x44);
    u[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0xEE);
  }
  for (int k = 0; k < 4; ++k) {
    r[k] = _mm256_permute2f128_ps(u[k], u[k + 4], 0x20);
    r[k + 4] = _mm256_permute2f128_ps(u[k], u[k + 4], 0x31);
  }
}

// 4 floats from lo in the low half, 4 from hi in the high.
inline __m256 halves(const float* lo, const float* hi) {
  const __m256 low = _mm256_castps128_ps256(_mm_loadu_ps(lo));
  return _mm256_blend_ps(low, _mm256_broadcast_ps(reinterpret_cast<const __m128*>(hi)), 0xF0);
}

// r[t] = element j + t of the 8 f32 rows at x + at[k] (lane k), as transpose8 of their loads but
// with a stage fewer: each register first holds 4 elements of row k (low half) and of row k + 4
// (high half), loaded so (a load, a broadcast load and a blend, no shuffle); two shuffle stages
// finish the transpose within the halves (measured 6% faster than transpose8 on Zen 5).
inline void columns8(const float* x, const int64_t* at, int64_t j, __m256* r) {
  __m256 a[8];
#pragma GCC unroll 8
  for (int k = 0; k < 4; ++k) {
    const float *lo = x + at[k] + j, *hi = x + at[k + 4] + j;
    a[k] = halves(lo, hi);
    a[k + 4] = halves(lo + 4, hi + 4);
  }
#pragma GCC unroll 2
  for (int g = 0; g < 8; g += 4) {
    const __m256 t0 = _mm256_unpacklo_ps(a[g], a[g + 1]), t1 = _mm256_unpackhi_ps(a[g], a[g + 1]);
    const __m256 t2 = _mm256_unpacklo_ps(a[g + 2], a[g + 3]), t3 = _mm256_unpackhi_ps(a[g + 2], a[g + 3]);
    r[g] = _mm256_shuffle_ps(t0, t2, 0x44);
    r[g + 1] = _mm256_shuffle_ps(t0, t2, 0xEE);
    r[g + 2] = _mm256_shuffle_ps(t1, t3, 0x44);
    r[g + 3] = _mm256_shuffle_ps(t1, t3, 0xEE);
  }
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

  // 8 G rows: per run, blocks of 8 terms of each group of 8 rows transposed so that lane k holds
  // the group's row k, then the terms under 8 one at a time; each lane adds its row's terms in
  // order. Each lane's adds are one chain (the order is the rule), so the G groups are what
  // overlaps. Lanes::kRowGroups picks G: AVX2's 4 (32 rows; its 8 doubles are two registers, two
  // chains of the 3-cycle add) took the sums over the last dimension of [8, 64, 128] from 10.1 to
  // 9.7 us on Zen 4; AVX-512 keeps 2 (16 rows): the conversions and shuffles bound it, not the
  // chains, and 8 groups ran slower (8.5 against 7.4 us: 64 rows 512 bytes apart fill every way of
  // the L1's sets).
  template <ReduceStorage S, int G>
  static void row_block(const void* x, const int64_t* bases, const int64_t* run_offsets, int64_t runs,
                        int64_t run_len, double divisor, float* y) {
    typename Lanes::Acc8 acc[G];
    for (typename Lanes::Acc8& a : acc) a = Lanes::zero();
    for (int64_t q = 0; q < runs; ++q) {
      int64_t at[8 * G];
      for (int k = 0; k < 8 * G; ++k) at[k] = bases[k] + run_offsets[q];
      int64_t j = 0;
      for (; j + 8 <= run_len; j += 8)
#pragma GCC unroll 8
        for (int h = 0; h < G; ++h) {
          __m256 r[8];
          if constexpr (S == ReduceStorage::f32) {
            columns8(static_cast<const float*>(x), at + 8 * h, j, r);
          } else {
#pragma GCC unroll 8
            for (int k = 0; k < 8; ++k) r[k] = load8<S>(x, at[8 * h + k] + j);
            transpose8(r);
          }
#pragma GCC unroll 8
          for (int t = 0; t < 8; ++t) Lanes::add(acc[h], r[t]);
        }
      for (; j < run_len; ++j)
        for (int h = 0; h < G; ++h) {
          const int64_t* a = at + 8 * h;
          Lanes::add(acc[h], _mm256_setr_ps(load1<S>(x, a[0] + j), load1<S>(x, a[1] + j), load1<S>(x, a[2] + j),
                                            load1<S>(x, a[3] + j), load1<S>(x, a[4] + j), load1<S>(x, a[5] + j),
                                            load1<S>(x, a[6] + j), load1<S>(x, a[7] + j)));
        }
    }
    for (int h = 0; h < G; ++h) Lanes::store(acc[h], divisor, y + 8 * h);
  }

  // Blocks of 8 Lanes::kRowGroups rows, the last padded with repeats of its first row (dropped). The
  // offsets and outputs go through local arrays: with the caller's arrays GCC kept the rows'
  // pointers on the stack (AVX-512, 16 rows: 8.0 against 7.4 us for [512, 128]).
  template <ReduceStorage S>
  static void rows(const void* x, const int64_t* bases, int64_t count, const int64_t* run_offsets, int64_t runs,
                   int64_t run_len, double divisor, float* y) {
    constexpr int kWide = 8 * Lanes::kRowGroups;
    for (int64_t k = 0; k < count; k += kWide) {
      const int64_t n = count - k < kWide ? count - k : kWide;
      int64_t padded[kWide];
      float out[kWide];
      for (int i = 0; i < kWide; ++i) padded[i] = bases[k + (i < n ? i : 0)];
      row_block<S, Lanes::kRowGroups>(x, padded, run_offsets, runs, run_len, divisor, out);
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
