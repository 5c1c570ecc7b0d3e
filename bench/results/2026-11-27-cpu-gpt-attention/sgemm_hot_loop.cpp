// The GPT large config's GEMM shapes (M = 8 x 256 tokens) in a hot loop, one thread, the best of 30:
// g++ -O2 sgemm_hot_loop.cpp -o g -lopenblas && OPENBLAS_CORETYPE=SkylakeX OPENBLAS_NUM_THREADS=1 ./g
// (the row-major cblas names: "fwd nt" is x W^T, "bwd dx nn" dy W, "bwd dW tn" dy^T x; "(Wt)" a transposed copy of W).
#include <cblas.h>
#include <chrono>
#include <cstdio>
#include <vector>
#include <cstring>
using C = std::chrono::steady_clock;
int main() {
  const int M = 2048;
  int shapes[][2] = {{256, 768}, {256, 256}, {256, 1024}, {1024, 256}};
  for (auto& s : shapes) {
    int K = s[0], N = s[1];
    std::vector<float> x(M * K, 0.5f), w(N * K, 0.25f), y(M * N), dy(M*N, 0.1f), dx(M*K), dw(N*K);
    auto bench = [&](const char* name, auto f) {
      double best = 1e9;
      for (int r = 0; r < 30; ++r) { auto t0 = C::now(); f(); double t = std::chrono::duration<double>(C::now() - t0).count(); if (t < best) best = t; }
      printf("K=%4d N=%4d %-28s %7.3f ms %6.1f GFLOP/s\n", K, N, name, best * 1e3, 2.0 * M * N * K / best / 1e9);
    };
    bench("fwd nt beta0", [&] { cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, x.data(), K, w.data(), K, 0, y.data(), N); });
    bench("fwd nt memset+beta1", [&] { memset(y.data(), 0, 4*M*N); cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, x.data(), K, w.data(), K, 1, y.data(), N); });
    bench("fwd nn (Wt) beta1", [&] { cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1, x.data(), K, w.data(), N, 1, y.data(), N); });
    bench("bwd dx nn beta1", [&] { cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1, dy.data(), N, w.data(), K, 1, dx.data(), K); });
    bench("bwd dx nt (Wt) beta1", [&] { cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, K, N, 1, dy.data(), N, w.data(), N, 1, dx.data(), K); });
    bench("bwd dW tn beta1", [&] { cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1, dy.data(), N, x.data(), K, 1, dw.data(), K); });
    bench("bwd dWt tn beta1", [&] { cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, N, M, 1, x.data(), K, dy.data(), N, 1, dw.data(), N); });
  }
}
