// Convolution and pooling, forward with autograd recording: conv2d and max_pool2d. NCHW, f32,
// contiguous. On the CPU: im2col + OpenBLAS GEMM for the convolution, plain loops for pooling
// (kernels/cpu/conv_kernels.h); on CUDA: cuDNN (kernels/cuda/cudnn_kernels.h); a CUDA build without
// cuDNN throws DeviceError for CUDA tensors. Backward sits beside each forward in
// engine/ops/{conv,pool}.cpp. An empty input (a batch of 0 included) is a ShapeError, where PyTorch
// returns an empty output (linear, matmul and cross_entropy accept one).
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
