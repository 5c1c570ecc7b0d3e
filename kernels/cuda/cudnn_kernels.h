// CUDA launchers of the convolutional ops, through cuDNN (legacy v9 API): the same ops and
// contracts as kernels/cpu/conv_kernels.h (beta 0 never reads the destination), queued on the
// stream `handle` is bound to (cumulus::cudnn::handle). Pointers are device pointers. Only for
// builds with cuDNN (CUMULUS_WITH_CUDNN).
#pragma once

#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>

#include "kernels/cpu/conv_kernels.h"

namespace cumulus::kernels {

// ---- conv2d (kernels/cuda/cudnn_conv.cu) ----
// FP32 math (CUDNN_FMA_MATH: no TF32), so results match the CPU's to float rounding. The algorithm
// of each (shape, direction) is chosen once and cached; its workspace is taken from
// allocator_for(cuda:device) in category workspace for the call (Note [cuDNN algorithm cache]).

// y = conv(x, weight) (+ bias, added by cudnnAddTensor; bias may be null).
void conv2d_forward_cuda(cudnnHandle_t handle, int device, const Conv2dGeometry& g, const float* x,
                         const float* weight, const float* bias, float* y);
// dx = conv_transpose(dy, weight) + beta * dx
void conv2d_backward_data_cuda(cudnnHandle_t handle, int device, const Conv2dGeometry& g, const float* weight,
                               const float* dy, float beta, float* dx);
// dweight = dW(x, dy) + beta * dweight: accumulated inside cudnnConvolutionBackwardFilter.
void conv2d_backward_filter_cuda(cudnnHandle_t handle, int device, const Conv2dGeometry& g, const float* x,
                                 const float* dy, float beta, float* dweight);
// dbias[k] = sum over n, i, j of dy + beta * dbias[k]
void conv2d_backward_bias_cuda(cudnnHandle_t handle, const Conv2dGeometry& g, const float* dy, float beta,
                               float* dbias);

// ---- batch_norm2d (kernels/cuda/cudnn_batch_norm.cu) ----
// x: [n, c, hw]; spatial mode (statistics per channel). The contracts of the CPU launchers.

void batch_norm_forward_training_cuda(cudnnHandle_t handle, const float* x, const float* gamma,
                                      const float* beta, int64_t n, int64_t c, int64_t hw, float eps,
                                      float momentum, float* running_mean, float* running_var, float* y,
                                      float* save_mean, float* save_invstd);
void batch_norm_forward_inference_cuda(cudnnHandle_t handle, const float* x, const float* gamma,
                                       const float* beta, const float* running_mean, const float* running_var,
                                       int64_t n, int64_t c, int64_t hw, float eps, float* y, float* save_mean,
                                       float* save_invstd, cudaStream_t stream);
// Batch statistics, through cudnnBatchNormalizationBackward: dx always written (with beta_dx), the
// parameter gradients with one shared beta (cuDNN's betaParamDiff). The op hands scratch buffers
// for what it does not need.
void batch_norm_backward_training_cuda(cudnnHandle_t handle, const float* x, const float* dy,
                                       const float* gamma, const float* save_mean, const float* save_invstd,
                                       int64_t n, int64_t c, int64_t hw, float eps, float beta_dx, float* dx,
                                       float beta_params, float* dgamma, float* dbeta);
// Running statistics (evaluation mode; cuDNN has no backward for it): our kernels. Any of dx,
// dgamma, dbeta may be null.
void batch_norm_backward_inference_cuda(const float* x, const float* dy, const float* gamma,
                                        const float* save_mean, const float* save_invstd, int64_t n, int64_t c,
                                        int64_t hw, float beta_dx, float* dx, float beta_dgamma, float* dgamma,
                                        float beta_dbeta, float* dbeta, cudaStream_t stream);
// counter[0] += 1 (BatchNorm2d's num_batches_tracked, i32), without a host round trip.
void increment_i32_cuda(int32_t* counter, cudaStream_t stream);

// ---- max_pool2d (kernels/cuda/cudnn_pool.cu) ----
// CUDNN_POOLING_MAX_DETERMINISTIC, NaN propagated. cuDNN's backward reads x and y.

void max_pool2d_forward_cuda(cudnnHandle_t handle, const Pool2dGeometry& g, const float* x, float* y);
void max_pool2d_backward_cuda(cudnnHandle_t handle, const Pool2dGeometry& g, const float* x, const float* y,
                              const float* dy, float beta, float* dx);

}  // namespace cumulus::kernels
