// batch_norm2d on CUDA. Training mode goes through cuDNN (spatial mode: statistics per channel
// over N*H*W): cudnnBatchNormalizationForwardTraining computes the batch statistics, saves the mean
// and 1/sqrt(var + eps), and updates the running statistics with factor = momentum (the running
// variance with the unbiased estimate, as PyTorch); cudnnBatchNormalizationBackward reads x, dy,
// gamma and the saved statistics and blends dx with beta_dx and both parameter gradients with one
// betaParamDiff, so gamma's and beta's gradients accumulate inside cuDNN (Note [Gradient sinks]).
// Evaluation mode: cudnnBatchNormalizationForwardInference, plus a small kernel that saves the
// running statistics the backward uses (cuDNN has no inference backward, so that backward is ours;
// our kernels live in kernels/cuda/batch_norm.cu, without cuDNN's header, so the CPU emulation runs
// them). x, y, dy and dx may be f16 (cuDNN's half batch norm computes in f32, with f32 parameters
// and statistics); bf16 runs on kernels of our own in both modes (Note [bf16 on cuDNN] in
// kernels/cuda/cudnn_kernels.h) and is refused here.
#if CUMULUS_WITH_CUDNN

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cudnn_common.h"
#include "kernels/cuda/cudnn_kernels.h"
#include "kernels/cuda/kernels.h"

namespace cumulus::kernels {

namespace {

struct BnDescriptors {
  cudnn::TensorDescriptor x, params;
};

// x (and y, dy, dx) as [n, c, 1, hw] in `dtype` (spatial mode reduces over n, h, w; only the product
// h * w matters) and the f32 [1, c, 1, 1] descriptor of gamma, beta and the statistics: what
// cudnnDeriveBNTensorDescriptor gives for f32 and f16 x, written out so that our f32 buffers are
// described as f32 whatever x's type (a type cuDNN refuses fails loudly; a wrong one would not).
BnDescriptors describe(DType dtype, int64_t n, int64_t c, int64_t hw) {
  CUMULUS_CHECK(cudnn_runs_batch_norm(dtype), InvalidArgument, "batch_norm2d: cuDNN's batch norm is not used for ",
                dtype_name(dtype), " (Note [bf16 on cuDNN]); use the kernels of our own");
  return BnDescriptors{cudnn::nchw_descriptor(n, c, 1, hw, dtype), cudnn::nchw_descriptor(1, c, 1, 1)};
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
  batch_norm_save_running_stats_cuda(running_mean, running_var, c, eps, save_mean, save_invstd, stream);
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

}  // namespace cumulus::kernels
#endif  // CUMULUS_WITH_CUDNN
