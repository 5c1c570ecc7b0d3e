// The kernels of our own beside cuDNN's convolution (kernels/cuda/cudnn_conv.cu): the bias add and
// the bias gradient for 16-bit data, which cudnnAddTensor and cudnnConvolutionBackwardBias cannot
// do with an f32 bias. In a file of their own, without cuDNN's header, so that the CPU emulation
// runs them (Note [Kernel launches] in kernels/cuda/common.cuh).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace cumulus::kernels {

namespace {

using cuda_common::blocks_for;
using cuda_common::kThreads;
using cuda_common::launch;

// y[n, k, i] += bias[k] (f32 bias): f32 arithmetic, one rounding per element.
template <typename T>
__global__ void add_bias_kernel(const float* bias, int64_t k, int64_t hw, int64_t total, T* y) {
  CUMULUS_GRID_STRIDE_LOOP(i, total) y[i] = from_f32<T>(to_f32(y[i]) + bias[(i / hw) % k]);
}

// dbias[k] = sum over n, i of dy (+ beta * dbias[k]), one block per channel: a fixed order
// (deterministic), f32 sums. Beta 0 never reads dbias.
template <typename T>
__global__ void bias_grad_kernel(const T* dy, int64_t n, int64_t k, int64_t hw, float beta, float* dbias) {
  const int64_t ch = blockIdx.x;
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < n * hw; i += blockDim.x) s += to_f32(dy[((i / hw) * k + ch) * hw + i % hw]);
  s = cuda_common::block_sum(s);
  if (threadIdx.x == 0) cuda_common::store_blend(dbias + ch, s, beta);
}

}  // namespace

template <typename T>
void conv2d_add_bias_cuda(const float* bias, int64_t n, int64_t k, int64_t hw, T* y, cudaStream_t stream) {
  const int64_t total = n * k * hw;
  if (total == 0) return;
  launch<add_bias_kernel<T>>(blocks_for(total), kThreads, stream, bias, k, hw, total, y);
}

template <typename T>
void conv2d_bias_grad_cuda(const T* dy, int64_t n, int64_t k, int64_t hw, float beta, float* dbias,
                           cudaStream_t stream) {
  if (k == 0) return;
  CUMULUS_CHECK(k <= 2147483647, InvalidArgument, "conv2d: ", k, " output channels is too many for one grid");
  launch<bias_grad_kernel<T>>(static_cast<unsigned>(k), kThreads, stream, dy, n, k, hw, beta, dbias);
}

#define CUMULUS_INSTANTIATE(T)                                                                   \
  template void conv2d_add_bias_cuda(const float*, int64_t, int64_t, int64_t, T*, cudaStream_t); \
  template void conv2d_bias_grad_cuda(const T*, int64_t, int64_t, int64_t, float, float*, cudaStream_t);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
