// Software prefetch for the CPU kernels that walk rows.
#pragma once

#include <cstdint>

namespace cumulus::kernels {

// Asks for n floats from p into the cache ahead of their use, a 64-byte line at a time. The row
// kernels (layer norm, softmax) call it for the next row: where each row starts a 4 KiB page, the
// hardware prefetcher, which stays within a page, starts over on every row, and the row's first
// lines would be misses to L3 or memory.
inline void prefetch_floats(const float* p, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) __builtin_prefetch(p + i);
}

}  // namespace cumulus::kernels
