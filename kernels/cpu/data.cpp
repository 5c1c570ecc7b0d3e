// The DataLoader's row gather on the CPU (the contract: kernels/gather.h): every column of batch
// row r from sample s = order[start + r] (order null: start + r), a copying column as one memcpy
// per row, a converting one element by element through the shared conversions.
#include <cstdint>
#include <cstring>

#include "kernels/cpu/kernels.h"

namespace cumulus::kernels {

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
      for (int64_t c = 0; c < col.row; ++c) gather_convert(col, r, s, c);
    }
  }
}

}  // namespace cumulus::kernels
