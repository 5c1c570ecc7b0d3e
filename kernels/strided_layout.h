// The layout of a copy between two strided views of the same shape (Note [Strided views] in
// engine/ops/view.cpp): what contiguous() and the views' backward pass to one kernel per device.
#pragma once

#include <cstdint>

namespace cumulus::kernels {

// dst[i] = src[i] for every index i of `size` (row-major), each side at its own element strides.
// The caller merges dimensions that are adjacent in both (fewer dimensions, longer inner loops).
struct StridedLayout {
  static constexpr int kMaxDims = 8;
  int ndim = 0;  // 0: one element
  int64_t size[kMaxDims] = {};
  int64_t src_stride[kMaxDims] = {};
  int64_t dst_stride[kMaxDims] = {};
  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= size[d];
    return n;
  }
};

}  // namespace cumulus::kernels
