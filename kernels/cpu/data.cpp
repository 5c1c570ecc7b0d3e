// The DataLoader's row gather on the CPU (the contract: kernels/gather.h): every column of batch
// row r from sample s = order[start + r] (order null: start + r), a copying column as one memcpy
// per row, a converting one element by element through the shared conversions.
#include <cstdint>
#include <cstring>

#include "kernels/cpu/kernels.h"

namespace cumulus::kernels {

namespace {
// dst[c] = float(src[c]) / divisor: gather_convert's value for an f32 batch, in one typed loop the
// compiler vectorizes (gather_convert switches on both types for every element: 3% of the seed
// MLP's 64 x 1 epoch for its u8 pixels). The same IEEE division, so the same bits.
template <typename S>
void convert_row_to_f32(const S* src, float* dst, int64_t n, float divisor) {
  for (int64_t c = 0; c < n; ++c) dst[c] = static_cast<float>(src[c]) / divisor;
}

// Row r of a converting column from sample s through convert_row_to_f32, or false where its types
// go element by element (16-bit batches, i64 sources).
bool convert_row(const GatherColumn& col, int64_t r, int64_t s) {
  if (col.dst_type != DType::f32) return false;
  float* dst = static_cast<float*>(col.dst) + r * col.row;
  const int64_t at = s * col.row;
  switch (col.src_type) {
    case DType::u8: convert_row_to_f32(static_cast<const uint8_t*>(col.src) + at, dst, col.row, col.divisor); return true;
    case DType::i32: convert_row_to_f32(static_cast<const int32_t*>(col.src) + at, dst, col.row, col.divisor); return true;
    case DType::f32: convert_row_to_f32(static_cast<const float*>(col.src) + at, dst, col.row, col.divisor); return true;
    default: return false;
  }
}
}  // namespace

void gather_rows_cpu(const GatherColumns& columns, const int32_t* order, int64_t start, int64_t count) {
  for (int32_t k = 0; k < columns.count; ++k) {
    const GatherColumn& col = columns.column[k];
    const auto row_bytes = static_cast<std::size_t>(col.row) * dtype_size(col.src_type);
    for (int64_t r = 0; r < count; ++r) {
      const int64_t s = order ? static_cast<int64_t>(order[start + r]) : start + r;
      if (gather_copies(col)) {
        if (row_bytes > 0)
          std::memcpy(static_cast<char*>(col.dst) + r * row_bytes, static_cast<const char*>(col.src) + s * row_bytes,
                      row_bytes);
        continue;
      }
      if (!convert_row(col, r, s))
        for (int64_t c = 0; c < col.row; ++c) gather_convert(col, r, s, c);
    }
  }
}

}  // namespace cumulus::kernels
