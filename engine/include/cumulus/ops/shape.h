// Shapes, views, joining, indexing and casts, recorded for autograd (engine/ops/shape.cpp,
// view.cpp, concat.cpp, index.cpp, mixed_precision.cpp). f32, bf16 or f16 data unless a comment says
// otherwise; dimensions may be negative (counted from the end), as in PyTorch.
#pragma once

#include <initializer_list>
#include <vector>

#include "cumulus/tensor/tensor.h"

namespace cumulus::ops {

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
// PyTorch's chunk: x cut along `dim` into pieces of ceil(x.size(dim) / chunks) with a shorter last
// one, so possibly fewer than `chunks` (7 into 3: 3, 3, 1); an empty dimension gives `chunks` empty
// pieces. Each piece is narrow's view, named "chunk" (q, k, v = chunk(qkv, 3, -1)).
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int dim);

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

}  // namespace cumulus::ops
