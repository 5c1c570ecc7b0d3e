// max_pool2d's window rule, shared by the CPU loops (kernels/cpu/pool.cpp) and the CUDA kernels
// (kernels/cuda/pool.cu), so both devices pick literally the same element of every window.
#pragma once

#include <cstdint>

#include "kernels/cpu/conv_kernels.h"
#include "kernels/host_device.h"

namespace cumulus::kernels {

// Index into the plane [h, w] of the window maximum of output (oi, oj), by PyTorch's rule: scanning
// in row-major window order, a larger value or any NaN takes the place of the maximum so far, so the
// last NaN wins a window that holds one, else the first largest value. Padding is skipped (as -inf
// would be): the op's checks (padding at most half the kernel) guarantee every window covers an input
// element.
template <typename T>
CUMULUS_HOST_DEVICE int64_t pool_window_argmax(const Pool2dGeometry& g, const T* plane, int64_t oi, int64_t oj) {
  const int64_t i0 = oi * g.stride_h - g.pad_h, j0 = oj * g.stride_w - g.pad_w;
  const int64_t i_begin = i0 > 0 ? i0 : 0, i_end = i0 + g.kernel_h < g.h ? i0 + g.kernel_h : g.h;
  const int64_t j_begin = j0 > 0 ? j0 : 0, j_end = j0 + g.kernel_w < g.w ? j0 + g.kernel_w : g.w;
  int64_t best = i_begin * g.w + j_begin;
  float best_value = to_f32(plane[best]);
  for (int64_t i = i_begin; i < i_end; ++i) {
    const T* row = plane + i * g.w;
    for (int64_t j = j_begin; j < j_end; ++j) {
      const float v = to_f32(row[j]);
      if (v > best_value || v != v) {
        best = i * g.w + j;
        best_value = v;
      }
    }
  }
  return best;
}

}  // namespace cumulus::kernels
