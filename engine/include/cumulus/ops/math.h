// Elementwise math: exp, log, sqrt, rsqrt, abs, pow, clamp, maximum, minimum, as PyTorch's ops of
// the same names. Each records its backward (PyTorch's formulas), runs on the CPU and CUDA, and
// takes f32, bf16 or f16 (16-bit storage, f32 arithmetic; the output has the input's type); an
// integer input is an InvalidArgument (cast it first). IEEE semantics throughout, as PyTorch:
// log(0) = -inf, log(-1) = NaN, sqrt(-1) = NaN, rsqrt(0) = inf, exp(89) = inf in f32; a NaN input
// gives a NaN output. Implemented in engine/ops/math.cpp (the kernels are the pointwise ones of
// kernels/pointwise_rules.h, and kernels/math_rules.h for clamp).
//
// The arithmetic ops of cumulus/ops/pointwise.h (add, sub, mul, div) also take i32 and i64 tensors,
// with PyTorch's type promotion: an integer tensor with a floating tensor computes in the floating
// tensor's type, and with a float scalar in f32; two integer tensors give an integer tensor (i64 if
// either is i64, wrapping on overflow) for add, sub and mul, and f32 for div (true division). The
// integer operand is converted to the result's type first (a copy). Two floating tensors of
// different types are refused (cast one). Integer results record no gradient.
#pragma once

#include <optional>

#include "cumulus/tensor/tensor.h"

namespace cumulus::ops {

// e^x. Saves its output: dx = dy y.
Tensor exp(const Tensor& x);
// The natural logarithm. Saves its input: dx = dy / x.
Tensor log(const Tensor& x);
// The square root. Saves its output: dx = dy / (2 y) (inf at x = 0).
Tensor sqrt(const Tensor& x);
// 1 / sqrt(x). Saves its output: dx = -dy y^3 / 2.
Tensor rsqrt(const Tensor& x);
// |x|. Saves its input: dx = dy sign(x), with sign 0 at 0 and at NaN (torch.sign's).
Tensor abs(const Tensor& x);

// x^exponent elementwise, as PyTorch computes it: exponents 2, 3 and -2 as products, 0.5, -0.5 and
// -1 as sqrt, rsqrt and reciprocal (so pow(-0, 0.5) = -0 and pow(-inf, 0.5) = NaN, as sqrt), powf
// otherwise (pow(x, 0) = 1 even for NaN x; a negative x to a non-integer power is NaN). Saves its
// input: dx = dy e x^(e - 1) (the power computed the same way), and 0 when e = 0.
Tensor pow(const Tensor& x, float exponent);
// x^exponent with numpy broadcasting, as add. Both must have the same floating dtype and device.
// Saves both: dx = dy e x^(e - 1) (0 where e = 0), de = dy x^e log x (0 where x = 0 and e >= 0).
Tensor pow(const Tensor& x, const Tensor& exponent);

// min(max(x, min), max) elementwise; an absent bound does not apply, and at least one must be given
// (an InvalidArgument otherwise). Where min > max every element becomes max, as torch.clamp; a NaN x
// (or a NaN bound) gives NaN. Saves its input: the gradient passes where min <= x <= max (PyTorch's
// clamp_backward: the bounds themselves included) and is 0 elsewhere and at NaN.
Tensor clamp(const Tensor& x, std::optional<float> min, std::optional<float> max);

// The larger (smaller) of a and b elementwise, with numpy broadcasting, as add; NaN where either is
// NaN (torch.maximum / torch.minimum). Both must have the same floating dtype and device. Saves
// both: the gradient goes to the operand that was chosen, half to each where a == b, and all of it
// to both where either is NaN (PyTorch's formulas).
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);

}  // namespace cumulus::ops
