// The loops of the few-row products (Note [Products of few rows] in gemm_few_rows.h), written once
// over a vector of kFewRowsLanes floats: gemm_few_rows_avx2.cpp instantiates them with two AVX2
// registers, gemm_few_rows_avx512.cpp with one AVX-512 register. Included only by those two files,
// each compiled for its instruction set; `Lanes` is a type of that file's unnamed namespace, so no
// instantiation is shared between them.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/gemm_few_rows.h"

namespace cumulus::kernels {

// Lanes: Acc (kFewRowsLanes floats), kColumns, zero(), load(const float*), store(float*, Acc),
// fma(const float* b, Acc a, Acc acc) = acc + (*b broadcast) * a, one rounding per lane.
template <typename Lanes>
struct FewRowsCores {
  using Acc = typename Lanes::Acc;
  static constexpr int64_t kColumns = Lanes::kColumns;
  static constexpr int64_t kL = kFewRowsLanes;
  static_assert(kL == 16, "the packing transposes two blocks of 8 rows");

  // 8 x 8 floats in place: row i becomes column i.
  static void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
      u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
      u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
      u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
      u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; ++i) {
      r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
      r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
  }

  // Rows [8h, 8h + 8) of one block, positions [p, p + 8), from rows k-contiguous in memory (zero past
  // `rows`), into their lanes of at.
  static void pack_eight(const float* a, int64_t rows, int64_t row_step, int64_t p, int h, float* at) {
    __m256 r[8];
    for (int i = 0; i < 8; ++i)
      r[i] = 8 * h + i < rows ? _mm256_loadu_ps(a + (8 * h + i) * row_step + p) : _mm256_setzero_ps();
    transpose8(r);
    for (int q = 0; q < 8; ++q) _mm256_storeu_ps(at + (p + q) * kL + 8 * h, r[q]);
  }

  static void pack(const float* a, int64_t rows, int64_t k, int64_t row_step, int64_t k_step, float* at) {
    for (int64_t r0 = 0; r0 < rows; r0 += kL, a += kL * row_step, at += kL * k) {
      const int64_t block_rows = std::min(kL, rows - r0);
      int64_t p = 0;
      if (k_step == 1)
        for (; p + 8 <= k; p += 8)
          for (int h = 0; h < 2; ++h) pack_eight(a, block_rows, row_step, p, h, at);
      for (; p < k; ++p)
        for (int64_t i = 0; i < kL; ++i) at[p * kL + i] = i < block_rows ? a[i * row_step + p * k_step] : 0.0f;
    }
  }

  // acc[i] = the chains of columns j0 + i of C for one block of rows; `width` < kColumns repeats the
  // block's last column in the lanes past it (read, never stored).
  template <bool kFull>
  static void chains(const float* at, int64_t k, const FewRowsOperand& b, int64_t j0, int64_t width, Acc acc[]) {
    for (int64_t i = 0; i < kColumns; ++i) acc[i] = Lanes::zero();
    if constexpr (kFull) {
      const float* bp = b.b + j0 * b.column_step;
      for (int64_t p = 0; p < k; ++p, bp += b.k_step) {
        const Acc v = Lanes::load(at + p * kL);
#pragma GCC unroll 16
        for (int64_t i = 0; i < kColumns; ++i) acc[i] = Lanes::fma(bp + i * b.column_step, v, acc[i]);
      }
    } else {
      const float* column[kColumns];
      for (int64_t i = 0; i < kColumns; ++i) column[i] = b.b + (j0 + std::min(i, width - 1)) * b.column_step;
      for (int64_t p = 0; p < k; ++p) {
        const Acc v = Lanes::load(at + p * kL);
        for (int64_t i = 0; i < kColumns; ++i) acc[i] = Lanes::fma(column[i] + p * b.k_step, v, acc[i]);
      }
    }
  }

  // Rows [r0, r0 + rows) of C's columns [j0, j0 + width) from their chains.
  static void store(const Acc acc[], int64_t r0, int64_t rows, int64_t j0, int64_t width, const FewRowsOutput& c) {
    alignas(64) float lanes[kColumns][kL];
    for (int64_t i = 0; i < kColumns; ++i) Lanes::store(lanes[i], acc[i]);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = c.c + (r0 + r) * c.ldc + j0;
      for (int64_t i = 0; i < width; ++i) {
        const float product = c.alpha * lanes[i][r];
        row[i] = c.beta == 0.0f ? product : product + c.beta * row[i];
      }
    }
  }

  static void product(const FewRowsPanel& a, const FewRowsOperand& b, const FewRowsOutput& c) {
    Acc acc[kColumns];
    for (int64_t j0 = c.begin; j0 < c.end; j0 += kColumns) {
      const int64_t width = std::min(kColumns, c.end - j0);
      for (int64_t r0 = 0; r0 < a.rows; r0 += kL) {
        const float* at = a.at + r0 * a.k;
        if (width == kColumns) chains<true>(at, a.k, b, j0, width, acc);
        else chains<false>(at, a.k, b, j0, width, acc);
        store(acc, r0, std::min(kL, a.rows - r0), j0, width, c);
      }
    }
  }
};

}  // namespace cumulus::kernels
#endif
