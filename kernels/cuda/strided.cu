#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/strided_kernels.h"

namespace cumulus::kernels {

namespace {

using cuda_common::blocks_for;
using cuda_common::kThreads;
using cuda_common::launch;

// One thread per element in the row-major order of the layout's sizes: consecutive threads write
// consecutive elements of the last dimension (coalesced when the destination is dense, as in
// contiguous()). Index: the type the element's position is split into coordinates in, one division
// and one remainder per dimension: uint32_t whenever the copy has under 2^32 elements (every
// transpose of the attention path: a 32-bit division is a handful of instructions where a 64-bit
// one is a call of dozens), int64_t otherwise. The offsets are 64-bit either way.
template <typename T, typename Index>
__global__ void strided_copy_kernel(const T* src, T* dst, StridedLayout l, float beta, int64_t total) {
  CUMULUS_GRID_STRIDE_LOOP(e, total) {
    Index rest = static_cast<Index>(e);
    int64_t s = 0, d = 0;
    for (int k = l.ndim - 1; k >= 0; --k) {
      const auto size = static_cast<Index>(l.size[k]);
      const Index i = rest % size;
      rest /= size;
      s += static_cast<int64_t>(i) * l.src_stride[k];
      d += static_cast<int64_t>(i) * l.dst_stride[k];
    }
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>) {
      cuda_common::store_blend(dst + d, to_f32(src[s]), beta);
    } else {
      dst[d] = src[s];
    }
  }
}

}  // namespace

template <typename T>
void strided_copy_cuda(const T* src, T* dst, const StridedLayout& layout, float beta, cudaStream_t stream) {
  const int64_t total = layout.numel();
  if (total == 0) return;
  if (total <= static_cast<int64_t>(UINT32_MAX))
    launch<strided_copy_kernel<T, uint32_t>>(blocks_for(total), kThreads, stream, src, dst, layout, beta, total);
  else launch<strided_copy_kernel<T, int64_t>>(blocks_for(total), kThreads, stream, src, dst, layout, beta, total);
}

template void strided_copy_cuda(const float*, float*, const StridedLayout&, float, cudaStream_t);
template void strided_copy_cuda(const BFloat16*, BFloat16*, const StridedLayout&, float, cudaStream_t);
template void strided_copy_cuda(const Half*, Half*, const StridedLayout&, float, cudaStream_t);
template void strided_copy_cuda(const int32_t*, int32_t*, const StridedLayout&, float, cudaStream_t);
template void strided_copy_cuda(const int64_t*, int64_t*, const StridedLayout&, float, cudaStream_t);
template void strided_copy_cuda(const uint8_t*, uint8_t*, const StridedLayout&, float, cudaStream_t);

}  // namespace cumulus::kernels
