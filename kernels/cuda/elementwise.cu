// Elementwise ops on CUDA: one thread per element over a grid-stride loop. Where beta is 0 the
// destination is never read.
#include "cumulus/core/cuda_check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace cumulus::kernels {

namespace {

using cuda_common::blend;
using cuda_common::blocks_for;
using cuda_common::kThreads;

__global__ void broadcast_rows_kernel(const float* row, int64_t rows, int64_t cols, float* out) {
  CUMULUS_GRID_STRIDE_LOOP(i, rows * cols) out[i] = row[i % cols];
}

// NaN propagates as on the CPU (kernels/cpu/elementwise.cpp): `x <= 0 ? 0 : x`, never fmaxf(x, 0),
// which returns 0 for NaN.
__global__ void relu_forward_kernel(const float* x, float* y, int64_t n) {
  CUMULUS_GRID_STRIDE_LOOP(i, n) y[i] = x[i] <= 0.0f ? 0.0f : x[i];
}

__global__ void relu_backward_kernel(const float* y, const float* dy, float beta, float* dx, int64_t n) {
  CUMULUS_GRID_STRIDE_LOOP(i, n) dx[i] = blend(y[i] <= 0.0f ? 0.0f : dy[i], beta, dx[i]);
}

__global__ void fill_kernel(float* out, float value, int64_t n) {
  CUMULUS_GRID_STRIDE_LOOP(i, n) out[i] = value;
}

__global__ void fill_from_scalar_kernel(const float* scalar, float scale, float beta, float* out, int64_t n) {
  const float v = scale * scalar[0];
  CUMULUS_GRID_STRIDE_LOOP(i, n) out[i] = blend(v, beta, out[i]);
}

__global__ void accumulate_kernel(const float* x, float beta, float* y, int64_t n) {
  CUMULUS_GRID_STRIDE_LOOP(i, n) y[i] = blend(x[i], beta, y[i]);
}

__global__ void narrow_kernel(const float* x, uint16_t* y, int64_t n, Float16 type) {
  if (type == Float16::bf16) CUMULUS_GRID_STRIDE_LOOP(i, n) y[i] = f32_to_bf16(x[i]);
  else CUMULUS_GRID_STRIDE_LOOP(i, n) y[i] = f32_to_f16(x[i]);
}

__global__ void widen_kernel(const uint16_t* x, float* y, int64_t n, Float16 type) {
  if (type == Float16::bf16) CUMULUS_GRID_STRIDE_LOOP(i, n) y[i] = bf16_to_f32(x[i]);
  else CUMULUS_GRID_STRIDE_LOOP(i, n) y[i] = f16_to_f32(x[i]);
}

// accumulate_kernel's arithmetic with beta 1, per pair (passed by value: captured with the graph).
__global__ void add_vectors_kernel(VectorAdds adds) {
  const int p = blockIdx.x;
  const float* x = adds.x[p];
  float* y = adds.y[p];
  for (int64_t i = threadIdx.x; i < adds.n[p]; i += blockDim.x) y[i] = blend(x[i], 1.0f, y[i]);
}

}  // namespace

void broadcast_rows_cuda(const float* row, int64_t rows, int64_t cols, float* out, cudaStream_t stream) {
  if (rows * cols == 0) return;
  broadcast_rows_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(row, rows, cols, out);
  CUMULUS_LAUNCH_CHECK();
}

void relu_forward_cuda(const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  relu_forward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, n);
  CUMULUS_LAUNCH_CHECK();
}

void relu_backward_cuda(const float* y, const float* dy, float beta, float* dx, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  relu_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, dy, beta, dx, n);
  CUMULUS_LAUNCH_CHECK();
}

void fill_cuda(float* out, float value, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  fill_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, value, n);
  CUMULUS_LAUNCH_CHECK();
}

void fill_from_scalar_cuda(const float* scalar, float scale, float beta, float* out, int64_t n,
                           cudaStream_t stream) {
  if (n == 0) return;
  fill_from_scalar_kernel<<<blocks_for(n), kThreads, 0, stream>>>(scalar, scale, beta, out, n);
  CUMULUS_LAUNCH_CHECK();
}

void accumulate_cuda(const float* x, float beta, float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  accumulate_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, beta, y, n);
  CUMULUS_LAUNCH_CHECK();
}

void narrow_cuda(const float* x, uint16_t* y, int64_t n, Float16 type, cudaStream_t stream) {
  if (n == 0) return;
  narrow_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, n, type);
  CUMULUS_LAUNCH_CHECK();
}

void widen_cuda(const uint16_t* x, float* y, int64_t n, Float16 type, cudaStream_t stream) {
  if (n == 0) return;
  widen_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, n, type);
  CUMULUS_LAUNCH_CHECK();
}

void add_vectors_cuda(const VectorAdds& adds, cudaStream_t stream) {
  if (adds.count == 0) return;
  add_vectors_kernel<<<static_cast<unsigned>(adds.count), kThreads, 0, stream>>>(adds);
  CUMULUS_LAUNCH_CHECK();
}

}  // namespace cumulus::kernels
