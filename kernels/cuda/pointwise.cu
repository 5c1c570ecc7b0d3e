// The pointwise ops on CUDA. Elementwise kernels: one thread per element over a grid-stride loop,
// each element by the CPU's rule (kernels/pointwise_rules.h). A broadcast operand's gradient: one
// thread per element of the operand, summing the output elements that read it in the CPU's order
// (Note [Broadcast geometry]), so no atomics and the same bits on every run. Against the CPU the
// results are close, not the same bits (Note [CUDA bit parity] in CMakeLists.txt): nvcc fuses
// multiply-adds (the gradient rules, the broadcast sums of products: within one rounding per
// fused step), and the unary ops, pow and softmax use the device's expf, logf, powf, tanhf and
// erff (up to 2 ulp each against glibc's or SLEEF's), so tanh, sigmoid, gelu, exp, log, pow and
// softmax and their gradients agree with the CPU to within a few ulp of f32 per function call
// (relative 1e-6 away from cancellation; gelu's 1 + erff near x = -4 and below cancels, so there an
// absolute 1e-7). add/sub/mul/div, maximum/minimum, sqrt, rsqrt (1 / sqrtf) and abs forward are
// IEEE operations rounded as on the CPU (nvcc's default -prec-div and -prec-sqrt) and match its
// bits. Softmax: one warp per row, the maximum and the sums (in double, as the CPU's) reduced with
// shuffles, as cross_entropy's kernels. The broadcast gradient sums are in double too
// (broadcast_grad_element). Where beta is 0 the destination is never read.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/pointwise_kernels.h"
#include "kernels/cuda/unroll.cuh"

namespace cumulus::kernels {

namespace {

using cuda_common::store_blend_rounded;
using cuda_common::blocks_for;
using cuda_common::kThreads;
using cuda_common::launch;

template <typename T>
__global__ void binary_forward_kernel(BroadcastGeometry g, BinaryOp op, const T* a, const T* b, T* y, int64_t n) {
  CUMULUS_GRID_STRIDE_LOOP(i, n) {
    int64_t ia, ib;
    broadcast_offsets(g, i, ia, ib);
    y[i] = from_f32<T>(binary_apply(op, to_f32(a[ia]), to_f32(b[ib])));
  }
}

// broadcast_grad_element (kernels/pointwise_rules.h) with its odometer in registers: the counters
// are indexed only by loops over the kMaxDims dimensions that are unrolled at compile time, where
// GradWalk's list of reduced dimensions, indexed at run time, would put the walk in a stack frame.
// The same terms in the same order (the reduced dimensions innermost first, row-major), summed in
// double: the CPU's bits.
template <typename T>
__device__ float broadcast_grad_sum(const BroadcastGeometry& g, BinaryOp op, int operand, int64_t j, const T* a,
                                    const T* b, const T* dy) {
  constexpr int kDims = BroadcastGeometry::kMaxDims;
  int64_t o = 0, ia = 0, ib = 0, count[kDims];
  bool empty = false;
  CUMULUS_UNROLL
  for (int d = kDims - 1; d >= 0; --d) {
    count[d] = 0;
    if (d >= g.ndim) continue;
    if ((operand == 0 ? g.strides[1][d] : g.strides[2][d]) == 0) {
      empty = empty || g.dims[d] == 0;
      continue;
    }
    const int64_t k = j % g.dims[d];
    j /= g.dims[d];
    o += k * g.strides[0][d], ia += k * g.strides[1][d], ib += k * g.strides[2][d];
  }
  if (empty) return 0.0f;
  double sum = 0.0;
  for (bool carry = false; !carry;) {
    sum += binary_grad_at(op, operand, a, b, dy, o, ia, ib);
    carry = true;  // into the next reduced dimension; still set after the outermost: the walk is over
    CUMULUS_UNROLL
    for (int d = kDims - 1; d >= 0; --d) {
      if (!carry || d >= g.ndim || (operand == 0 ? g.strides[1][d] : g.strides[2][d]) != 0 || g.dims[d] <= 1) continue;
      o += g.strides[0][d], ia += g.strides[1][d], ib += g.strides[2][d];
      if (++count[d] < g.dims[d]) {
        carry = false;
        continue;
      }
      o -= count[d] * g.strides[0][d], ia -= count[d] * g.strides[1][d], ib -= count[d] * g.strides[2][d];
      count[d] = 0;
    }
  }
  return static_cast<float>(sum);
}

template <typename T>
__global__ void binary_backward_kernel(BroadcastGeometry g, BinaryOp op, int operand, const T* a, const T* b,
                                       const T* dy, float beta, T* dx, int64_t n) {
  CUMULUS_GRID_STRIDE_LOOP(j, n) { store_blend_rounded(dx + j, broadcast_grad_sum(g, op, operand, j, a, b, dy), beta); }
}

template <typename T>
__global__ void scalar_forward_kernel(BinaryOp op, bool reversed, float s, const T* x, T* y, int64_t n) {
  CUMULUS_GRID_STRIDE_LOOP(i, n) y[i] = from_f32<T>(scalar_apply(op, reversed, to_f32(x[i]), s));
}

template <typename T>
__global__ void scalar_backward_kernel(BinaryOp op, bool reversed, float s, const T* x, const T* dy, float beta, T* dx,
                                       int64_t n) {
  CUMULUS_GRID_STRIDE_LOOP(i, n) {
    const float xv = x != nullptr ? to_f32(x[i]) : 0.0f;
    store_blend_rounded(dx + i, scalar_grad(op, reversed, to_f32(dy[i]), xv, s), beta);
  }
}

template <typename T>
__global__ void unary_forward_kernel(UnaryOp op, const T* x, T* y, int64_t n) {
  CUMULUS_GRID_STRIDE_LOOP(i, n) y[i] = from_f32<T>(unary_apply(op, to_f32(x[i])));
}

template <typename T>
__global__ void unary_backward_kernel(UnaryOp op, const T* saved, const T* dy, float beta, T* dx, int64_t n) {
  CUMULUS_GRID_STRIDE_LOOP(i, n) { store_blend_rounded(dx + i, unary_grad(op, to_f32(dy[i]), to_f32(saved[i])), beta); }
}

template <typename T>
__global__ void dropout_forward_kernel(uint64_t seed, const int64_t* offset, float p, float scale, const T* x, T* y,
                                       int64_t n) {
  const uint64_t key = dropout_key(seed, static_cast<uint64_t>(*offset));
  CUMULUS_GRID_STRIDE_LOOP(i, n) y[i] = from_f32<T>(to_f32(x[i]) * dropout_factor(key, i, p, scale));
}

template <typename T>
__global__ void dropout_backward_kernel(uint64_t seed, const int64_t* offset, float p, float scale, const T* dy,
                                        float beta, T* dx, int64_t n) {
  const uint64_t key = dropout_key(seed, static_cast<uint64_t>(*offset));
  CUMULUS_GRID_STRIDE_LOOP(i, n) {
    const float v = to_f32(dy[i]) * dropout_factor(key, i, p, scale);
    store_blend_rounded(dx + i, v, beta);
  }
}

// ---- softmax: one warp per row ----
constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;

using cuda_common::warp_max;
using cuda_common::warp_sum;

// Every lane of a block's warps takes part in the shuffles, rows past the end included (they read
// nothing and write nothing), so the full-mask shuffles are well defined.
template <typename T>
__global__ void softmax_forward_kernel(bool log, const T* x, T* y, int64_t rows, int64_t cols) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const bool active = row < rows;
  const T* xr = x + (active ? row * cols : 0);
  const int64_t n = active ? cols : 0;
  float m = -INFINITY;
  for (int64_t j = lane; j < n; j += kWarp) m = fmaxf(m, to_f32(xr[j]));
  m = warp_max(m);
  double s = 0.0;  // in double, as the CPU's: a float sum over a wide row drifts by about cols / 32 ulp
  for (int64_t j = lane; j < n; j += kWarp) s += expf(to_f32(xr[j]) - m);
  s = warp_sum(s);
  T* yr = y + (active ? row * cols : 0);
  if (log) {
    const float log_s = static_cast<float>(::log(s));
    for (int64_t j = lane; j < n; j += kWarp) yr[j] = from_f32<T>((to_f32(xr[j]) - m) - log_s);
  } else {
    const float inv = static_cast<float>(1.0 / s);
    for (int64_t j = lane; j < n; j += kWarp) yr[j] = from_f32<T>(expf(to_f32(xr[j]) - m) * inv);
  }
}

template <typename T>
__global__ void softmax_backward_kernel(bool log, const T* y, const T* dy, float beta, T* dx, int64_t rows,
                                        int64_t cols) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const bool active = row < rows;
  const int64_t base = active ? row * cols : 0, n = active ? cols : 0;
  double sum = 0.0;  // in double, as the forward's
  for (int64_t j = lane; j < n; j += kWarp)
    sum += log ? to_f32(dy[base + j]) : static_cast<double>(to_f32(dy[base + j])) * to_f32(y[base + j]);
  const float s = static_cast<float>(warp_sum(sum));
  for (int64_t j = lane; j < n; j += kWarp) {
    const float yv = to_f32(y[base + j]), g = to_f32(dy[base + j]);
    const float v = log ? g - expf(yv) * s : yv * (g - s);
    store_blend_rounded(dx + (base + j), v, beta);
  }
}

inline unsigned blocks_for_rows(int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

__global__ void dropout_take_offset_kernel(int64_t* counter, int64_t* taken) {
  *taken = *counter;
  *counter += 1;
}

}  // namespace

template <typename T>
void binary_forward_cuda(const BroadcastGeometry& g, BinaryOp op, const T* a, const T* b, T* y, cudaStream_t stream) {
  const int64_t n = g.numel(0);
  if (n == 0) return;
  launch<binary_forward_kernel<T>>(blocks_for(n), kThreads, stream, g, op, a, b, y, n);
}

template <typename T>
void binary_backward_cuda(const BroadcastGeometry& g, BinaryOp op, int operand, const T* a, const T* b, const T* dy,
                          float beta, T* dx, cudaStream_t stream) {
  const int64_t n = g.numel(1 + operand);
  if (n == 0) return;
  launch<binary_backward_kernel<T>>(blocks_for(n), kThreads, stream, g, op, operand, a, b, dy, beta, dx, n);
}

template <typename T>
void scalar_forward_cuda(BinaryOp op, bool reversed, float s, const T* x, T* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch<scalar_forward_kernel<T>>(blocks_for(n), kThreads, stream, op, reversed, s, x, y, n);
}

template <typename T>
void scalar_backward_cuda(BinaryOp op, bool reversed, float s, const T* x, const T* dy, float beta, T* dx, int64_t n,
                          cudaStream_t stream) {
  if (n == 0) return;
  launch<scalar_backward_kernel<T>>(blocks_for(n), kThreads, stream, op, reversed, s, x, dy, beta, dx, n);
}

template <typename T>
void unary_forward_cuda(UnaryOp op, const T* x, T* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch<unary_forward_kernel<T>>(blocks_for(n), kThreads, stream, op, x, y, n);
}

template <typename T>
void unary_backward_cuda(UnaryOp op, const T* saved, const T* dy, float beta, T* dx, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch<unary_backward_kernel<T>>(blocks_for(n), kThreads, stream, op, saved, dy, beta, dx, n);
}

template <typename T>
void softmax_forward_cuda(bool log, const T* x, T* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  launch<softmax_forward_kernel<T>>(blocks_for_rows(rows), kWarpsPerBlock * kWarp, stream, log, x, y, rows, cols);
}

template <typename T>
void softmax_backward_cuda(bool log, const T* y, const T* dy, float beta, T* dx, int64_t rows, int64_t cols,
                           cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  launch<softmax_backward_kernel<T>>(blocks_for_rows(rows), kWarpsPerBlock * kWarp, stream, log, y, dy, beta, dx, rows,
                                     cols);
}

template <typename T>
void dropout_forward_cuda(uint64_t seed, const int64_t* offset, float p, float scale, const T* x, T* y, int64_t n,
                          cudaStream_t stream) {
  if (n == 0) return;
  launch<dropout_forward_kernel<T>>(blocks_for(n), kThreads, stream, seed, offset, p, scale, x, y, n);
}

template <typename T>
void dropout_backward_cuda(uint64_t seed, const int64_t* offset, float p, float scale, const T* dy, float beta, T* dx,
                           int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch<dropout_backward_kernel<T>>(blocks_for(n), kThreads, stream, seed, offset, p, scale, dy, beta, dx, n);
}

#define CUMULUS_INSTANTIATE(T)                                                                                         \
  template void binary_forward_cuda(const BroadcastGeometry&, BinaryOp, const T*, const T*, T*, cudaStream_t);         \
  template void binary_backward_cuda(const BroadcastGeometry&, BinaryOp, int, const T*, const T*, const T*, float, T*, \
                                     cudaStream_t);                                                                    \
  template void scalar_forward_cuda(BinaryOp, bool, float, const T*, T*, int64_t, cudaStream_t);                       \
  template void scalar_backward_cuda(BinaryOp, bool, float, const T*, const T*, float, T*, int64_t, cudaStream_t);     \
  template void unary_forward_cuda(UnaryOp, const T*, T*, int64_t, cudaStream_t);                                      \
  template void unary_backward_cuda(UnaryOp, const T*, const T*, float, T*, int64_t, cudaStream_t);                    \
  template void softmax_forward_cuda(bool, const T*, T*, int64_t, int64_t, cudaStream_t);                              \
  template void softmax_backward_cuda(bool, const T*, const T*, float, T*, int64_t, int64_t, cudaStream_t);            \
  template void dropout_forward_cuda(uint64_t, const int64_t*, float, float, const T*, T*, int64_t, cudaStream_t);     \
  template void dropout_backward_cuda(uint64_t, const int64_t*, float, float, const T*, float, T*, int64_t,            \
                                      cudaStream_t);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

void dropout_take_offset_cuda(int64_t* counter, int64_t* taken, cudaStream_t stream) {
  launch<dropout_take_offset_kernel>(1, 1, stream, counter, taken);
}

}  // namespace cumulus::kernels
