// Reductions on CUDA.
//   sum_rows: out[c] = sum_r x[r, c] (+ beta * out[c]): the bias gradient, accumulated in its own
//             kernel (Note [Gradient sinks]). One thread per column walks the rows, so neighbouring
//             threads read neighbouring addresses; the order is fixed, so results are reproducible.
//   sum_all:  one block, cuda_common::block_sum_all: deterministic (no atomics), and enough for
//             the scalars we reduce (losses, small x).
//   argmax_rows: one thread per row.
// x may be stored in 16 bits (to_f32 loads it); the sums and comparisons are f32.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace cumulus::kernels {

namespace {

using cuda_common::kThreads;
using cuda_common::launch;

template <typename T>
__global__ void sum_rows_kernel(const T* x, int64_t rows, int64_t cols, float beta, float* out) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  float s = 0.0f;
  for (int64_t r = 0; r < rows; ++r) s += to_f32(x[r * cols + c]);
  out[c] = beta == 0.0f ? s : s + beta * out[c];
}

__global__ void sum_all_kernel(const float* x, int64_t n, float scale, float* out) {
  const float total = cuda_common::block_sum_all(x, n);
  if (threadIdx.x == 0) out[0] = scale * total;
}

template <typename T>
__global__ void argmax_rows_kernel(const T* x, int64_t rows, int64_t cols, int32_t* out) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= rows) return;
  const T* xr = x + r * cols;
  int32_t best = 0;
  for (int64_t j = 1; j < cols; ++j)
    if (to_f32(xr[j]) > to_f32(xr[best])) best = static_cast<int32_t>(j);
  out[r] = best;
}

// One thread per element, uncapped: these kernels are not grid-stride loops.
inline unsigned blocks(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

template <typename T>
void sum_rows_cuda(const T* x, int64_t rows, int64_t cols, float beta, float* out, cudaStream_t stream) {
  if (cols == 0) return;
  launch<sum_rows_kernel<T>>(blocks(cols), kThreads, stream, x, rows, cols, beta, out);
}

void sum_all_cuda(const float* x, int64_t n, float scale, float* out, cudaStream_t stream) {
  launch<sum_all_kernel>(1, kThreads, stream, x, n, scale, out);
}

template <typename T>
void argmax_rows_cuda(const T* x, int64_t rows, int64_t cols, int32_t* out, cudaStream_t stream) {
  if (rows == 0) return;
  launch<argmax_rows_kernel<T>>(blocks(rows), kThreads, stream, x, rows, cols, out);
}

#define CUMULUS_INSTANTIATE(T)                                                          \
  template void sum_rows_cuda(const T*, int64_t, int64_t, float, float*, cudaStream_t); \
  template void argmax_rows_cuda(const T*, int64_t, int64_t, int32_t*, cudaStream_t);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
