// g++ -O2 sgemm_cold_loop.cpp -o cold -lopenblas && OPENBLAS_NUM_THREADS=1 ./cold SETS (24 sets: operands from memory)
// Cold-operand SGEMM: the GPT large shapes with operands rotated through 400+ MB (no cache reuse).
#include <cblas.h>
#include <chrono>
#include <cstdio>
#include <vector>
#include <cstring>
#include <cstdlib>
using C = std::chrono::steady_clock;
int main(int argc, char** argv) {
  const int M = 2048, sets = argc > 1 ? atoi(argv[1]) : 24;
  int shapes[][2] = {{256, 768}, {256, 1024}, {1024, 256}};
  for (auto& s : shapes) {
    int K = s[0], N = s[1];
    std::vector<std::vector<float>> x(sets), w(sets), y(sets), dy(sets);
    for (int i = 0; i < sets; ++i) { x[i].assign(M*K, 0.5f); w[i].assign(N*K, 0.25f); y[i].assign(M*N, 0.f); dy[i].assign(M*N, 0.1f); }
    for (int pass = 0; pass < 2; ++pass) {
      auto t0 = C::now();
      for (int r = 0; r < 3 * sets; ++r) { int i = r % sets;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.f, x[i].data(), K, w[i].data(), K, 1.f, y[i].data(), N); }
      double t = std::chrono::duration<double>(C::now() - t0).count() / (3 * sets);
      auto t1 = C::now();
      for (int r = 0; r < 3 * sets; ++r) { int i = r % sets;  // dW += dy^T x  ([N, K])
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1.f, dy[i].data(), N, x[i].data(), K, 1.f, w[i].data(), K); }
      double t2 = std::chrono::duration<double>(C::now() - t1).count() / (3 * sets);
      if (pass) printf("K=%4d N=%4d sets=%d fwd nt %.3f ms %.1f GFLOP/s | dW tn %.3f ms %.1f GFLOP/s\n", K, N, sets, t*1e3, 2.0*M*N*K/t/1e9, t2*1e3, 2.0*M*N*K/t2/1e9);
    }
  }
}
