// The convolutional ops, forward with autograd recording: conv2d, batch_norm2d, max_pool2d. NCHW,
// f32, contiguous. On the CPU: im2col + OpenBLAS GEMM for the convolution, plain loops for the rest
// (kernels/cpu/conv_kernels.h); on CUDA: cuDNN (kernels/cuda/cudnn_kernels.h); a CUDA build without
// cuDNN throws DeviceError for CUDA tensors. Backward sits beside each forward in
// engine/ops/{conv,batch_norm,pool}.cpp. An empty input (a batch of 0 included) is a ShapeError for
// all three, where PyTorch returns an empty output (linear, matmul and cross_entropy accept one).
#pragma once

#include <cstdint>

#include "cumulus/tensor/tensor.h"

namespace cumulus::ops {

struct Conv2dOptions {
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;  // zero padding on both sides
};

// x: [N, C, H, W], weight: [K, C, R, S] (PyTorch's layout), bias: [K] or undefined
//   -> y: [N, K, (H + 2 pad_h - R) / stride_h + 1, (W + 2 pad_w - S) / stride_w + 1]
// Cross-correlation, as torch.nn.functional.conv2d (no dilation, no groups). Saves x only if the
// weight needs a gradient and the weight only if x does. The weight gradient accumulates inside
// the GEMM (CPU) or cudnnConvolutionBackwardFilter (CUDA), with the sink's beta (Note [Gradient
// sinks]), exactly as linear's.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dOptions& options);
// Square stride and padding.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride = 1, int64_t padding = 0);

struct BatchNormOptions {
  bool training = true;   // batch statistics (and running-statistics update) vs running statistics
  float momentum = 0.1f;  // running = (1 - momentum) * running + momentum * batch statistic
  float eps = 1e-5f;
};

// x: [N, C, H, W] -> y: [N, C, H, W], y = weight * (x - mean) / sqrt(var + eps) + bias per channel.
// weight, bias: [C] (required). running_mean, running_var: [C] f32 buffers, or both undefined
// (track_running_stats = False; then training must be true).
// Training: mean and the biased variance over N*H*W normalize; the running statistics are updated
// in place with the unbiased variance (as PyTorch); num_batches_tracked (an i32 scalar, or
// undefined) is incremented. Needs more than one value per channel. Evaluation: the running
// statistics normalize, and nothing is updated. eps = 0 is accepted, as by PyTorch: a channel of
// zero variance then gives NaN (0 / 0).
// Saves x and two [C] tensors (the mean and 1/sqrt(var + eps) used), in category activations.
// Under gradient accumulation the statistics are those of each micro-batch, as in every framework.
Tensor batch_norm2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                    const Tensor& running_var, const Tensor& num_batches_tracked, const BatchNormOptions& options);

struct MaxPool2dOptions {
  int64_t kernel_h = 2, kernel_w = 2;
  int64_t stride_h = 2, stride_w = 2;
  int64_t pad_h = 0, pad_w = 0;  // at most half the kernel, as PyTorch; padding never wins a window
};

// x: [N, C, H, W] -> y: [N, C, (H + 2 pad_h - kernel_h) / stride_h + 1, ...] (floor), the maximum of
// each window; a NaN propagates. Backward sends each output's gradient to its window's maximum
// (the first one on ties). Saves x (CPU: the argmax is recomputed; no index tensor) and, on CUDA,
// also y (cuDNN's backward reads both).
Tensor max_pool2d(const Tensor& x, const MaxPool2dOptions& options);
// Square kernel; stride 0 means stride = kernel (PyTorch's default).
Tensor max_pool2d(const Tensor& x, int64_t kernel = 2, int64_t stride = 0, int64_t padding = 0);

}  // namespace cumulus::ops
