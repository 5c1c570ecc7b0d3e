// One thread: the library's few-row loops (kernels/cpu/gemm_few_rows.h, both vector paths, called
// directly so that every shape runs them) against OpenBLAS's cblas_sgemm on the same product,
// C[m, n] = A[m, k] op(B) with op(B) a Linear's weight transposed (T: its forward) or in rows (N: its
// input gradient). Best of 5 repetitions of 20 calls. Built and run by run.sh.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/cpu/gemm_few_rows.h"

using namespace cumulus::kernels;

template <typename F>
double best_us(F f) {
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 20; ++i) f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 20);
  }
  return best * 1e6;
}

int main() {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int shapes[][2] = {{512, 784}, {512, 512}, {768, 768}, {3072, 768}, {768, 3072}};
  std::printf("op(B) n k m blas_us avx512_us avx2_us avx512/blas avx2/blas\n");
  for (const auto& nk : shapes)
    for (const bool trans_b : {true, false})
      for (const int m : {4, 8, 12, 16, 24, 32, 48, 64}) {
        const int n = nk[0], k = nk[1];
        std::vector<float> a(m * k), b(k * n), c(m * n), at(64 * k);
        for (float& x : a) x = u(gen);
        for (float& x : b) x = u(gen);
        const int ldb = trans_b ? k : n;
        const FewRowsOperand ob{b.data(), trans_b ? 1 : ldb, trans_b ? ldb : 1};
        const double blas = best_us([&] {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a.data(), k,
                      b.data(), ldb, 0.0f, c.data(), n);
        });
        const double z = best_us([&] {
          vec512::pack_few_rows(a.data(), m, k, k, 1, at.data());
          vec512::few_rows_product({at.data(), m, k}, ob, {c.data(), n, 0, n, 1.0f, 0.0f});
        });
        const double y = best_us([&] {
          vec::pack_few_rows(a.data(), m, k, k, 1, at.data());
          vec::few_rows_product({at.data(), m, k}, ob, {c.data(), n, 0, n, 1.0f, 0.0f});
        });
        std::printf("%s %d %d %d %.1f %.1f %.1f %.2f %.2f\n", trans_b ? "T" : "N", n, k, m, blas, z, y, z / blas,
                    y / blas);
      }
}
