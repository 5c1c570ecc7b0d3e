// Rotary position embedding (RoPE, Su et al. 2021) in Llama's layout: each head's vector is split
// in two halves that rotate together (Hugging Face's rotate_half), as a PyTorch user writes it.
//   const ops::RotaryTables rope = ops::rotary_tables(context, head_dim, 10000.0, device);
//   q = ops::apply_rotary(q, rope.cos, rope.sin);   // q [B, H, T, head_dim], T <= context
#pragma once

#include <cstdint>

#include "cumulus/tensor/tensor.h"

namespace cumulus::ops {

// cos and sin [context, head_dim] f32 of the angle t * base^(-2i / head_dim) at columns i and
// i + head_dim / 2 (i < head_dim / 2), computed in double and rounded once, made on `device` in
// category parameters: a module registers them as non-persistent buffers (model state, not in
// its state dict). head_dim even, context >= 1, base > 0: an InvalidArgument names the value.
struct RotaryTables {
  Tensor cos, sin;
};
RotaryTables rotary_tables(int64_t context, int64_t head_dim, double base = 10000.0, Device device = Device::cpu());

// x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1) of x's halves x1, x2 along the last
// dimension. x [..., T, head_dim] (f32, bf16 or f16); cos and sin [T', head_dim] with T' >= T, of
// which the first T rows are used, broadcast over x's leading dimensions (cast to x's type). Made
// of narrow, chunk, neg, cat, mul and add, with their backward.
Tensor apply_rotary(const Tensor& x, const Tensor& cos, const Tensor& sin);

}  // namespace cumulus::ops
