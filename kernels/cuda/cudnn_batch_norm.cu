// batch_norm2d on CUDA. Training mode goes through cuDNN (spatial mode: statistics per channel
// over N*H*W): cudnnBatchNormalizationForwardTraining computes the batch statistics, saves the mean
// and 1/sqrt(var + eps), and updates the running statistics with factor = momentum (the running
// variance with the unbiased estimate, as PyTorch); cudnnBatchNormalizationBackward reads x, dy,
// gamma and the saved statistics and blends dx with beta_dx and both parameter gradients with one
// betaParamDiff, so gamma's and beta's gradients accumulate inside cuDNN (Note [Gradient sinks]).
// Evaluation mode: cudnnBatchNormalizationForwardInference, plus a small kernel that saves the
// running statistics the backward uses (cuDNN has no inference backward, so that backward is ours:
// dx = gamma * invstd * dy, dgamma = sum dy * x_hat, dbeta = sum dy, per channel).
#if CUMULUS_WITH_CUDNN

#include "cumulus/core/cuda_check.h"
#include "cumulus/core/cudnn_context.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cudnn_kernels.h"

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

// One block per channel: sum dy and sum dy * x_hat over the channel's n * hw values in a fixed order
// (deterministic), then the parameter gradients.
__global__ void bn_param_grads_kernel(const float* x, const float* dy, const float* save_mean,
                                      const float* save_invstd, int64_t n, int64_t c, int64_t hw,
                                      float beta_dgamma, float* dgamma, float beta_dbeta, float* dbeta) {
  const int64_t ch = blockIdx.x;
  const float mean = save_mean[ch], invstd = save_invstd[ch];
  float a = 0.0f, b = 0.0f;
  for (int64_t i = threadIdx.x; i < n * hw; i += blockDim.x) {
    const int64_t idx = ((i / hw) * c + ch) * hw + i % hw;
    const float g = dy[idx];
    a += g;
    b += g * (x[idx] - mean) * invstd;
  }
  a = cuda_common::block_sum(a);
  b = cuda_common::block_sum(b);
  if (threadIdx.x == 0) {
    if (dgamma != nullptr) dgamma[ch] = blend(b, beta_dgamma, dgamma[ch]);
    if (dbeta != nullptr) dbeta[ch] = blend(a, beta_dbeta, dbeta[ch]);
  }
}

// dx = gamma * invstd * dy (+ beta * dx): the statistics are constants in evaluation mode.
__global__ void bn_inference_dx_kernel(const float* dy, const float* gamma, const float* save_invstd, int64_t c,
                                       int64_t hw, int64_t total, float beta, float* dx) {
  CUMULUS_GRID_STRIDE_LOOP(i, total) {
    const int64_t ch = (i / hw) % c;
    dx[i] = blend(gamma[ch] * save_invstd[ch] * dy[i], beta, dx[i]);
  }
}

__global__ void increment_i32_kernel(int32_t* counter) { counter[0] += 1; }

struct BnDescriptors {
  cudnn::TensorDescriptor x, params;
};

// x as [n, c, 1, hw] (spatial mode reduces over n, h, w; only the product h * w matters) and the
// derived [1, c, 1, 1] descriptor of gamma, beta and the statistics.
BnDescriptors describe(int64_t n, int64_t c, int64_t hw) {
  BnDescriptors d{cudnn::nchw_descriptor(n, c, 1, hw), cudnn::TensorDescriptor()};
  CUMULUS_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(d.params.get(), d.x.get(), CUDNN_BATCHNORM_SPATIAL));
  return d;
}

}  // namespace

void batch_norm_forward_training_cuda(cudnnHandle_t handle, const float* x, const float* gamma,
                                      const float* beta, int64_t n, int64_t c, int64_t hw, float eps,
                                      float momentum, float* running_mean, float* running_var, float* y,
                                      float* save_mean, float* save_invstd) {
  const BnDescriptors d = describe(n, c, hw);
  const float one = 1.0f, zero = 0.0f;
  detail::count_launch();
  CUMULUS_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
      handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, d.x.get(), x, d.x.get(), y, d.params.get(), gamma, beta,
      static_cast<double>(momentum), running_mean, running_var, static_cast<double>(eps), save_mean, save_invstd));
}

void batch_norm_forward_inference_cuda(cudnnHandle_t handle, const float* x, const float* gamma,
                                       const float* beta, const float* running_mean, const float* running_var,
                                       int64_t n, int64_t c, int64_t hw, float eps, float* y, float* save_mean,
                                       float* save_invstd, cudaStream_t stream) {
  const BnDescriptors d = describe(n, c, hw);
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

void batch_norm_backward_training_cuda(cudnnHandle_t handle, const float* x, const float* dy,
                                       const float* gamma, const float* save_mean, const float* save_invstd,
                                       int64_t n, int64_t c, int64_t hw, float eps, float beta_dx, float* dx,
                                       float beta_params, float* dgamma, float* dbeta) {
  const BnDescriptors d = describe(n, c, hw);
  const float one = 1.0f;
  detail::count_launch();
  CUMULUS_CUDNN_CHECK(cudnnBatchNormalizationBackward(
      handle, CUDNN_BATCHNORM_SPATIAL, &one, &beta_dx, &one, &beta_params, d.x.get(), x, d.x.get(), dy, d.x.get(),
      dx, d.params.get(), gamma, dgamma, dbeta, static_cast<double>(eps), save_mean, save_invstd));
}

void batch_norm_backward_inference_cuda(const float* x, const float* dy, const float* gamma,
                                        const float* save_mean, const float* save_invstd, int64_t n, int64_t c,
                                        int64_t hw, float beta_dx, float* dx, float beta_dgamma, float* dgamma,
                                        float beta_dbeta, float* dbeta, cudaStream_t stream) {
  if (dgamma != nullptr || dbeta != nullptr) {
    CUMULUS_CHECK(c <= 2147483647, InvalidArgument, "batch_norm2d: ", c, " channels is too many for one grid");
    bn_param_grads_kernel<<<static_cast<unsigned>(c), kThreads, 0, stream>>>(
        x, dy, save_mean, save_invstd, n, c, hw, beta_dgamma, dgamma, beta_dbeta, dbeta);
    CUMULUS_LAUNCH_CHECK();
  }
  if (dx != nullptr) {
    const int64_t total = n * c * hw;
    bn_inference_dx_kernel<<<blocks_for(total), kThreads, 0, stream>>>(dy, gamma, save_invstd, c, hw, total, beta_dx,
                                                                       dx);
    CUMULUS_LAUNCH_CHECK();
  }
}

void increment_i32_cuda(int32_t* counter, cudaStream_t stream) {
  increment_i32_kernel<<<1, 1, 0, stream>>>(counter);
  CUMULUS_LAUNCH_CHECK();
}

}  // namespace cumulus::kernels
#endif  // CUMULUS_WITH_CUDNN
