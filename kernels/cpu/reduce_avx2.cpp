// The AVX2 cores of the sums over dimensions (kernels/cpu/vec_reduce.h): the one file of them
// compiled for AVX2 and F16C, without contraction; the loops are kernels/cpu/reduce_vec_cores.h's,
// with 8 lanes in two registers of 4 doubles.
#include "kernels/cpu/vec_reduce.h"

#if defined(__x86_64__)
#include "kernels/cpu/reduce_vec_cores.h"

namespace cumulus::kernels::vec {
namespace {

struct Avx2Lanes {
  struct Acc8 {
    __m256d lo, hi;  // lanes 0-3, 4-7
  };
  static constexpr int kColumnVecs = 2;
  static Acc8 zero() { return {_mm256_setzero_pd(), _mm256_setzero_pd()}; }
  static void add(Acc8& acc, __m256 f) {
    acc.lo = _mm256_add_pd(acc.lo, _mm256_cvtps_pd(_mm256_castps256_ps128(f)));
    acc.hi = _mm256_add_pd(acc.hi, _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)));
  }
  static void store(const Acc8& acc, double divisor, float* y) {
    const __m256d d = _mm256_set1_pd(divisor);
    const __m128 lo = _mm256_cvtpd_ps(_mm256_div_pd(acc.lo, d)), hi = _mm256_cvtpd_ps(_mm256_div_pd(acc.hi, d));
    _mm256_storeu_ps(y, _mm256_set_m128(hi, lo));
  }
  static Acc8 plus(const Acc8& a, const Acc8& b) { return {_mm256_add_pd(a.lo, b.lo), _mm256_add_pd(a.hi, b.hi)}; }
  static double total(const Acc8& acc) { return partials_total(acc.lo, acc.hi); }
};

}  // namespace

void sum_columns(const void* x, ReduceStorage storage, const int64_t* run_offsets, int64_t runs, int64_t run_len,
                 int64_t step, int64_t n, double divisor, float* y) {
  ReduceCores<Avx2Lanes>::sum_columns(x, storage, run_offsets, runs, run_len, step, n, divisor, y);
}

void sum_rows(const void* x, ReduceStorage storage, const int64_t* bases, int64_t count, const int64_t* run_offsets,
              int64_t runs, int64_t run_len, double divisor, float* y) {
  ReduceCores<Avx2Lanes>::sum_rows(x, storage, bases, count, run_offsets, runs, run_len, divisor, y);
}

}  // namespace cumulus::kernels::vec
#endif
