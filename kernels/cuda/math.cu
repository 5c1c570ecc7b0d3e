// kernels/cuda/math_kernels.h: one thread per element over grid-stride loops, each element by the
// CPU's rule (kernels/math_rules.h). No arithmetic that nvcc could contract, so the results are
// the CPU's bits. Where beta is 0 the destination is never read.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/math_kernels.h"

namespace cumulus::kernels {

namespace {

using cuda_common::blocks_for;
using cuda_common::kThreads;
using cuda_common::launch;
using cuda_common::store_blend;

template <typename T>
__global__ void clamp_forward_kernel(float lo, float hi, const T* x, T* y, int64_t n) {
  CUMULUS_GRID_STRIDE_LOOP(i, n) y[i] = from_f32<T>(clamp_apply(to_f32(x[i]), lo, hi));
}

template <typename T>
__global__ void clamp_backward_kernel(float lo, float hi, const T* x, const T* dy, float beta, T* dx, int64_t n) {
  CUMULUS_GRID_STRIDE_LOOP(i, n) store_blend(dx + i, clamp_grad(to_f32(dy[i]), to_f32(x[i]), lo, hi), beta);
}

template <typename I>
__global__ void int_binary_forward_kernel(BroadcastGeometry g, BinaryOp op, const I* a, const I* b, I* y, int64_t n) {
  CUMULUS_GRID_STRIDE_LOOP(i, n) {
    int64_t ia, ib;
    broadcast_offsets(g, i, ia, ib);
    y[i] = int_binary_apply(op, a[ia], b[ib]);
  }
}

template <typename From, typename To>
__global__ void int_convert_kernel(const From* x, To* y, int64_t n) {
  CUMULUS_GRID_STRIDE_LOOP(i, n) y[i] = int_convert<To>(x[i]);
}

}  // namespace

template <typename T>
void clamp_forward_cuda(float lo, float hi, const T* x, T* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch<clamp_forward_kernel<T>>(blocks_for(n), kThreads, stream, lo, hi, x, y, n);
}

template <typename T>
void clamp_backward_cuda(float lo, float hi, const T* x, const T* dy, float beta, T* dx, int64_t n,
                         cudaStream_t stream) {
  if (n == 0) return;
  launch<clamp_backward_kernel<T>>(blocks_for(n), kThreads, stream, lo, hi, x, dy, beta, dx, n);
}

template <typename I>
void int_binary_forward_cuda(const BroadcastGeometry& g, BinaryOp op, const I* a, const I* b, I* y,
                             cudaStream_t stream) {
  const int64_t n = g.numel(0);
  if (n == 0) return;
  launch<int_binary_forward_kernel<I>>(blocks_for(n), kThreads, stream, g, op, a, b, y, n);
}

template <typename From, typename To>
void int_convert_cuda(const From* x, To* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch<int_convert_kernel<From, To>>(blocks_for(n), kThreads, stream, x, y, n);
}

#define CUMULUS_INSTANTIATE(T)                                                         \
  template void clamp_forward_cuda(float, float, const T*, T*, int64_t, cudaStream_t); \
  template void clamp_backward_cuda(float, float, const T*, const T*, float, T*, int64_t, cudaStream_t);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

template void int_binary_forward_cuda(const BroadcastGeometry&, BinaryOp, const int32_t*, const int32_t*, int32_t*,
                                      cudaStream_t);
template void int_binary_forward_cuda(const BroadcastGeometry&, BinaryOp, const int64_t*, const int64_t*, int64_t*,
                                      cudaStream_t);

#define CUMULUS_INSTANTIATE(From)                                                \
  template void int_convert_cuda(const From*, int64_t*, int64_t, cudaStream_t);  \
  template void int_convert_cuda(const From*, float*, int64_t, cudaStream_t);    \
  template void int_convert_cuda(const From*, BFloat16*, int64_t, cudaStream_t); \
  template void int_convert_cuda(const From*, Half*, int64_t, cudaStream_t);
CUMULUS_INSTANTIATE(int32_t)
CUMULUS_INSTANTIATE(int64_t)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
