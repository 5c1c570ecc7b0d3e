// Element types. f32 is the compute type; i32 holds labels and indices; u8 holds raw data
// (Fashion-MNIST pixels); i64 holds a user's integer data (PyTorch's default integer type) for a
// TensorDataset (cumulus/data/dataset.h), whose loader gathers it as it is. bf16 and f16 are
// 16-bit storage for mixed precision: activations and their gradients may be stored in them while
// every op computes in f32 (Note [Mixed precision] in engine/ops/linear.cpp; conversions: Note
// [Half-precision conversions] in kernels/float16.h). boolean ("bool") holds masks: one byte per
// element, 0 or 1 (Note [Bool tensors] in engine/ops/compare.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace cumulus {

enum class DType : uint8_t { f32, i32, u8, bf16, f16, i64, boolean };  // (appended: values are stable)

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::i32: return 4;
    case DType::u8: return 1;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i64: return 8;
    case DType::boolean: return 1;
  }
  return 0;
}

const char* dtype_name(DType t);

// The 16-bit storage types as C++ types (the bits only; kernels/float16.h converts), so that
// Tensor::data<BFloat16>() checks the dtype as data<float>() does.
struct BFloat16 {
  uint16_t bits;
};
struct Half {
  uint16_t bits;
};

inline bool is_float16(DType t) { return t == DType::bf16 || t == DType::f16; }
inline bool is_floating(DType t) { return t == DType::f32 || is_float16(t); }

template <typename T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = DType::u8;
};
template <>
struct dtype_of<BFloat16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_of<Half> {
  static constexpr DType value = DType::f16;
};

}  // namespace cumulus
