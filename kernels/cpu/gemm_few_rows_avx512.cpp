// The AVX-512 loops of the few-row products (Note [Products of few rows] in gemm_few_rows.h): the
// one file of them compiled for AVX-512F, a vector of 16 lanes in one register, 8 columns of C a
// block (each broadcast folded into its multiply-add's load).
#include "kernels/cpu/gemm_few_rows.h"

#if defined(__x86_64__)
#include "kernels/cpu/gemm_few_rows_cores.h"

namespace cumulus::kernels::vec512 {
namespace {

struct Avx512Lanes {
  using Acc = __m512;
  static constexpr int64_t kColumns = kFewRowsColumns;
  static Acc zero() { return _mm512_setzero_ps(); }
  static Acc load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Acc a) { _mm512_store_ps(p, a); }
  static Acc fma(const float* b, Acc a, Acc acc) { return _mm512_fmadd_ps(_mm512_set1_ps(*b), a, acc); }
};

}  // namespace

void pack_few_rows(const float* a, int64_t rows, int64_t k, int64_t row_step, int64_t k_step, float* at) {
  FewRowsCores<Avx512Lanes>::pack(a, rows, k, row_step, k_step, at);
}

void few_rows_product(const FewRowsPanel& a, const FewRowsOperand& b, const FewRowsOutput& c) {
  FewRowsCores<Avx512Lanes>::product(a, b, c);
}

}  // namespace cumulus::kernels::vec512
#endif
