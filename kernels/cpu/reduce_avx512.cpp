// The AVX-512 cores of the sums over dimensions (kernels/cpu/vec_reduce.h): the one file of them
// compiled for AVX-512F and F16C, without contraction; the loops are kernels/cpu/reduce_vec_cores.h's,
// with 8 lanes in one register of 8 doubles (a load of 8 floats widens into one register). A term
// is added as a fused multiply-add by 1 (the product exact, then one rounding of acc + term: the
// add's bits), which runs on the multiply ports rather than on the add ports beside the widening
// conversions: a sum over the last dimension of [8, 64, 128] 6.2 -> 5.7 us on Zen 4 (AVX2's lanes
// keep the add, whose shorter latency their column sums need).
#include "kernels/cpu/vec_reduce.h"

#if defined(__x86_64__)
// GCC 12's _mm512_cvtps_pd and _mm512_cvtpd_ps start from an undefined register, which
// -Wmaybe-uninitialized reports at every call once inlined: a false alarm of the header.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "kernels/cpu/reduce_vec_cores.h"

namespace cumulus::kernels::vec512 {
namespace {

struct Avx512Lanes {
  struct Acc8 {
    __m512d v;
  };
  static constexpr int kColumnVecs = 4;
  static Acc8 zero() { return {_mm512_setzero_pd()}; }
  static void add(Acc8& acc, __m256 f) { acc.v = _mm512_fmadd_pd(_mm512_cvtps_pd(f), _mm512_set1_pd(1.0), acc.v); }
  static void store(const Acc8& acc, double divisor, float* y) {
    _mm256_storeu_ps(y, _mm512_cvtpd_ps(_mm512_div_pd(acc.v, _mm512_set1_pd(divisor))));
  }
  static Acc8 plus(const Acc8& a, const Acc8& b) { return {_mm512_add_pd(a.v, b.v)}; }
  static double total(const Acc8& acc) {
    return partials_total(_mm512_castpd512_pd256(acc.v), _mm512_extractf64x4_pd(acc.v, 1));
  }
};

}  // namespace

void sum_columns(const void* x, ReduceStorage storage, const int64_t* run_offsets, int64_t runs, int64_t run_len,
                 int64_t step, int64_t n, double divisor, float* y) {
  ReduceCores<Avx512Lanes>::sum_columns(x, storage, run_offsets, runs, run_len, step, n, divisor, y);
}

void sum_rows(const void* x, ReduceStorage storage, const int64_t* bases, int64_t count, const int64_t* run_offsets,
              int64_t runs, int64_t run_len, double divisor, float* y) {
  ReduceCores<Avx512Lanes>::sum_rows(x, storage, bases, count, run_offsets, runs, run_len, divisor, y);
}

}  // namespace cumulus::kernels::vec512
#endif
