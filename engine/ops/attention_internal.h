// Private to the attention op and its tests: how the op sees q, k, v and its output.
#pragma once

#include <optional>

#include "cumulus/tensor/tensor.h"
#include "kernels/attention_rules.h"

namespace cumulus::ops::detail {

// The (batch, heads) geometry the kernels read q, k, v and out at (kernels/attention_rules.h):
// leading dimensions of size 1 dropped, neighbours merged where all four allow it, and each
// tensor's strides; tq, tk and d from the shapes, the backward's strides dense (causal and scale
// left as they are). Empty when more than two leading dimensions remain (the op then makes the
// inputs dense). q, k and v must have a dense last dimension.
std::optional<kernels::AttentionGeometry> attention_geometry(const Tensor& q, const Tensor& k, const Tensor& v,
                                                             const Tensor& out);

// The op's output for q [..., H, Tq, D]: a 4-D one ([B, H, Tq, D]) laid out as [B, Tq, H, D]
// (PyTorch's layout), dense otherwise.
Tensor new_attention_output(const Tensor& q);

// Whether a and b have one shape and lay their elements out alike (strides equal wherever the
// size is not 1).
bool same_layout(const Tensor& a, const Tensor& b);

}  // namespace cumulus::ops::detail
