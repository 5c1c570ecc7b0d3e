// Normalization, forward with autograd recording: layer_norm and rms_norm (any floating type, f32
// statistics) and batch_norm2d (NCHW; cuDNN on CUDA). Parameters and their gradients are f32. Backward sits
// beside each forward (engine/ops/layer_norm.cpp, batch_norm.cpp).
#pragma once

#include <cstdint>
#include <optional>

#include "cumulus/tensor/tensor.h"

namespace cumulus::ops {

// PyTorch's layer_norm over the last dimension: x [..., normalized_size] -> y of x's shape and type,
// y = (x - mean) / sqrt(var + eps) * weight + bias with the biased variance of each row. weight and
// bias: f32 [normalized_size] or undefined (1 and 0). Saves x and each row's mean and 1 / std (f32).
// On CUDA the parameter gradients are column sums in a fixed order, without atomics: deterministic.
Tensor layer_norm(const Tensor& x, int64_t normalized_size, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), float eps = 1e-5f);
// PyTorch's layer_norm over the last normalized_shape.ndim() dimensions (x's trailing dimensions
// must equal normalized_shape): each slice over them normalized as one row; weight and bias f32 of
// normalized_shape or undefined.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), float eps = 1e-5f);

// PyTorch's F.rms_norm over the last normalized_shape.ndim() dimensions (x's trailing dimensions
// must equal normalized_shape): y = x / sqrt(mean(x^2) + eps) * weight, the mean over each slice
// of those dimensions. weight: f32 of normalized_shape, or undefined (1). eps: PyTorch's default
// when not given, the float epsilon (2^-23, whatever x's type: the statistics are f32). x f32,
// bf16 or f16; y of x's type. Saves x and each row's 1 / rms (f32). On CUDA the weight's gradient
// is a column sum in a fixed order, without atomics: deterministic.
Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                std::optional<float> eps = std::nullopt);

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

}  // namespace cumulus::ops
