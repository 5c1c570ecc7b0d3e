// The element rules of cumulus/ops/math.h that kernels/pointwise_rules.h does not hold, shared by
// the CPU loops (kernels/cpu/math.cpp) and the CUDA kernels (kernels/cuda/math.cu): clamp, integer
// arithmetic, and the integer conversions of the arithmetic ops' type promotion.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/float16.h"
#include "kernels/host_device.h"
#include "kernels/pointwise_rules.h"

namespace cumulus::kernels {

// clamp(x, lo, hi) as torch.clamp: min(max(x, lo), hi), so hi wins where lo > hi; a NaN in x or in a
// bound gives NaN. An absent bound is -inf (lo) or +inf (hi).
CUMULUS_HOST_DEVICE float clamp_apply(float x, float lo, float hi) {
  const float v = (x < lo || lo != lo) ? lo : x;
  return (v > hi || hi != hi) ? hi : v;
}

// PyTorch's clamp_backward: dy where lo <= x <= hi (the bounds themselves included), else 0; a NaN
// x compares false, so its gradient is 0.
CUMULUS_HOST_DEVICE float clamp_grad(float dy, float x, float lo, float hi) { return (x >= lo && x <= hi) ? dy : 0.0f; }

// a op b for integers (add, sub, mul; the caller never passes another op): two's-complement
// wrap-around on overflow, as PyTorch's integer tensors, computed unsigned so it is defined.
template <typename I>
CUMULUS_HOST_DEVICE I int_binary_apply(BinaryOp op, I a, I b) {
  using U = typename std::make_unsigned<I>::type;
  const U ua = static_cast<U>(a), ub = static_cast<U>(b);
  switch (op) {
    case BinaryOp::add: return static_cast<I>(static_cast<U>(ua + ub));
    case BinaryOp::sub: return static_cast<I>(static_cast<U>(ua - ub));
    default: return static_cast<I>(static_cast<U>(ua * ub));
  }
}

// An integer converted to To: to an integer type by value, to a floating one rounded to nearest
// even in f32 first (a 16-bit type then rounds the f32 value, as PyTorch's conversions do).
template <typename To, typename From>
CUMULUS_HOST_DEVICE To int_convert(From v) {
  if constexpr (std::is_integral<To>::value) {
    return static_cast<To>(v);
  } else {
    return from_f32<To>(static_cast<float>(v));
  }
}

}  // namespace cumulus::kernels
