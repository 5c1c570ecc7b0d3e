// CPU launchers of cumulus/ops/math.h's kernels that the pointwise launchers do not cover
// (kernels/cpu/math.cpp): clamp, integer arithmetic with broadcasting, and integer conversions.
// The element rules are kernels/math_rules.h, shared with the CUDA kernels. Where beta is 0 the
// destination is never read.
#pragma once

#include <cstdint>

#include "kernels/math_rules.h"

namespace cumulus::kernels {

// y = clamp_apply(x, lo, hi), n elements; T float, BFloat16 or Half.
template <typename T>
void clamp_forward_cpu(float lo, float hi, const T* x, T* y, int64_t n);
// dx = clamp_grad(dy, x, lo, hi) + beta * dx.
template <typename T>
void clamp_backward_cpu(float lo, float hi, const T* x, const T* dy, float beta, T* dx, int64_t n);

// y[i] = int_binary_apply(op, a[ia], b[ib]) over the output of `g` (Note [Broadcast geometry]);
// I int32_t or int64_t, op add, sub or mul.
template <typename I>
void int_binary_forward_cpu(const BroadcastGeometry& g, BinaryOp op, const I* a, const I* b, I* y);

// y = int_convert<To>(x), n elements: From int32_t or int64_t; To int64_t, float, BFloat16 or Half.
template <typename From, typename To>
void int_convert_cpu(const From* x, To* y, int64_t n);

}  // namespace cumulus::kernels
