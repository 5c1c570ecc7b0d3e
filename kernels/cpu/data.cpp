// Batch gather for the DataLoader: row r of the batch is sample s = order[start + r] (or
// start + r without an order) of a u8 dataset [n, row]:
//   x[r, c] = images[s, c] / 255   (in f32, as torchvision's ToTensor: a true division, not * (1/255);
//                                   then stored as T, rounded once for a 16-bit batch)
//   y[r]    = labels[s]
// No backward: data has no gradient.
#include <cstdint>

#include "kernels/cpu/kernels.h"

namespace cumulus::kernels {

template <typename T>
void gather_batch_cpu(const uint8_t* images, const int32_t* labels, const int32_t* order, int64_t start,
                      int64_t count, int64_t row, T* x, int32_t* y) {
  for (int64_t r = 0; r < count; ++r) {
    const int64_t s = order ? static_cast<int64_t>(order[start + r]) : start + r;
    const uint8_t* src = images + s * row;
    T* dst = x + r * row;
    for (int64_t c = 0; c < row; ++c) dst[c] = from_f32<T>(static_cast<float>(src[c]) / 255.0f);
    y[r] = labels[s];
  }
}

template void gather_batch_cpu(const uint8_t*, const int32_t*, const int32_t*, int64_t, int64_t, int64_t, float*,
                              int32_t*);
template void gather_batch_cpu(const uint8_t*, const int32_t*, const int32_t*, int64_t, int64_t, int64_t,
                               BFloat16*, int32_t*);
template void gather_batch_cpu(const uint8_t*, const int32_t*, const int32_t*, int64_t, int64_t, int64_t, Half*,
                               int32_t*);

}  // namespace cumulus::kernels
