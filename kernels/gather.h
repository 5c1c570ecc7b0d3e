// The DataLoader's row gather, shared by the CPU loop (kernels/cpu/data.cpp) and the CUDA kernels
// (kernels/cuda/data.cu): what a batch's tensors are (GatherColumns), the element conversions
// (CUMULUS_HOST_DEVICE: the same bits on every device), and the device-side cursor.
//
// Row r < count of a batch is sample s = order[start + r] (order null: start + r). For every column
// (one per dataset tensor), dst[r, :] = src[s, :], either as the same bytes (dst_type == src_type and
// divisor 1) or converted to a floating type: dst = from_f32<dst_type>(float(src) / divisor),
// computed in f32 and rounded once (the image path: u8 pixels / 255 as torchvision's ToTensor, a
// true division, not * (1/255)). No backward: data has no gradient.
#pragma once

#include <cstdint>

#include "cumulus/tensor/dtype.h"
#include "kernels/float16.h"

namespace cumulus::kernels {

// One dataset tensor [n, row] and its batch [count, row] (row: elements per sample).
struct GatherColumn {
  const void* src;  // sample 0 of the dataset tensor (or of a staging ring)
  void* dst;        // row 0 of the batch
  int64_t row;
  DType src_type;  // u8, i32, i64 or f32
  DType dst_type;  // src_type (copy), or f32, bf16, f16 (conversion)
  float divisor;   // 1: none
};

// At most this many tensors per gather: the columns travel by value as one kernel argument.
constexpr int kMaxGatherColumns = 8;
struct GatherColumns {
  int32_t count;
  GatherColumn column[kMaxGatherColumns];
};

// Whether the column is a copy of bytes (no conversion).
CUMULUS_HOST_DEVICE bool gather_copies(const GatherColumn& c) { return c.dst_type == c.src_type && c.divisor == 1.0f; }

// The widest unit (8, 4, 2 or 1 bytes) dividing a row's bytes and both base addresses: a copying
// column moves its rows in units of this size, every one aligned.
inline int64_t gather_copy_unit(const GatherColumn& c) {
  const uint64_t bits = static_cast<uint64_t>(c.row) * dtype_size(c.src_type) |
                        static_cast<uint64_t>(reinterpret_cast<uintptr_t>(c.src)) |
                        static_cast<uint64_t>(reinterpret_cast<uintptr_t>(c.dst));
  for (int64_t unit = 8; unit > 1; unit /= 2)
    if (bits % static_cast<uint64_t>(unit) == 0) return unit;
  return 1;
}

// Element i of a source tensor as f32 (i64 and large i32 values round to nearest).
CUMULUS_HOST_DEVICE float gather_load_f32(const void* src, DType type, int64_t i) {
  switch (type) {
    case DType::u8: return static_cast<float>(static_cast<const uint8_t*>(src)[i]);
    case DType::i32: return static_cast<float>(static_cast<const int32_t*>(src)[i]);
    case DType::i64: return static_cast<float>(static_cast<const int64_t*>(src)[i]);
    default: return static_cast<const float*>(src)[i];  // f32 (the loader refuses other sources)
  }
}

// Stores v as element i of a floating batch tensor (rounded to nearest even for 16 bits).
CUMULUS_HOST_DEVICE void gather_store_f32(void* dst, DType type, int64_t i, float v) {
  switch (type) {
    case DType::bf16: static_cast<BFloat16*>(dst)[i] = from_f32<BFloat16>(v); return;
    case DType::f16: static_cast<Half*>(dst)[i] = from_f32<Half>(v); return;
    default: static_cast<float*>(dst)[i] = v; return;  // f32
  }
}

// The converted value of element c of sample s.
CUMULUS_HOST_DEVICE void gather_convert(const GatherColumn& col, int64_t r, int64_t s, int64_t c) {
  gather_store_f32(col.dst, col.dst_type, r * col.row + c,
                   gather_load_f32(col.src, col.src_type, s * col.row + c) / col.divisor);
}

// The DataLoader's device-side position (16 bytes, zeroed at creation): the batch index, a count
// of the gather's finished blocks (zero between launches) and, for a staging ring, the slot the
// next gather reads.
struct GatherCursor {
  int64_t position;
  uint32_t blocks_done;
  uint32_t ring_slot;
};

}  // namespace cumulus::kernels
