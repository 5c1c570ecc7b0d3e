// The comparison and mask ops on CUDA: one thread per element over a grid-stride loop, each by the
// CPU's rule (kernels/compare_rules.h); a broadcast operand's gradient (where) one thread per element
// of the operand, summing in the CPU's order. Comparisons and selections are exact, and the sums and
// arange's double arithmetic have no product to contract into an FMA, so the results are the CPU's
// bits. Where beta is 0 the destination is never read.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/compare_kernels.h"

namespace cumulus::kernels {

namespace {

using cuda_common::blocks_for;
using cuda_common::kThreads;
using cuda_common::launch;
using cuda_common::store_blend;

template <typename T>
__global__ void compare_forward_kernel(NaryGeometry g, CompareOp op, const T* a, const T* b, uint8_t* y, int64_t n) {
  CUMULUS_GRID_STRIDE_LOOP(i, n) {
    int64_t o[NaryGeometry::kMaxOperands];
    nary_offsets(g, i, o);
    y[i] = compare_apply(op, compare_value(a[o[0]]), compare_value(b[o[1]]));
  }
}

template <typename T>
__global__ void compare_scalar_kernel(CompareOp op, const T* x, CompareScalar s, uint8_t* y, int64_t n) {
  CUMULUS_GRID_STRIDE_LOOP(i, n) y[i] = compare_scalar_apply(op, x[i], s);
}

template <typename E>
__global__ void where_forward_kernel(NaryGeometry g, const uint8_t* cond, const E* a, const E* b, E fill, E* y,
                                     int64_t n) {
  CUMULUS_GRID_STRIDE_LOOP(i, n) y[i] = where_element(g, i, cond, a, b, fill);
}

template <typename T>
__global__ void where_backward_kernel(NaryGeometry g, int operand, const uint8_t* cond, const T* dy, float beta, T* dx,
                                      int64_t n) {
  CUMULUS_GRID_STRIDE_LOOP(j, n) store_blend(dx + j, where_grad_element(g, operand, j, cond, dy), beta);
}

template <typename E>
__global__ void triangle_forward_kernel(Triangle t, const E* x, E* y, int64_t n) {
  CUMULUS_GRID_STRIDE_LOOP(i, n) y[i] = triangle_keeps(t, i) ? x[i] : E(0);
}

template <typename T>
__global__ void triangle_backward_kernel(Triangle t, const T* dy, float beta, T* dx, int64_t n) {
  CUMULUS_GRID_STRIDE_LOOP(i, n) store_blend(dx + i, triangle_keeps(t, i) ? to_f32(dy[i]) : 0.0f, beta);
}

template <typename T>
__global__ void arange_kernel(Arange a, T* y, int64_t n) {
  CUMULUS_GRID_STRIDE_LOOP(i, n) y[i] = arange_value<T>(a, i);
}

template <typename T>
__global__ void bool_to_kernel(const uint8_t* x, T* y, int64_t n) {
  CUMULUS_GRID_STRIDE_LOOP(i, n) y[i] = bool_value<T>(x[i]);
}

}  // namespace

template <typename T>
void compare_forward_cuda(const NaryGeometry& g, CompareOp op, const T* a, const T* b, uint8_t* y,
                          cudaStream_t stream) {
  const int64_t n = g.numel(0);
  if (n > 0) launch<compare_forward_kernel<T>>(blocks_for(n), kThreads, stream, g, op, a, b, y, n);
}

template <typename T>
void compare_scalar_cuda(CompareOp op, const T* x, CompareScalar s, uint8_t* y, int64_t n, cudaStream_t stream) {
  if (n > 0) launch<compare_scalar_kernel<T>>(blocks_for(n), kThreads, stream, op, x, s, y, n);
}

template <typename E>
void where_forward_cuda(const NaryGeometry& g, const uint8_t* cond, const E* a, const E* b, E fill, E* y,
                        cudaStream_t stream) {
  const int64_t n = g.numel(0);
  if (n > 0) launch<where_forward_kernel<E>>(blocks_for(n), kThreads, stream, g, cond, a, b, fill, y, n);
}

template <typename T>
void where_backward_cuda(const NaryGeometry& g, int operand, const uint8_t* cond, const T* dy, float beta, T* dx,
                         cudaStream_t stream) {
  const int64_t n = g.numel(1 + operand);
  if (n > 0) launch<where_backward_kernel<T>>(blocks_for(n), kThreads, stream, g, operand, cond, dy, beta, dx, n);
}

template <typename E>
void triangle_forward_cuda(const Triangle& t, const E* x, E* y, cudaStream_t stream) {
  const int64_t n = t.batch * t.rows * t.cols;
  if (n > 0) launch<triangle_forward_kernel<E>>(blocks_for(n), kThreads, stream, t, x, y, n);
}

template <typename T>
void triangle_backward_cuda(const Triangle& t, const T* dy, float beta, T* dx, cudaStream_t stream) {
  const int64_t n = t.batch * t.rows * t.cols;
  if (n > 0) launch<triangle_backward_kernel<T>>(blocks_for(n), kThreads, stream, t, dy, beta, dx, n);
}

template <typename T>
void arange_cuda(const Arange& a, T* y, int64_t n, cudaStream_t stream) {
  if (n > 0) launch<arange_kernel<T>>(blocks_for(n), kThreads, stream, a, y, n);
}

template <typename T>
void bool_to_cuda(const uint8_t* x, T* y, int64_t n, cudaStream_t stream) {
  if (n > 0) launch<bool_to_kernel<T>>(blocks_for(n), kThreads, stream, x, y, n);
}

#define CUMULUS_COMPARE_TYPES(X) X(float) X(BFloat16) X(Half) X(int32_t) X(int64_t) X(uint8_t)
#define CUMULUS_FLOAT_TYPES(X) X(float) X(BFloat16) X(Half)
#define CUMULUS_BITS_TYPES(X) X(uint8_t) X(uint16_t) X(uint32_t) X(uint64_t)
#define INSTANTIATE_ANY(T)                                                                                           \
  template void compare_forward_cuda<T>(const NaryGeometry&, CompareOp, const T*, const T*, uint8_t*, cudaStream_t); \
  template void compare_scalar_cuda<T>(CompareOp, const T*, CompareScalar, uint8_t*, int64_t, cudaStream_t);         \
  template void bool_to_cuda<T>(const uint8_t*, T*, int64_t, cudaStream_t);
#define INSTANTIATE_FLOAT(T)                                                                                         \
  template void where_backward_cuda<T>(const NaryGeometry&, int, const uint8_t*, const T*, float, T*, cudaStream_t); \
  template void triangle_backward_cuda<T>(const Triangle&, const T*, float, T*, cudaStream_t);
#define INSTANTIATE_BITS(T)                                                                                          \
  template void where_forward_cuda<T>(const NaryGeometry&, const uint8_t*, const T*, const T*, T, T*, cudaStream_t); \
  template void triangle_forward_cuda<T>(const Triangle&, const T*, T*, cudaStream_t);
#define INSTANTIATE_ARANGE(T) template void arange_cuda<T>(const Arange&, T*, int64_t, cudaStream_t);
CUMULUS_COMPARE_TYPES(INSTANTIATE_ANY)
CUMULUS_FLOAT_TYPES(INSTANTIATE_FLOAT)
CUMULUS_BITS_TYPES(INSTANTIATE_BITS)
CUMULUS_FLOAT_TYPES(INSTANTIATE_ARANGE)
INSTANTIATE_ARANGE(int32_t)
INSTANTIATE_ARANGE(int64_t)
INSTANTIATE_ARANGE(uint8_t)  // refused by ops::arange, but its dispatch names it: an -O0 build links it

}  // namespace cumulus::kernels
