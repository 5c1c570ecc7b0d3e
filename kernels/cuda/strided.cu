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
// contiguous()).
template <typename T>
__global__ void strided_copy_kernel(const T* src, T* dst, StridedLayout l, float beta, int64_t total) {
  CUMULUS_GRID_STRIDE_LOOP(e, total) {
    int64_t rest = e, s = 0, d = 0;
    for (int k = l.ndim - 1; k >= 0; --k) {
      const int64_t i = rest % l.size[k];
      rest /= l.size[k];
      s += i * l.src_stride[k];
      d += i * l.dst_stride[k];
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
  launch<strided_copy_kernel<T>>(blocks_for(total), kThreads, stream, src, dst, layout, beta, total);
}

template void strided_copy_cuda(const float*, float*, const StridedLayout&, float, cudaStream_t);
template void strided_copy_cuda(const BFloat16*, BFloat16*, const StridedLayout&, float, cudaStream_t);
template void strided_copy_cuda(const Half*, Half*, const StridedLayout&, float, cudaStream_t);
template void strided_copy_cuda(const int32_t*, int32_t*, const StridedLayout&, float, cudaStream_t);
template void strided_copy_cuda(const int64_t*, int64_t*, const StridedLayout&, float, cudaStream_t);
template void strided_copy_cuda(const uint8_t*, uint8_t*, const StridedLayout&, float, cudaStream_t);

}  // namespace cumulus::kernels
