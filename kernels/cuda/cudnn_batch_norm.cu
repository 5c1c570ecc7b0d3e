// batch_norm2d on CUDA. Training mode goes through cuDNN (spatial mode: statistics per channel
// over N*H*W): cudnnBatchNormalizationForwardTraining computes the batch statistics, saves the mean
// and 1/sqrt(var + eps), and updates the running statistics with factor = momentum (the running
// variance with the unbiased estimate, as PyTorch); cudnnBatchNormalizationBackward reads x, dy,
// gamma and the saved statistics and blends dx with beta_dx and both parameter gradients with one
// betaParamDiff, so gamma's and beta's gradients accumulate inside cuDNN (Note [Gradient sinks]).
// Evaluation mode: cudnnBatchNormalizationForwardInference, plus a small kernel that saves the
// running statistics the backward uses (cuDNN has no inference backward, so that backward is ours:
// dx = gamma * invstd * dy, dgamma = sum dy * x_hat, dbeta = sum dy, per channel).
// x, y, dy and dx may be bf16 / f16 (cuDNN's 16-bit batch norm computes in f32, with f32 parameters
// and statistics); our kernels load them with to_f32 and compute in f32 as well.
#if CUMULUS_WITH_CUDNN

#include "cumulus/core/cuda_check.h"
#include "cumulus/core/cudnn_context.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cudnn_kernels.h"
#include "kernels/float16.h"

namespace cumulus::kernels {

namespace {

using cuda_common::blend;
using cuda_common::blocks_for;
using cuda_common::kThreads;

// save_mean = running_mean, save_invstd = 1 / sqrt(running_var + eps), one thread per channel.
__global__ void save_running_stats_kernel(const float* running_mean, const float* running_var, int64_t c,
                                          float eps, float* save_mean, float* save_invstd) {
  const int64_t ch = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (ch >= c) return;
  save_mean[ch] = running_mean[ch];
  save_invstd[ch] = rsqrtf(running_var[ch] + eps);
}

// The kernels below are templated over the storage type T of x, dy and dx (float, BFloat16, Half):
// loads through to_f32, f32 arithmetic, one rounding per 16-bit store; for float exactly the f32
// kernels they were.

// One block per channel: sum dy and sum dy * x_hat over the channel's n * hw values in a fixed order
// (deterministic), then the parameter gradients.
template <typename T>
__global__ void bn_param_grads_kernel(const T* x, const T* dy, const float* save_mean,
                                      const float* save_invstd, int64_t n, int64_t c, int64_t hw,
                                      float beta_dgamma, float* dgamma, float beta_dbeta, float* dbeta) {
  const int64_t ch = blockIdx.x;
  const float mean = save_mean[ch], invstd = save_invstd[ch];
  float a = 0.0f, b = 0.0f;
  for (int64_t i = threadIdx.x; i < n * hw; i += blockDim.x) {
    const int64_t idx = ((i / hw) * c + ch) * hw + i % hw;
    const float g = to_f32(dy[idx]);
    a += g;
    b += g * (to_f32(x[idx]) - mean) * invstd;
  }
  a = cuda_common::block_sum(a);
  b = cuda_common::block_sum(b);
  if (threadIdx.x == 0) {
    if (dgamma != nullptr) dgamma[ch] = blend(b, beta_dgamma, dgamma[ch]);
    if (dbeta != nullptr) dbeta[ch] = blend(a, beta_dbeta, dbeta[ch]);
  }
}

// dx = gamma * invstd * dy (+ beta * dx): the statistics are constants in evaluation mode.
template <typename T>
__global__ void bn_inference_dx_kernel(const T* dy, const float* gamma, const float* save_invstd, int64_t c,
                                       int64_t hw, int64_t total, float beta, T* dx) {
  CUMULUS_GRID_STRIDE_LOOP(i, total) {
    const int64_t ch = (i / hw) % c;
    dx[i] = from_f32<T>(blend(gamma[ch] * save_invstd[ch] * to_f32(dy[i]), beta, to_f32(dx[i])));
  }
}

__global__ void increment_i32_kernel(int32_t* counter) { counter[0] += 1; }

struct BnDescriptors {
  cudnn::TensorDescriptor x, params;
};

// x (and y, dy, dx) as [n, c, 1, hw] in `dtype` (spatial mode reduces over n, h, w; only the product
// h * w matters) and the f32 [1, c, 1, 1] descriptor of gamma, beta and the statistics: what
// cudnnDeriveBNTensorDescriptor gives for f32 and f16 x, written out so that our f32 buffers are
// described as f32 whatever x's type (a type cuDNN refuses fails loudly; a wrong one would not).
BnDescriptors describe(DType dtype, int64_t n, int64_t c, int64_t hw) {
  return BnDescriptors{cudnn::nchw_descriptor(n, c, 1, hw, dtype), cudnn::nchw_descriptor(1, c, 1, 1)};
}

// batch_norm_backward_inference_cuda for storage type T.
template <typename T>
void backward_inference(const void* x, const void* dy, const float* gamma, const float* save_mean,
                        const float* save_invstd, int64_t n, int64_t c, int64_t hw, float beta_dx, void* dx,
                        float beta_dgamma, float* dgamma, float beta_dbeta, float* dbeta, cudaStream_t stream) {
  if (dgamma != nullptr || dbeta != nullptr) {
    CUMULUS_CHECK(c <= 2147483647, InvalidArgument, "batch_norm2d: ", c, " channels is too many for one grid");
    bn_param_grads_kernel<<<static_cast<unsigned>(c), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(dy), save_mean, save_invstd, n, c, hw, beta_dgamma, dgamma,
        beta_dbeta, dbeta);
    CUMULUS_LAUNCH_CHECK();
  }
  if (dx != nullptr) {
    const int64_t total = n * c * hw;
    bn_inference_dx_kernel<<<blocks_for(total), kThreads, 0, stream>>>(static_cast<const T*>(dy), gamma, save_invstd,
                                                                       c, hw, total, beta_dx, static_cast<T*>(dx));
    CUMULUS_LAUNCH_CHECK();
  }
}

}  // namespace

void batch_norm_forward_training_cuda(cudnnHandle_t handle, DType dtype, const void* x, const float* gamma,
                                      const float* beta, int64_t n, int64_t c, int64_t hw, float eps,
                                      float momentum, float* running_mean, float* running_var, void* y,
                                      float* save_mean, float* save_invstd) {
  const BnDescriptors d = describe(dtype, n, c, hw);
  const float one = 1.0f, zero = 0.0f;
  detail::count_launch();
  CUMULUS_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
      handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, d.x.get(), x, d.x.get(), y, d.params.get(), gamma, beta,
      static_cast<double>(momentum), running_mean, running_var, static_cast<double>(eps), save_mean, save_invstd));
}

void batch_norm_forward_inference_cuda(cudnnHandle_t handle, DType dtype, const void* x, const float* gamma,
                                       const float* beta, const float* running_mean, const float* running_var,
                                       int64_t n, int64_t c, int64_t hw, float eps, void* y, float* save_mean,
                                       float* save_invstd, cudaStream_t stream) {
  const BnDescriptors d = describe(dtype, n, c, hw);
  const float one = 1.0f, zero = 0.0f;
  detail::count_launch();
  CUMULUS_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero,
                                                              d.x.get(), x, d.x.get(), y, d.params.get(), gamma,
                                                              beta, running_mean, running_var,
                                                              static_cast<double>(eps)));
  const int blocks = static_cast<int>((c + kThreads - 1) / kThreads);
  save_running_stats_kernel<<<blocks, kThreads, 0, stream>>>(running_mean, running_var, c, eps, save_mean,
                                                              save_invstd);
  CUMULUS_LAUNCH_CHECK();
}

void batch_norm_backward_training_cuda(cudnnHandle_t handle, DType dtype, const void* x, const void* dy,
                                       const float* gamma, const float* save_mean, const float* save_invstd,
                                       int64_t n, int64_t c, int64_t hw, float eps, float beta_dx, void* dx,
                                       float beta_params, float* dgamma, float* dbeta) {
  const BnDescriptors d = describe(dtype, n, c, hw);
  const float one = 1.0f;
  detail::count_launch();
  CUMULUS_CUDNN_CHECK(cudnnBatchNormalizationBackward(
      handle, CUDNN_BATCHNORM_SPATIAL, &one, &beta_dx, &one, &beta_params, d.x.get(), x, d.x.get(), dy, d.x.get(),
      dx, d.params.get(), gamma, dgamma, dbeta, static_cast<double>(eps), save_mean, save_invstd));
}

void batch_norm_backward_inference_cuda(DType dtype, const void* x, const void* dy, const float* gamma,
                                        const float* save_mean, const float* save_invstd, int64_t n, int64_t c,
                                        int64_t hw, float beta_dx, void* dx, float beta_dgamma, float* dgamma,
                                        float beta_dbeta, float* dbeta, cudaStream_t stream) {
  switch (dtype) {
    case DType::f32:
      return backward_inference<float>(x, dy, gamma, save_mean, save_invstd, n, c, hw, beta_dx, dx, beta_dgamma,
                                       dgamma, beta_dbeta, dbeta, stream);
    case DType::bf16:
      return backward_inference<BFloat16>(x, dy, gamma, save_mean, save_invstd, n, c, hw, beta_dx, dx, beta_dgamma,
                                          dgamma, beta_dbeta, dbeta, stream);
    case DType::f16:
      return backward_inference<Half>(x, dy, gamma, save_mean, save_invstd, n, c, hw, beta_dx, dx, beta_dgamma,
                                      dgamma, beta_dbeta, dbeta, stream);
    default: break;
  }
  throw InvalidArgument(detail::concat("batch_norm2d: no backward for dtype ", dtype_name(dtype)));
}

void increment_i32_cuda(int32_t* counter, cudaStream_t stream) {
  increment_i32_kernel<<<1, 1, 0, stream>>>(counter);
  CUMULUS_LAUNCH_CHECK();
}

}  // namespace cumulus::kernels
#endif  // CUMULUS_WITH_CUDNN
