// sum_squares_cpu (the gradient norm pass of every optimizer step that clips or guards against
// non-finite gradients) on the seed MLP's 669,706 gradients, mean of 2000 calls after 100 warm-up
// ones. Built against an engine build:
//   g++ -O2 -std=c++17 sum_squares.cpp -L build/lib -lcumulus_engine -Wl,-rpath,$PWD/build/lib
#include <chrono>
#include <cstdio>
#include <vector>
#include <cstdint>
namespace cumulus::kernels { double sum_squares_cpu(const float* x, int64_t n); }
int main() {
  const int64_t n = 669706;
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = 1e-3f * static_cast<float>((i * 7919) % 1000 - 500);
  double s = 0;
  for (int i = 0; i < 100; ++i) s += cumulus::kernels::sum_squares_cpu(x.data(), n);
  auto t0 = std::chrono::steady_clock::now();
  const int reps = 2000;
  for (int i = 0; i < reps; ++i) s += cumulus::kernels::sum_squares_cpu(x.data(), n);
  double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
  printf("sum_squares_cpu n=%lld: %.1f us (%g)\n", (long long)n, us, s);
}
