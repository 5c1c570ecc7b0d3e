// Pointwise ops: arithmetic with broadcasting, its operators on Tensor, tanh / sigmoid / silu / gelu,
// softmax and log_softmax over a dimension, dropout. Each records its backward, runs on the
// CPU and CUDA, and takes f32, bf16 or f16 (16-bit storage, f32 arithmetic; the output has the
// input's type). Implemented in engine/ops/arithmetic.cpp, activations.cpp, softmax.cpp, dropout.cpp.
#pragma once

#include <cstdint>

#include "cumulus/tensor/tensor.h"

namespace cumulus::ops {

// ---- arithmetic ----
// a op b elementwise with numpy's broadcasting: shapes are aligned at their last dimension, and
// each dimension must be equal or 1 in one of them (a dimension of size 1, or a missing leading
// one, repeats): [B, n] + [n], [B, T, n] * [T, n], [B, 1] - [1, n] -> [B, n]. Both operands need
// the same device, and the same floating dtype (cast one first: f32 with bf16 is refused), except
// that an i32 or i64 operand is promoted as PyTorch promotes it (cumulus/ops/math.h says how: an
// integer with a floating tensor computes in the floating type, int op int stays an integer for
// add, sub and mul and is f32 for div, an integer tensor op a scalar is f32). The backward sums an
// operand's gradient over the dimensions it was broadcast along. The same tensor may be both
// operands (x * x). mul saves the operands the gradient needs (b for a's, a for b's); div saves b,
// and a when b needs a gradient; add and sub save nothing.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
// With a scalar: x op s, and s op x (rsub: s - x, rdiv: s / x). The scalar is f32.
Tensor add(const Tensor& x, float s);
Tensor sub(const Tensor& x, float s);
Tensor mul(const Tensor& x, float s);
Tensor div(const Tensor& x, float s);
Tensor rsub(float s, const Tensor& x);
Tensor rdiv(float s, const Tensor& x);
Tensor neg(const Tensor& x);  // -x, recorded as mul(x, -1) (so an integer x gives f32, unlike torch.neg)

// ---- activations (PyTorch's formulas) ----
// max(x, 0), any shape, f32, bf16 or f16. Saves its output (the mask is output > 0).
Tensor relu(const Tensor& x);
Tensor tanh(const Tensor& x);     // saves its output: dx = dy (1 - y^2)
Tensor sigmoid(const Tensor& x);  // saves its output: dx = dy y (1 - y)
// PyTorch's silu (swish): x * sigmoid(x), computed as x / (1 + exp(-x)), one op with its own
// backward dx = dy s (1 + x (1 - s)), s = sigmoid(x). Saves its input.
Tensor silu(const Tensor& x);
// gelu(x) = x Phi(x) with Phi the normal CDF (erf form), or PyTorch's approximate = "tanh" form
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Saves its input.
enum class GeluApproximation { none, tanh };
Tensor gelu(const Tensor& x, GeluApproximation approximate = GeluApproximation::none);

// ---- softmax over a dimension (any shape with at least one dimension) ----
// Along `dim` (negative counts from the end; PyTorch's dim, default the last), around each slice's
// maximum, so no exp overflows. Both save their output.
Tensor softmax(const Tensor& x, int dim = -1);
Tensor log_softmax(const Tensor& x, int dim = -1);

// ---- dropout ----
// While `training` with p > 0: y = x * keep / (1 - p), element i kept when dropout_keeps(seed,
// offset, i, p) (Note [Dropout mask] in kernels/pointwise_rules.h): a counter-based mask, the same
// on CPU and CUDA, that the backward recomputes instead of saving (no mask tensor is kept). Give
// each call its own offset for a fresh mask (nn::Dropout does). Not training, or p = 0: x itself,
// unrecorded. p must be in [0, 1]; p = 1 while training keeps nothing (y and the gradient are 0).
// `offset` is a one-element i64 tensor on x's device, read when the kernels run, so a replayed CUDA
// graph draws the mask of the replay's offset (Note [Dropout offsets on the device] in
// engine/ops/dropout.cpp); take_dropout_offset gives each call its own.
Tensor dropout(const Tensor& x, float p, bool training, uint64_t seed, const Tensor& offset);
// The same with the offset given by value (copied to the device). Refused while a CUDA graph is
// captured on x's device: every replay would repeat the capture's mask.
Tensor dropout(const Tensor& x, float p, bool training, uint64_t seed, uint64_t offset);
// A new one-element i64 tensor holding the value of `counter` (a one-element i64 tensor), and the
// counter advanced by one, both when the kernel runs (one launch on the counter's device).
Tensor take_dropout_offset(const Tensor& counter);
// Whether element `index` of dropout(x, p, true, seed, offset) is kept: the mask itself, for
// references and tests.
bool dropout_keeps(uint64_t seed, uint64_t offset, int64_t index, float p);

// dst += src, outside autograd (same shape, f32, same device): e.g. summing losses on the device
// without reading each one back.
void accumulate_(const Tensor& dst, const Tensor& src);

}  // namespace cumulus::ops

namespace cumulus {

// The arithmetic operators, recorded as the ops above (found by argument-dependent lookup).
inline Tensor operator+(const Tensor& a, const Tensor& b) { return ops::add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return ops::sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return ops::mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return ops::div(a, b); }
inline Tensor operator+(const Tensor& x, float s) { return ops::add(x, s); }
inline Tensor operator-(const Tensor& x, float s) { return ops::sub(x, s); }
inline Tensor operator*(const Tensor& x, float s) { return ops::mul(x, s); }
inline Tensor operator/(const Tensor& x, float s) { return ops::div(x, s); }
inline Tensor operator+(float s, const Tensor& x) { return ops::add(x, s); }
inline Tensor operator-(float s, const Tensor& x) { return ops::rsub(s, x); }
inline Tensor operator*(float s, const Tensor& x) { return ops::mul(x, s); }
inline Tensor operator/(float s, const Tensor& x) { return ops::rdiv(s, x); }
inline Tensor operator-(const Tensor& x) { return ops::neg(x); }

}  // namespace cumulus
