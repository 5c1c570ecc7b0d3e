// The 16-bit floating types' conversions, shared by the CPU and CUDA kernels (CUMULUS_HOST_DEVICE):
// one definition, so a value converts to the same bits on every device.
//
// Note [Half-precision conversions]
// bf16 is the upper half of an f32 (8 exponent bits, 7 stored mantissa bits); f16 is IEEE 754
// binary16 (5 exponent bits, 10 mantissa bits, subnormals down to 2^-24, largest finite 65504).
// - Widening (to f32) is exact for every value of both, subnormals, infinities and NaN included.
// - Narrowing (from f32) rounds to nearest, ties to even, as IEEE's default and as PyTorch's
//   `.to(torch.bfloat16)` / `.half()`: a value past the largest finite one by at least half a unit
//   becomes infinity (f16: from 65520 up), and f32 values below the smallest subnormal's half become
//   a signed zero. NaN stays NaN with its sign, quiet: rounding never carries a NaN's payload into
//   the exponent and so never makes it an infinity.
// Written with integer arithmetic, not the compilers' intrinsics: the host has no bf16 type of its
// own in C++17, and the same code on both sides is the point.
#pragma once

#include <cstdint>
#include <cstring>

#include "cumulus/tensor/dtype.h"
#include "kernels/host_device.h"

namespace cumulus::kernels {

CUMULUS_HOST_DEVICE uint32_t f32_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

CUMULUS_HOST_DEVICE float f32_from_bits(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

CUMULUS_HOST_DEVICE float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

CUMULUS_HOST_DEVICE uint16_t f32_to_bf16(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN, quiet
  // Round the dropped 16 bits to nearest, ties to the even kept bit; a carry moves into the
  // exponent, which is the right result (up to infinity).
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

CUMULUS_HOST_DEVICE float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
  if (exponent == 0x1F) return f32_from_bits(sign | 0x7F800000u | (mantissa << 13));  // inf, NaN
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in f32
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-08f;
    return sign != 0 ? -magnitude : magnitude;
  }
  return f32_from_bits(sign | ((exponent + 112u) << 23) | (mantissa << 13));  // rebias 15 -> 127
}

CUMULUS_HOST_DEVICE uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));  // NaN, quiet
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 (and infinity): infinity
  if (a >= 0x38800000u) {  // normal in f16 (>= 2^-14): rebias 127 -> 15, round the dropped 13 bits
    const uint32_t r = a - (112u << 23);
    return static_cast<uint16_t>(sign | ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13));
  }
  // Subnormal in f16 (or zero): the value in units of 2^-24 is m * 2^(e - 126 - 24 + 24), i.e.
  // m >> (126 - e) with m the 24-bit significand; round what the shift drops.
  const uint32_t e = a >> 23;
  if (e < 102) return sign;  // below 2^-25: rounds to zero (f32 subnormals included)
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u, shift = 126u - e;  // shift in [14, 24]
  uint32_t q = m >> shift;
  const uint32_t rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (q & 1u) != 0)) ++q;  // may become 0x400: the smallest normal
  return static_cast<uint16_t>(sign | q);
}

// Loads and stores of a storage type T (float, BFloat16, Half) for kernels templated over it:
// arithmetic is always f32, storage rounds once per store. For float both are the identity, so a
// kernel instantiated for float computes exactly what it did before templating.
CUMULUS_HOST_DEVICE float to_f32(float x) { return x; }
CUMULUS_HOST_DEVICE float to_f32(BFloat16 x) { return bf16_to_f32(x.bits); }
CUMULUS_HOST_DEVICE float to_f32(Half x) { return f16_to_f32(x.bits); }

template <typename T>
CUMULUS_HOST_DEVICE T from_f32(float x);
template <>
CUMULUS_HOST_DEVICE float from_f32<float>(float x) {
  return x;
}
template <>
CUMULUS_HOST_DEVICE BFloat16 from_f32<BFloat16>(float x) {
  return BFloat16{f32_to_bf16(x)};
}
template <>
CUMULUS_HOST_DEVICE Half from_f32<Half>(float x) {
  return Half{f32_to_f16(x)};
}

// Note [16-bit gradient sums]
// A tensor reached by two paths (x / x, a residual) gets the sum of two gradient contributions.
// PyTorch's autograd makes each contribution a tensor of the gradient's type and then adds them,
// so in 16 bits each is rounded before the sum, which is rounded again. The pointwise ops'
// backward kernels (binary, scalar, unary, softmax, dropout; CPU and CUDA) round the same way when
// they add into a 16-bit gradient (beta 1): x / x's two contributions, each rounded, cancel to
// PyTorch's exact 0, where one rounding of their f32 sum left their f32 difference. Ops that sum
// several terms themselves (GEMMs, reductions, scatters) still add the previous gradient into
// their f32 sum and round once. In f32 the extra rounding is the identity: no bits change.
template <typename T>
CUMULUS_HOST_DEVICE T blend_gradient(float value, float beta, T old) {
  return from_f32<T>(beta == 0.0f ? value : to_f32(from_f32<T>(value)) + beta * to_f32(old));
}

}  // namespace cumulus::kernels
