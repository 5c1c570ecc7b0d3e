// OpenBLAS's one-thread SGEMM rate at the large GPT's shapes, Y = X W^T as a Linear asks it (row-major
// NT): best of 5 x 10 calls after 3 rounds of warm-up; mkl_rate.py times PyTorch's MKL the same way.
// Build: gcc -O2 blas_rate.c -o blas_rate -lopenblas
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
  const int shapes[][3] = {{2048, 768, 256}, {2048, 1024, 256}, {2048, 256, 1024}, {1024, 1024, 1024}};
  for (int s = 0; s < 4; s++) {
    const int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
    float *x = malloc(sizeof(float) * m * k), *w = malloc(sizeof(float) * n * k), *y = malloc(sizeof(float) * m * n);
    for (long i = 0; i < (long)m * k; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    for (long i = 0; i < (long)n * k; i++) w[i] = (float)rand() / RAND_MAX - 0.5f;
    double best = 1e9;
    for (int r = 0; r < 8; r++) {
      const double t = now();
      for (int i = 0; i < 10; i++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.f, x, k, w, k, 0.f, y, n);
      const double e = (now() - t) / 10;
      if (r >= 3 && e < best) best = e;
    }
    printf("OpenBLAS m=%d n=%d k=%d: %.1f GFLOP/s\n", m, n, k, 2.0 * m * n * k / best / 1e9);
    free(x), free(w), free(y);
  }
  return 0;
}
