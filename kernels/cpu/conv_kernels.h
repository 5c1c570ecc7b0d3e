// CPU launchers of the convolutional ops: conv2d (im2col + OpenBLAS GEMM), batch_norm2d and
// max_pool2d (vectorized loops across the kernel threads). NCHW, contiguous, f32. Every launcher
// that writes a gradient takes a beta: 0 overwrites without reading the destination, 1 adds to it
// (Note [Gradient sinks] in engine/include/cumulus/autograd/node.h). The geometry structs are
// shared with the cuDNN launchers (kernels/cuda/cudnn_kernels.h).
#pragma once

#include <cstdint>

#include "kernels/float16.h"

namespace cumulus::kernels {

// x: [n, c, h, w], weight: [k, c, r, s] -> y: [n, k, out_h, out_w] with
// out = (in + 2 pad - kernel) / stride + 1 (floor).
struct Conv2dGeometry {
  int64_t n = 0, c = 0, h = 0, w = 0;  // input
  int64_t k = 0, r = 0, s = 0;         // output channels, kernel height and width
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  int64_t out_h = 0, out_w = 0;

  int64_t col_rows() const { return c * r * s; }    // rows of one sample's column matrix
  int64_t col_cols() const { return out_h * out_w; }
};

// x: [n, c, h, w] -> y: [n, c, out_h, out_w], the maximum of each window; padding reads as -inf.
struct Pool2dGeometry {
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  int64_t out_h = 0, out_w = 0;
};

// ---- conv2d (kernels/cpu/conv.cpp) ----

// Floats of scratch the conv2d launchers need (columns and a regrouped output of a chunk of
// samples; at most a few MiB, see kernels/cpu/conv.cpp).
int64_t conv2d_workspace_floats_cpu(const Conv2dGeometry& g);
// y = conv(x, weight) + bias (bias may be null).
void conv2d_forward_cpu(const Conv2dGeometry& g, const float* x, const float* weight, const float* bias,
                        float* y, float* workspace);
// dx = conv_transpose(dy, weight) + beta * dx
void conv2d_backward_data_cpu(const Conv2dGeometry& g, const float* weight, const float* dy, float beta,
                              float* dx, float* workspace);
// dweight = sum_n dy_n cols(x_n)^T + beta * dweight, accumulated inside the GEMMs (the first with
// beta, the others with 1).
void conv2d_backward_filter_cpu(const Conv2dGeometry& g, const float* x, const float* dy, float beta,
                                float* dweight, float* workspace);
// dbias[k] = sum_{n, i, j} dy[n, k, i, j] + beta * dbias[k]
void conv2d_backward_bias_cpu(const Conv2dGeometry& g, const float* dy, float beta, float* dbias);

// ---- batch_norm2d (kernels/cpu/batch_norm.cpp) ----
// x: [n, c, hw]; statistics per channel over n * hw values. x, y, dy, dx stored as T (float,
// BFloat16, Half; f32 arithmetic); parameters, statistics and their gradients f32.

// Batch statistics: save_mean, save_invstd = 1 / sqrt(biased var + eps); y = gamma * x_hat + beta.
// running_mean / running_var (both null or both set) become (1 - momentum) * running + momentum *
// batch statistic, with the unbiased variance (as PyTorch and cuDNN).
template <typename T>
void batch_norm_forward_training_cpu(const T* x, const float* gamma, const float* beta, int64_t n, int64_t c,
                                     int64_t hw, float eps, float momentum, float* running_mean, float* running_var,
                                     T* y, float* save_mean, float* save_invstd);
// Running statistics: save_mean = running_mean, save_invstd = 1 / sqrt(running_var + eps).
template <typename T>
void batch_norm_forward_inference_cpu(const T* x, const float* gamma, const float* beta, const float* running_mean,
                                      const float* running_var, int64_t n, int64_t c, int64_t hw, float eps, T* y,
                                      float* save_mean, float* save_invstd);
// Gradients from the saved statistics; any of dx, dgamma, dbeta may be null (skipped).
// training: the statistics depended on x (batch statistics); otherwise they were constants.
template <typename T>
void batch_norm_backward_cpu(const T* x, const T* dy, const float* gamma, const float* save_mean,
                             const float* save_invstd, int64_t n, int64_t c, int64_t hw, bool training, float beta_dx,
                             T* dx, float beta_dgamma, float* dgamma, float beta_dbeta, float* dbeta);

// ---- max_pool2d (kernels/cpu/pool.cpp) ----

// A NaN in a window is its maximum (propagated, as PyTorch); ties go to the first element. Any T.
template <typename T>
void max_pool2d_forward_cpu(const Pool2dGeometry& g, const T* x, T* y);
// dx[argmax of each window] += dy; the argmax is recomputed from x, as the forward chose it.
template <typename T>
void max_pool2d_backward_cpu(const Pool2dGeometry& g, const T* x, const T* dy, float beta, T* dx);

}  // namespace cumulus::kernels
