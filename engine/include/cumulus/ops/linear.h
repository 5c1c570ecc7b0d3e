// Linear algebra, forward with autograd recording: linear (with a fused activation), matmul and
// bmm. f32, bf16 or f16 data with products summed in f32; OpenBLAS on the CPU, cuBLAS / cuBLASLt on
// CUDA. Backward sits beside each forward (engine/ops/linear.cpp, matmul.cpp) and writes parameter
// gradients inside the GEMM (Note [Gradient sinks]).
#pragma once

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

// Batched matrix product: a [B, n, k] x b [B, k, m] -> [B, n, m], one strided-batched GEMM
// (OpenBLAS per batch on the CPU, cublasGemmStridedBatchedEx on CUDA); a and b of one floating type,
// products summed in f32. Backward: da = dc b^T, db = a^T dc, transposes in the GEMM calls and the
// gradients written with the sinks' beta.
Tensor bmm(const Tensor& a, const Tensor& b);

// PyTorch's matmul: a 1-D a is a row [1, k] and a 1-D b a column [k, 1], the added dimension removed
// from the result; otherwise a [..., n, k] x b [..., k, m] -> [batch..., n, m] with the batch
// dimensions broadcast (numpy's rules: [B, H, T, D] @ [B, H, D, T], [B, 1, n, k] @ [H, k, m]).
// 2-D x 2-D is one GEMM; a batched a times a 2-D b one GEMM over a's rows; equal batch dimensions
// bmm's strided-batched GEMM; an operand repeated along every batch dimension is read with a batch
// stride of 0 (no copy); any other broadcast expands the operand first (a copy).
Tensor matmul(const Tensor& a, const Tensor& b);

}  // namespace cumulus::ops
