// The ops, forward with autograd recording. Each checks its arguments here, at the public entry
// point, then calls the kernels of the tensors' device (kernels/cpu, kernels/cuda). Every op's
// backward sits beside its forward in engine/ops/*.cpp.
#pragma once

#include <initializer_list>
#include <vector>

#include "cumulus/tensor/tensor.h"

namespace cumulus::ops {

// x: [..., in] (any leading dimensions, or none: [in]), weight: [out, in] (PyTorch's layout), bias:
// [out] or undefined -> y: [..., out]. y = x weight^T + bias, the leading dimensions flattened into
// the GEMM's rows (a view: no copy) and the gradient viewed back in x's shape. Backward writes
// dW (+)= dY^T x inside the GEMM (Note [Gradient sinks]). weight and bias are f32; x may be f32,
// bf16 or f16, and y has x's type: a 16-bit x computes with a 16-bit copy of the weight and f32
// accumulation, and the weight's gradient stays f32 (Note [Mixed precision] in engine/ops/linear.cpp).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);

// What a fused op applies to its result.
enum class Activation { none, relu };

// act(x weight^T + bias) as one op and one autograd node (Note [Fused linear] in
// engine/ops/linear.cpp): relu(linear(x, weight, bias)) bit for bit on the CPU; on CUDA one
// cuBLASLt GEMM with the bias (and ReLU) in its epilogue. Saves y for the ReLU mask, as relu does.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation activation);

// x converted to `dtype` among f32, bf16 and f16 (round to nearest even), recorded: the gradient
// is converted back to x's type. x itself when it already has that type. To or from bool (any
// dtype): nonzero, NaN included, is true; true is 1 and false 0; not recorded (cumulus/ops/compare.h).
Tensor cast(const Tensor& x, DType dtype);

// x with a new shape (same numel): a view of a dense x, else a dense copy (as torch.reshape). One
// size may be -1, inferred from the others. flatten keeps dims before start_dim and merges the
// rest (start_dim in [-ndim, ndim), a ShapeError otherwise, as torch.flatten; a 0-d tensor becomes [1]).
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor reshape(const Tensor& x, const std::vector<int64_t>& sizes);
Tensor reshape(const Tensor& x, std::initializer_list<int64_t> sizes);
Tensor flatten(const Tensor& x, int start_dim = 1);

// Sum / mean of all elements -> a scalar (0-d) of x's type (f32, bf16 or f16; a 16-bit x is summed
// as sum(x, {}) of cumulus/ops/reduce.h). The mean of an empty tensor is NaN.
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);

// PyTorch's reduction argument: Sum, Mean, or None (one value per element: reduction='none').
enum class Reduction { Sum, Mean, None };

// logits: [..., C] f32, bf16 or f16 (C > 0), labels: [...] i32 or i64 in [0, C) (the logits' shape
// without its last dimension: [B] for [B, C]) -> each position's loss
// logsumexp(logits_i) - logits_i[label_i], taken around the row maximum, f32:
//   Reduction::None  shaped as labels; a position whose label is ignore_index gives 0
//   Reduction::Sum   a scalar, the sum over the positions (ignored ones add 0)
//   Reduction::Mean  a scalar, the sum divided by the number of positions not ignored (NaN when all
//                    are, as PyTorch)
// ignore_index (PyTorch's default -100): positions with that label add no loss and no gradient.
// PyTorch's [N, C, d1, ...] layout is not taken: the classes are the last dimension.
// A label outside [0, C) (and not ignore_index) is an InvalidArgument on CPU and gives a NaN loss on
// CUDA (the kernel cannot throw, and checking on the host would cost a synchronization every
// micro-batch).
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, Reduction reduction = Reduction::Mean,
                     int64_t ignore_index = -100);

// x: [B, C] -> [B] i32, the index of each row's maximum (the first one on ties; as torch.argmax, a
// NaN counts as the maximum, so the row's first NaN wins). No gradient.
Tensor argmax(const Tensor& x);

// dst += src, outside autograd (same shape, f32, same device): e.g. summing losses on the device
// without reading each one back.
void accumulate_(const Tensor& dst, const Tensor& src);

}  // namespace cumulus::ops
