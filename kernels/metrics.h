// Device-side evaluation totals, shared by the CPU loop (kernels/cpu/cross_entropy.cpp) and the
// CUDA kernel (kernels/cuda/cross_entropy.cu): a test pass adds every batch into one of these in
// device memory (host memory on the CPU) and the host reads it once at the end
// (ops::ClassificationTally). And the argmax rule of a row, shared by argmax_rows and the tally on
// both devices.
#pragma once

#include <cstdint>

#include "kernels/float16.h"
#include "kernels/host_device.h"

namespace cumulus::kernels {

struct ClassificationTotals {
  double loss_sum;  // the batches' mean losses, summed in double (as the seed's Python loop does)
  int64_t correct;  // rows whose top-1 prediction equals the label
  int64_t samples;
  int64_t batches;
};

// The index of the row's maximum as torch.argmax picks it: the first NaN (NaN counts as the
// largest value), else the first largest value. 0 for an empty row.
template <typename T>
CUMULUS_HOST_DEVICE int32_t row_argmax(const T* xr, int64_t cols) {
  if (cols <= 0) return 0;
  int32_t best = 0;
  float best_value = to_f32(xr[0]);
  for (int64_t j = 1; j < cols && best_value == best_value; ++j) {
    const float v = to_f32(xr[j]);
    if (!(v <= best_value)) {  // larger, or NaN
      best = static_cast<int32_t>(j);
      best_value = v;
    }
  }
  return best;
}

}  // namespace cumulus::kernels
