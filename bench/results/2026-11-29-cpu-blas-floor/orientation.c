// One thread of OpenBLAS (OPENBLAS_NUM_THREADS=1), a Linear's products at a few rows asked three
// ways: Y = X W^T as the Linear asks it (row-major NT), Y^T = W X^T (the same product transposed:
// W is then packed by OpenBLAS's untransposed copy) with and without transposing Y^T back; and the
// input gradient dX = dY W against dX^T = W^T dY^T transposed back. Best of 7 x 50 calls, in us.
// Build: gcc -O2 orientation.c -o orientation -lopenblas
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static float* random_floats(long n) {
  float* p = aligned_alloc(64, n * 4 + 64);
  for (long i = 0; i < n; i++) p[i] = (float)rand() / RAND_MAX - 0.5f;
  return p;
}

static void transpose(const float* src, int rows, int cols, float* dst) {  // dst[c][r] = src[r][c]
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) dst[c * rows + r] = src[r * cols + c];
}

// M rows, N out features, K in features.
static void forward(int M, int N, int K) {
  float *X = random_floats((long)M * K), *W = random_floats((long)N * K), *Y = random_floats((long)M * N),
        *Yt = random_floats((long)M * N);
  double plain = 1e9, swapped = 1e9, swapped_back = 1e9;
  for (int r = 0; r < 7; r++) {
    double t = now();
    for (int i = 0; i < 50; i++)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.f, X, K, W, K, 0.f, Y, N);
    double e = (now() - t) / 50;
    if (e < plain) plain = e;
    t = now();
    for (int i = 0; i < 50; i++)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, M, K, 1.f, W, K, X, K, 0.f, Yt, M);
    e = (now() - t) / 50;
    if (e < swapped) swapped = e;
    t = now();
    for (int i = 0; i < 50; i++) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, M, K, 1.f, W, K, X, K, 0.f, Yt, M);
      transpose(Yt, N, M, Y);
    }
    e = (now() - t) / 50;
    if (e < swapped_back) swapped_back = e;
  }
  printf("forward M=%-3d N=%-4d K=%-4d  Y = X W^T %7.1f | Y^T = W X^T %7.1f | + transpose back %7.1f\n", M, N, K,
         plain * 1e6, swapped * 1e6, swapped_back * 1e6);
  free(X), free(W), free(Y), free(Yt);
}

static void input_gradient(int M, int N, int K) {
  float *dY = random_floats((long)M * N), *W = random_floats((long)N * K), *dX = random_floats((long)M * K),
        *dXt = random_floats((long)M * K);
  double plain = 1e9, swapped_back = 1e9;
  for (int r = 0; r < 7; r++) {
    double t = now();
    for (int i = 0; i < 50; i++)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1.f, dY, N, W, K, 0.f, dX, K);
    double e = (now() - t) / 50;
    if (e < plain) plain = e;
    t = now();
    for (int i = 0; i < 50; i++) {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasTrans, K, M, N, 1.f, W, K, dY, N, 0.f, dXt, M);
      transpose(dXt, K, M, dX);
    }
    e = (now() - t) / 50;
    if (e < swapped_back) swapped_back = e;
  }
  printf("dx      M=%-3d N=%-4d K=%-4d  dX = dY W %7.1f | dX^T = W^T dY^T + transpose back %7.1f\n", M, N, K,
         plain * 1e6, swapped_back * 1e6);
  free(dY), free(W), free(dX), free(dXt);
}

int main(void) {
  const int forward_shapes[][3] = {{4, 512, 784},  {8, 512, 784},  {16, 512, 784}, {16, 512, 512},
                                   {24, 512, 784}, {32, 512, 784}, {32, 512, 512}, {48, 512, 784},
                                   {64, 512, 784}, {16, 128, 128}, {16, 384, 128}, {16, 65, 128},
                                   {16, 10, 512}};
  for (unsigned s = 0; s < sizeof forward_shapes / sizeof forward_shapes[0]; s++)
    forward(forward_shapes[s][0], forward_shapes[s][1], forward_shapes[s][2]);
  const int dx_shapes[][3] = {{16, 512, 512}, {16, 512, 784}, {16, 10, 512}, {32, 512, 512}};
  for (unsigned s = 0; s < sizeof dx_shapes / sizeof dx_shapes[0]; s++)
    input_gradient(dx_shapes[s][0], dx_shapes[s][1], dx_shapes[s][2]);
  return 0;
}
