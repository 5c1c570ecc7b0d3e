// Elementwise ops on CUDA: one thread per element over a grid-stride loop. Where beta is 0 the
// destination is never read.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace cumulus::kernels {

namespace {

using cuda_common::store_blend;
using cuda_common::blocks_for;
using cuda_common::kThreads;
using cuda_common::launch;

// Every kernel templated over T loads with to_f32 and stores with from_f32<T> (float16.h): the
// arithmetic is f32 and a 16-bit store rounds once; for float both are the identity.
template <typename T>
__global__ void broadcast_rows_kernel(const float* row, int64_t rows, int64_t cols, T* out) {
  CUMULUS_GRID_STRIDE_LOOP(i, rows * cols) out[i] = from_f32<T>(row[i % cols]);
}

// NaN propagates as on the CPU (kernels/cpu/elementwise.cpp): `x <= 0 ? 0 : x`, never fmaxf(x, 0),
// which returns 0 for NaN. A kept x is stored as is: no rounding, and a 16-bit NaN keeps its bits.
template <typename T>
__global__ void relu_forward_kernel(const T* x, T* y, int64_t n) {
  CUMULUS_GRID_STRIDE_LOOP(i, n) y[i] = to_f32(x[i]) <= 0.0f ? from_f32<T>(0.0f) : x[i];
}

// Beta 0 passes dy through as is where y > 0 (relu_backward_cpu's bits); otherwise the blend is f32,
// rounded once.
template <typename T>
__global__ void relu_backward_kernel(const T* y, const T* dy, float beta, T* dx, int64_t n) {
  if (beta == 0.0f) {
    CUMULUS_GRID_STRIDE_LOOP(i, n) dx[i] = to_f32(y[i]) <= 0.0f ? from_f32<T>(0.0f) : dy[i];
  } else {
    CUMULUS_GRID_STRIDE_LOOP(i, n) {
      const float v = to_f32(y[i]) <= 0.0f ? 0.0f : to_f32(dy[i]);
      store_blend(dx + i, v, beta);
    }
  }
}

__global__ void fill_kernel(float* out, float value, int64_t n) {
  CUMULUS_GRID_STRIDE_LOOP(i, n) out[i] = value;
}

__global__ void fill_from_scalar_kernel(const float* scalar, float scale, float beta, float* out, int64_t n) {
  const float v = scale * scalar[0];
  CUMULUS_GRID_STRIDE_LOOP(i, n) store_blend(out + i, v, beta);
}

// Beta 0 copies x as is (accumulate_cpu's std::copy), so y never changes x's bits.
template <typename T>
__global__ void accumulate_kernel(const T* x, float beta, T* y, int64_t n) {
  if (beta == 0.0f) CUMULUS_GRID_STRIDE_LOOP(i, n) y[i] = x[i];
  else CUMULUS_GRID_STRIDE_LOOP(i, n) store_blend(y + i, to_f32(x[i]), beta);
}

// Through f32, as convert_cpu: widening is exact, so a 16-bit to 16-bit conversion rounds once.
template <typename From, typename To>
__global__ void convert_kernel(const From* x, To* y, int64_t n) {
  CUMULUS_GRID_STRIDE_LOOP(i, n) y[i] = from_f32<To>(to_f32(x[i]));
}

// accumulate_kernel's arithmetic with beta 1, per pair (passed by value: captured with the graph).
__global__ void add_vectors_kernel(VectorAdds adds) {
  const int p = blockIdx.x;
  const float* x = adds.x[p];
  float* y = adds.y[p];
  for (int64_t i = threadIdx.x; i < adds.n[p]; i += blockDim.x) store_blend(y + i, x[i], 1.0f);
}

}  // namespace

template <typename T>
void broadcast_rows_cuda(const float* row, int64_t rows, int64_t cols, T* out, cudaStream_t stream) {
  if (rows * cols == 0) return;
  launch<broadcast_rows_kernel<T>>(blocks_for(rows * cols), kThreads, stream, row, rows, cols, out);
}

template <typename T>
void relu_forward_cuda(const T* x, T* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch<relu_forward_kernel<T>>(blocks_for(n), kThreads, stream, x, y, n);
}

template <typename T>
void relu_backward_cuda(const T* y, const T* dy, float beta, T* dx, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch<relu_backward_kernel<T>>(blocks_for(n), kThreads, stream, y, dy, beta, dx, n);
}

void fill_cuda(float* out, float value, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch<fill_kernel>(blocks_for(n), kThreads, stream, out, value, n);
}

void fill_from_scalar_cuda(const float* scalar, float scale, float beta, float* out, int64_t n,
                           cudaStream_t stream) {
  if (n == 0) return;
  launch<fill_from_scalar_kernel>(blocks_for(n), kThreads, stream, scalar, scale, beta, out, n);
}

template <typename T>
void accumulate_cuda(const T* x, float beta, T* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch<accumulate_kernel<T>>(blocks_for(n), kThreads, stream, x, beta, y, n);
}

template <typename From, typename To>
void convert_cuda(const From* x, To* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch<convert_kernel<From, To>>(blocks_for(n), kThreads, stream, x, y, n);
}

void add_vectors_cuda(const VectorAdds& adds, cudaStream_t stream) {
  if (adds.count == 0) return;
  launch<add_vectors_kernel>(static_cast<unsigned>(adds.count), kThreads, stream, adds);
}

#define CUMULUS_INSTANTIATE(T)                                                            \
  template void broadcast_rows_cuda(const float*, int64_t, int64_t, T*, cudaStream_t);    \
  template void relu_forward_cuda(const T*, T*, int64_t, cudaStream_t);                   \
  template void relu_backward_cuda(const T*, const T*, float, T*, int64_t, cudaStream_t); \
  template void accumulate_cuda(const T*, float, T*, int64_t, cudaStream_t);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

// The pairs convert_cpu is instantiated for.
template void convert_cuda(const float*, BFloat16*, int64_t, cudaStream_t);
template void convert_cuda(const float*, Half*, int64_t, cudaStream_t);
template void convert_cuda(const BFloat16*, float*, int64_t, cudaStream_t);
template void convert_cuda(const Half*, float*, int64_t, cudaStream_t);
template void convert_cuda(const BFloat16*, Half*, int64_t, cudaStream_t);
template void convert_cuda(const Half*, BFloat16*, int64_t, cudaStream_t);

}  // namespace cumulus::kernels
