// Few-row products on the vector path this CPU takes (Note [Products of few rows] in
// gemm_few_rows.h), or the scalar loop of the same operations, across the kernel threads.
#include "kernels/cpu/gemm_few_rows.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace cumulus::kernels {
namespace {

// Where these loops beat OpenBLAS (bench/results/2026-11-29-cpu-few-rows/: Zen 4, one thread, 4-64
// rows against 512-3072 columns and depths): where op(B) is transposed (a Linear's weight in its
// forward), at up to 64 rows whose last block of 16 lanes is at least 3/4 full (12-16, 28-32,
// 44-48, 60-64 rows), in 0.61-0.80x its time at up to 32 rows and 0.82-0.92x at 48-64, on both
// vector paths; where op(B) lies in rows (the weight in the input gradient), only at 16 rows and
// for an op(B) of up to 2.5 MiB, in 0.72-0.89x (AVX-512) and 0.81-1.00x (AVX2): a block of columns
// walks op(B) down its rows, half a cache line or less a row, which a larger op(B) or fewer rows
// do not pay for. Below 32 columns or a depth of 16 (a Linear of 10 outputs, or of 10 inputs)
// OpenBLAS's small-product paths win.
bool measured_faster(bool trans_b, int64_t m, int64_t n, int64_t k) {
  constexpr int64_t kMaxWalkedB = (int64_t(5) << 20) / 2 / int64_t(sizeof(float));  // floats: 2.5 MiB
  if (n < 32 || k < 16) return false;
  if (trans_b) return m <= 4 * kFewRowsLanes && (m - 1) % kFewRowsLanes + 1 >= kFewRowsLanes * 3 / 4;
  return m == kFewRowsLanes && n * k <= kMaxWalkedB;
}

// A block of columns' least work for a helper thread (as gemm.cpp's bands: about 10 us).
constexpr int64_t kMinSplitMacs = int64_t(1) << 20;

void pack_scalar(const float* a, int64_t rows, int64_t k, int64_t row_step, int64_t k_step, float* at) {
  for (int64_t r0 = 0; r0 < rows; r0 += kFewRowsLanes, a += kFewRowsLanes * row_step, at += kFewRowsLanes * k)
    for (int64_t p = 0; p < k; ++p)
      for (int64_t i = 0; i < kFewRowsLanes; ++i)
        at[p * kFewRowsLanes + i] = r0 + i < rows ? a[i * row_step + p * k_step] : 0.0f;
}

void product_scalar(const FewRowsPanel& a, const FewRowsOperand& b, const FewRowsOutput& c) {
  for (int64_t i = 0; i < a.rows; ++i) {
    const float* lane = a.at + (i / kFewRowsLanes) * kFewRowsLanes * a.k + i % kFewRowsLanes;
    for (int64_t j = c.begin; j < c.end; ++j) {
      float acc = 0.0f;
      for (int64_t p = 0; p < a.k; ++p)
        acc = std::fma(b.b[p * b.k_step + j * b.column_step], lane[p * kFewRowsLanes], acc);
      const float product = c.alpha * acc;
      float& out = c.c[i * c.ldc + j];
      out = c.beta == 0.0f ? product : product + c.beta * out;
    }
  }
}

struct FewRowsPath {
  void (*pack)(const float*, int64_t, int64_t, int64_t, int64_t, float*);
  void (*product)(const FewRowsPanel&, const FewRowsOperand&, const FewRowsOutput&);
  int64_t columns;  // a block's
};

const FewRowsPath& path() {
  static const FewRowsPath chosen = [] {
    if (vec512::available())
      return FewRowsPath{vec512::pack_few_rows, vec512::few_rows_product, vec512::kFewRowsColumns};
    if (vec::available()) return FewRowsPath{vec::pack_few_rows, vec::few_rows_product, vec::kFewRowsColumns};
    return FewRowsPath{pack_scalar, product_scalar, 8};
  }();
  return chosen;
}

}  // namespace

bool gemm_few_rows(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                   int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (!measured_faster(trans_b, m, n, k)) return false;
  const FewRowsPath& p = path();
  const int64_t lane_rows = (m + kFewRowsLanes - 1) / kFewRowsLanes * kFewRowsLanes;
  // The packed rows of A: at most 64 x k floats, kept by each calling thread for its next call.
  thread_local std::vector<float> panel;
  panel.resize(static_cast<std::size_t>(lane_rows * k));
  p.pack(a, m, k, trans_a ? 1 : lda, trans_a ? lda : 1, panel.data());
  const FewRowsPanel pa{panel.data(), m, k};
  const FewRowsOperand ob{b, trans_b ? 1 : ldb, trans_b ? ldb : 1};
  const int64_t blocks = (n + p.columns - 1) / p.columns;
  const int64_t grain = std::max<int64_t>(1, kMinSplitMacs / (lane_rows * k * p.columns));
  parallel_for(blocks, grain, [&](int64_t first, int64_t last) {
    p.product(pa, ob, FewRowsOutput{c, ldc, first * p.columns, std::min(n, last * p.columns), alpha, beta});
  });
  return true;
}

}  // namespace cumulus::kernels
