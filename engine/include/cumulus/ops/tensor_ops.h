// The structural ops (issue #29): layer norm, embedding, cat / split / narrow, index_select and
// batched matrix products. Each records its backward (engine/ops/layer_norm.cpp, index.cpp,
// concat.cpp, matmul.cpp), runs on the CPU and CUDA, and takes f32, bf16 or f16 data (f32
// arithmetic; parameters and their gradients f32) unless its comment says otherwise. Dimensions
// may be negative (counted from the end), as in PyTorch.
#pragma once

#include <vector>

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

// Rows of weight [num, dim] (f32) picked by indices (i32 or i64, any shape up to 3-D) -> [..., dim] in
// `dtype` (f32, or bf16 / f16 rounded from the f32 rows). Backward adds each row's gradient into the
// weight's gradient (repeated indices add up), in a fixed order on both devices. An index outside
// [0, num) is an InvalidArgument on the CPU; on CUDA it gives a row of NaN and contributes no gradient
// (the kernel cannot throw, and checking on the host would synchronize every call).
Tensor embedding(const Tensor& indices, const Tensor& weight, DType dtype = DType::f32);

// x's elements at `indices` (i32 or i64, 1-D) along `dim`: y.size(dim) = indices.size(0). Repeated
// indices are allowed (their gradients add up). Out-of-range indices: as embedding.
Tensor index_select(const Tensor& x, int dim, const Tensor& indices);

// The tensors joined along `dim` (same dtype, device and sizes except along dim; at least one).
// Backward hands each input its slab of the gradient.
Tensor cat(const std::vector<Tensor>& tensors, int dim);

// x[..., start : start + length, ...] along `dim`: a view sharing x's storage (a strided one unless
// every dimension before `dim` has size 1). Backward writes the gradient into the slab and zeros
// elsewhere.
Tensor narrow(const Tensor& x, int dim, int64_t start, int64_t length);

// x cut along `dim` into pieces of the given sizes (summing to x.size(dim)), or of `size` each with
// a shorter last one (PyTorch's split). Each piece is narrow's view, named "split".
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int dim);
std::vector<Tensor> split(const Tensor& x, int64_t size, int dim);

// ---- views (Note [Strided views] in engine/ops/view.cpp): no copy, storage shared, recorded ----
// x with dimensions dim0 and dim1 swapped (PyTorch's transpose).
Tensor transpose(const Tensor& x, int dim0, int dim1);
// x's dimensions in the order `dims` (PyTorch's permute): [B, T, H, D] -> [B, H, T, D] is
// permute(x, {0, 2, 1, 3}).
Tensor permute(const Tensor& x, const std::vector<int>& dims);
// x repeated along its dimensions of size 1 and new leading ones, without copying (stride 0), as
// PyTorch's expand; -1 keeps a dimension's size. Backward sums over the repeats.
Tensor expand(const Tensor& x, const std::vector<int64_t>& sizes);
// x with a dimension of size 1 inserted at `dim` (-1: last), or removed at `dim` (unchanged when its
// size is not 1), as PyTorch's.
Tensor unsqueeze(const Tensor& x, int dim);
Tensor squeeze(const Tensor& x, int dim);
// x itself when dense and row-major, else a dense copy; the gradient passes through unchanged.
Tensor contiguous(const Tensor& x);

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
