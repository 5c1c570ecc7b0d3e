// The AVX2 loops of the few-row products (Note [Products of few rows] in gemm_few_rows.h): the one
// file of them compiled for AVX2 and FMA, a vector of 16 lanes in two registers of 8, 6 columns of
// C a block (12 accumulators of the 16 registers).
#include "kernels/cpu/gemm_few_rows.h"

#if defined(__x86_64__)
#include "kernels/cpu/gemm_few_rows_cores.h"

namespace cumulus::kernels::vec {
namespace {

struct Avx2Lanes {
  struct Acc {
    __m256 lo, hi;  // lanes 0-7, 8-15
  };
  static constexpr int64_t kColumns = kFewRowsColumns;
  static Acc zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static Acc load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static void store(float* p, Acc a) {
    _mm256_store_ps(p, a.lo);
    _mm256_store_ps(p + 8, a.hi);
  }
  static Acc fma(const float* b, Acc a, Acc acc) {
    const __m256 w = _mm256_broadcast_ss(b);
    return {_mm256_fmadd_ps(w, a.lo, acc.lo), _mm256_fmadd_ps(w, a.hi, acc.hi)};
  }
};

}  // namespace

void pack_few_rows(const float* a, int64_t rows, int64_t k, int64_t row_step, int64_t k_step, float* at) {
  FewRowsCores<Avx2Lanes>::pack(a, rows, k, row_step, k_step, at);
}

void few_rows_product(const FewRowsPanel& a, const FewRowsOperand& b, const FewRowsOutput& c) {
  FewRowsCores<Avx2Lanes>::product(a, b, c);
}

}  // namespace cumulus::kernels::vec
#endif
