// Comparisons, logical ops, masks and index generators, as PyTorch's: eq / ne / lt / le / gt / ge,
// logical_not / and / or / xor, where, masked_fill, tril / triu, arange. Comparisons and logical ops
// return bool tensors (DType::boolean: one byte per element, 0 or 1); they, arange and a cast to
// bool have no gradient. where, masked_fill, tril and triu record their backward. Each runs on the
// CPU and CUDA. Implemented in engine/ops/compare.cpp.
//
// A causal attention mask, from ones of [T, T]: ops::tril(ones) is 1 on and below the diagonal,
//   ops::masked_fill(scores, ops::eq(ops::tril(ones), 0), -INFINITY)
// fills the scores above it with -inf (the [T, T] mask broadcast over [B, H, T, T]).
//
// Bool tensors from host data: ops::cast(Tensor::from_vector<uint8_t>(v, shape), DType::boolean)
// (nonzero is true); back to the host: mask.to_vector<uint8_t>() (0 or 1). std::vector<bool> packs
// bits and has no data(), so bool has no C++ element type of its own (Note [Bool tensors] in
// engine/ops/compare.cpp).
#pragma once

#include <cstdint>
#include <optional>

#include "cumulus/tensor/tensor.h"

namespace cumulus::ops {

// ---- comparisons: a bool tensor ----
// a op b elementwise with numpy's broadcasting (as ops::add). Both operands need the same dtype
// (any: f32, bf16, f16, i32, i64, u8, bool; no implicit promotion, cast one first) and device.
// Floating values compare as IEEE 754 does: a NaN is unequal to everything, itself included (ne is
// true, every other comparison false); -0 equals +0.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
// x op s. As PyTorch, the scalar takes x's type: for a floating x it is rounded to x's dtype
// (eq(x_f32, 0.1) is true where x holds 0.1f); an integer or bool x compares exactly with an
// integer s, and in double with a fractional one (lt(i, 0.5) is i <= 0).
Tensor eq(const Tensor& x, double s);
Tensor ne(const Tensor& x, double s);
Tensor lt(const Tensor& x, double s);
Tensor le(const Tensor& x, double s);
Tensor gt(const Tensor& x, double s);
Tensor ge(const Tensor& x, double s);

// ---- logical ops: a bool tensor; any dtype, a nonzero value (NaN included) is true ----
Tensor logical_not(const Tensor& x);
// Broadcasting as the comparisons; the operands may have different dtypes.
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_xor(const Tensor& a, const Tensor& b);

// ---- selection ----
// cond ? a : b elementwise, the three broadcast together (numpy's rules). cond is bool; a and b have
// the same dtype (any) and device, which the output takes. Floating a and b get gradients: dy where
// cond (a) or where not (b), summed over the dimensions each was broadcast along. A scalar stands
// for a or b (rounded to the other's dtype as masked_fill's value).
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, double b);
Tensor where(const Tensor& cond, double a, const Tensor& b);
// x with `value` where mask is true: where(mask, value, x). mask (bool) and x broadcast together as
// torch.masked_fill's (out-of-place) do, so usually the mask broadcasts to x ([T, T] over
// [B, H, T, T]); the output has x's dtype. value is rounded to x's dtype (a finite value that
// overflows it is an InvalidArgument, as in PyTorch; +-inf and NaN are fine); an integer or bool x
// needs a value it holds exactly. x's gradient is dy where the mask is false, 0 where filled (summed over
// the dimensions x was broadcast along, if any).
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

// ---- triangles over the last two dimensions (x: [..., R, C], at least 2-D, any dtype) ----
// tril keeps the elements (r, c) with c - r <= diagonal and zeroes the others; triu keeps
// c - r >= diagonal. diagonal 0 is the main diagonal, > 0 above it, < 0 below. The gradient is dy
// masked the same way.
Tensor tril(const Tensor& x, int64_t diagonal = 0);
Tensor triu(const Tensor& x, int64_t diagonal = 0);

// ---- index generators ----
// 0, 1, ..., end - 1 as i64 (empty for end 0; a negative end is an InvalidArgument, as torch.arange).
Tensor arange(int64_t end, const Device& device = Device::cpu());
// start, start + step, ... up to end (excluded; down to it for a negative step): ceil((end - start)
// / step) values, as torch.arange. dtype: i64, i32, f32, bf16 or f16; by default i64 when start,
// end and step are all integers, else f32 (PyTorch decides by the Python type: arange(0.0, 5.0)
// is f32 there, i64 here). An integer dtype needs integer start and step. Float values are computed
// in double as start + i * step, then rounded. step 0, a step of the wrong sign, or a non-finite
// bound is an InvalidArgument.
Tensor arange(double start, double end, double step = 1, std::optional<DType> dtype = std::nullopt,
              const Device& device = Device::cpu());

}  // namespace cumulus::ops
