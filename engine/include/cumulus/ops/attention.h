// Fused scaled dot-product attention (engine/ops/attention.cpp; the algorithm is Note [Fused
// attention] in kernels/cpu/attention.cpp).
#pragma once

#include <optional>

#include "cumulus/tensor/tensor.h"

namespace cumulus::ops {

// softmax(scale * q k^T [masked]) v, PyTorch's F.scaled_dot_product_attention without dropout or an
// explicit mask: q [..., Tq, D], k and v [..., Tk, D] with the same leading dimensions (any number,
// none included), one floating dtype (f32, bf16 or f16: computed in f32, stored in the input's
// type) and one device -> [..., Tq, D]: dense, except that a 4-D output [B, H, Tq, D] is laid out
// as [B, Tq, H, D] (PyTorch's layout), so that merging the heads, transpose(1, 2).reshape({B, Tq,
// H * D}), is a view. scale defaults to 1 / sqrt(D). causal: query i
// sees keys j <= i, which needs Tq == Tk (top-left alignment); without it any Tk >= 1 (a decoding
// step: one query against a key/value cache).
// q, k and v may be strided views whose last dimension is dense (the heads of a qkv projection,
// permute(reshape(split(linear(x))))): they are read where they lie, with no copy, and saved as
// they are. Backward recomputes the probabilities from q, k, v and each row's log-sum-exp, so the
// op keeps only its output and Tq floats of log-sum-exp per head: no [Tq, Tk] matrix, forward or
// backward. On CUDA D is at most 128.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false,
                                    std::optional<double> scale = std::nullopt);

}  // namespace cumulus::ops
