// max_pool2d's kernels of our own, for bf16, which cuDNN's pooling is not documented for (Note [bf16
// on cuDNN] in kernels/cuda/cudnn_kernels.h; f32 and f16 pool through kernels/cuda/cudnn_pool.cu).
// The CPU launchers' contracts and results (kernels/cpu/pool.cpp): each window's element is chosen by
// the shared rule (pool_window_argmax: the last NaN, else the first largest), the forward copies it,
// and the backward gathers instead of scattering, so no two threads write one element and the order
// is fixed: each dx element starts as beta * dx (0 for beta 0, without reading dx) and adds the dy of
// every window that chose it, in row-major window order, rounding to T after each add as the CPU's
// scatter does. In a file without cuDNN's header, so that the CPU emulation runs it.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/pool_rules.h"

namespace cumulus::kernels {

namespace {

using cuda_common::blocks_for;
using cuda_common::kThreads;
using cuda_common::launch;

// y[p, oi, oj] = x[p] at its window's chosen element; one thread per output element.
template <typename T>
__global__ void max_pool_forward_kernel(Pool2dGeometry g, const T* x, int64_t total, T* y) {
  const int64_t hw = g.h * g.w, ohw = g.out_h * g.out_w;
  CUMULUS_GRID_STRIDE_LOOP(i, total) {
    const T* plane = x + (i / ohw) * hw;
    const int64_t o = i % ohw;
    y[i] = plane[pool_window_argmax(g, plane, o / g.out_w, o % g.out_w)];
  }
}

// The first window (along one axis) covering padded coordinate `at`: the first o with
// o * stride + kernel > at.
__device__ inline int64_t first_window(int64_t at, int64_t kernel, int64_t stride) {
  return at < kernel ? 0 : (at - kernel) / stride + 1;
}

// One thread per input element: the windows covering it, in row-major order, each adding its dy
// when it chose this element.
template <typename T>
__global__ void max_pool_backward_kernel(Pool2dGeometry g, const T* x, const T* dy, float beta, int64_t total, T* dx) {
  const int64_t hw = g.h * g.w, ohw = g.out_h * g.out_w;
  CUMULUS_GRID_STRIDE_LOOP(i, total) {
    const int64_t p = i / hw, e = i % hw;
    const int64_t r = e / g.w + g.pad_h, s = e % g.w + g.pad_w;  // padded coordinates
    const int64_t oi_end = r / g.stride_h + 1 < g.out_h ? r / g.stride_h + 1 : g.out_h;
    const int64_t oj_end = s / g.stride_w + 1 < g.out_w ? s / g.stride_w + 1 : g.out_w;
    const T* plane = x + p * hw;
    const T* g_out = dy + p * ohw;
    // The CPU scales dx by beta (rounded to T) before it adds anything, or clears it for beta 0.
    float v = beta == 0.0f ? 0.0f : beta == 1.0f ? to_f32(dx[i]) : to_f32(from_f32<T>(to_f32(dx[i]) * beta));
    for (int64_t oi = first_window(r, g.kernel_h, g.stride_h); oi < oi_end; ++oi)
      for (int64_t oj = first_window(s, g.kernel_w, g.stride_w); oj < oj_end; ++oj)
        if (pool_window_argmax(g, plane, oi, oj) == e) v = to_f32(from_f32<T>(v + to_f32(g_out[oi * g.out_w + oj])));
    dx[i] = from_f32<T>(v);
  }
}

}  // namespace

template <typename T>
void max_pool2d_forward_cuda(const Pool2dGeometry& g, const T* x, T* y, cudaStream_t stream) {
  const int64_t total = g.n * g.c * g.out_h * g.out_w;
  if (total == 0) return;
  launch<max_pool_forward_kernel<T>>(blocks_for(total), kThreads, stream, g, x, total, y);
}

template <typename T>
void max_pool2d_backward_cuda(const Pool2dGeometry& g, const T* x, const T* dy, float beta, T* dx,
                              cudaStream_t stream) {
  const int64_t total = g.n * g.c * g.h * g.w;
  if (total == 0) return;
  launch<max_pool_backward_kernel<T>>(blocks_for(total), kThreads, stream, g, x, dy, beta, total, dx);
}

#define CUMULUS_INSTANTIATE(T)                                                              \
  template void max_pool2d_forward_cuda(const Pool2dGeometry&, const T*, T*, cudaStream_t); \
  template void max_pool2d_backward_cuda(const Pool2dGeometry&, const T*, const T*, float, T*, cudaStream_t);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
