// GEMM on the CPU through OpenBLAS (cblas_sgemm, row-major), but for the products of a few rows
// that our own loops compute faster (Note [Products of few rows] in gemm_few_rows.h). With beta = 1
// a Linear's weight gradient accumulates inside the GEMM, exactly as on CUDA (Note [Gradient sinks]).
//
// Note [One pool for the kernels and the BLAS]
// OpenBLAS's pthreads build keeps its own worker per core, which spins for a while after each GEMM;
// our kernels' helpers (parallel.h) would then share the cores with spinning threads, and
// OpenBLAS's own split of the small GEMMs a transformer runs gains little (a [512, 128] x
// [128, 384] product's backward: 1.08x on two threads). So, unless an address-space limit keeps
// OpenBLAS's threads (core/threads.cpp), OpenBLAS runs one thread per call and a GEMM splits its
// output C across our pool: bands of whole rows (whole columns when C has few rows), aligned to
// OpenBLAS's register tiles and a product of at least kMinSplitMacs multiply-adds, each band one
// cblas_sgemm call on one thread. OpenBLAS computes an element of C from its row of op(A) and column
// of op(B) alone, blocking the sum over k by k's size only, so a band's elements are summed exactly
// as in the whole product: the bits do not depend on the split (GemmCpu.BandsGiveTheBitsOfOneCall),
// except along C's columns under Haswell's kernels, which BandRule keeps to chunks fixed by n.
#include <cblas.h>

#include <strings.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/gemm_few_rows.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/parallel.h"

namespace cumulus::kernels {

namespace {

// A band's least work: well above the products OpenBLAS may hand a special small-matrix kernel,
// and about 10 us, so a helper's wake-up pays.
constexpr int64_t kMinSplitMacs = int64_t(1) << 20;
// Where bands may start so that every element of C is summed by the same kernel code as in one
// call. OpenBLAS works column-major, so C's rows are its N dimension, tiled by its kernels' N unroll:
// SkylakeX's and Cooperlake's tiles divide 16 rows, Haswell's (also Zen's) are 12 rows, and bands
// of 16 there changed bits. Along C's columns (its M dimension) Haswell's kernels sum an element by
// a narrower tail kernel or not depending on how the call's columns fall into blocks, which depend
// on the columns' count and k (no alignment of bands keeps them). So with those kernels a product
// of too few rows to split runs in column chunks whose widths depend on n alone, one call each at
// any thread count: the bits of one thread at every count, if not of one call.
struct BandRule {
  int64_t row_align;
  bool column_bands;  // whether C may be split into bands of columns (aligned to 16) by thread count
};

const BandRule& band_rule() {
  static const BandRule rule = [] {
    const char* core = openblas_get_corename();  // after cumulus's own choice (core/threads.cpp)
    const bool haswell = core != nullptr && (strcasecmp(core, "haswell") == 0 || strcasecmp(core, "zen") == 0);
    return haswell ? BandRule{12, false} : BandRule{16, true};
  }();
  return rule;
}

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

// The band size (rows or columns of C, multiples of `align`) that gives each thread about one
// band, or 0: no split.
int64_t band_size(int64_t extent, int64_t macs_per_unit, int64_t align) {
  const int64_t threads = kernel_threads();
  if (threads < 2 || extent < 2 * align) return 0;
  const auto aligned = [align](int64_t x) { return (x + align - 1) / align * align; };
  const int64_t band =
      std::max(aligned((extent + threads - 1) / threads), aligned(kMinSplitMacs / std::max<int64_t>(macs_per_unit, 1)));
  return band < extent ? band : 0;
}

// Columns begin..end of C: those columns of op(B).
void sgemm_columns(bool trans_a, bool trans_b, int64_t m, int64_t begin, int64_t end, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  sgemm(trans_a, trans_b, m, end - begin, k, alpha, a, lda, trans_b ? b + begin * ldb : b + begin, ldb, beta, c + begin,
        ldc);
}

// C in chunks of about kChunkColumns columns (a multiple of 16, from n alone) across the pool, at
// every thread count (BandRule); false when n makes one chunk.
bool sgemm_in_column_chunks(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                            int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  constexpr int64_t kChunkColumns = 128;
  const int64_t chunks = (n + kChunkColumns - 1) / kChunkColumns;
  if (chunks < 2) return false;
  const int64_t width = (n + chunks * 16 - 1) / (chunks * 16) * 16;
  parallel_for((n + width - 1) / width, 1, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i)
      sgemm_columns(trans_a, trans_b, m, i * width, std::min(n, (i + 1) * width), k, alpha, a, lda, b, ldb, beta, c,
                    ldc);
  });
  return true;
}

// C = alpha op(A) op(B) + beta C in bands across the pool; false when the product is too small.
bool sgemm_in_bands(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                    int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (!gemm_splits()) return false;
  const BandRule& rule = band_rule();
  if (!rule.column_bands && m < 2 * rule.row_align)
    return sgemm_in_column_chunks(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  const bool by_rows = m >= n || !rule.column_bands;
  const int64_t band = by_rows ? band_size(m, n * k, rule.row_align) : band_size(n, m * k, 16);
  if (band == 0) return false;
  parallel_for(by_rows ? m : n, band, [&](int64_t begin, int64_t end) {
    if (by_rows)  // rows begin..end of C: those rows of op(A)
      sgemm(trans_a, trans_b, end - begin, n, k, alpha, trans_a ? a + begin : a + begin * lda, lda, b, ldb, beta,
            c + begin * ldc, ldc);
    else sgemm_columns(trans_a, trans_b, m, begin, end, k, alpha, a, lda, b, ldb, beta, c, ldc);
  });
  return true;
}

}  // namespace

void gemm_cpu(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: BLAS leaves c scaled by beta; make beta = 0 well defined too
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  if (gemm_few_rows(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) return;
  if (beta == 0.0f && ldc == n) {
    // OpenBLAS's beta = 0 path is slower than clearing C and accumulating into it (measured:
    // 512 x 784 weight gradient at micro-batch 16, ~250 us against ~150 us). Same result exactly.
    // Cleared across threads, as the product then runs.
    parallel_for(m * n, 4 * kParallelGrain, [&](int64_t begin, int64_t end) {
      std::memset(c + begin, 0, static_cast<std::size_t>(end - begin) * sizeof(float));
    });
    beta = 1.0f;
  }
  if (sgemm_in_bands(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) return;
  sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace cumulus::kernels
