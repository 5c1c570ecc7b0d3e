#include <algorithm>
#include <type_traits>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/strided_kernels.h"

namespace cumulus::kernels {

namespace {

template <typename T>
inline void store(T* dst, T value, float beta) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>) {
    *dst = beta == 0.0f ? value : from_f32<T>(to_f32(value) + beta * to_f32(*dst));
  } else {
    *dst = value;
  }
}

// A run of n elements contiguous on both sides (a permute's innermost dimension, a narrow's rows):
// a block copy when overwriting, else the same store as one element at a time.
template <typename T>
void copy_run(const T* src, T* dst, int64_t n, float beta) {
  if (beta == 0.0f) {
    std::copy(src, src + n, dst);
    return;
  }
  for (int64_t i = 0; i < n; ++i) store(dst + i, src[i], beta);
}

// Rows r0 to r1 of the layout (a row: the last dimension) with an odometer over the outer
// dimensions and a strided loop over the last; the start's offsets divided out once.
template <typename T>
void copy_rows(const T* src, T* dst, const StridedLayout& l, int64_t r0, int64_t r1, float beta) {
  const int last = l.ndim - 1;
  const int64_t n = l.size[last], ss = l.src_stride[last], ds = l.dst_stride[last];
  int64_t index[StridedLayout::kMaxDims] = {};
  int64_t s0 = 0, d0 = 0;
  for (int64_t d = last - 1, rest = r0; d >= 0; --d) {
    index[d] = rest % l.size[d];
    rest /= l.size[d];
    s0 += index[d] * l.src_stride[d];
    d0 += index[d] * l.dst_stride[d];
  }
  for (int64_t r = r0; r < r1; ++r) {
    if (ss == 1 && ds == 1) copy_run(src + s0, dst + d0, n, beta);
    else
      for (int64_t i = 0; i < n; ++i) store(dst + d0 + i * ds, src[s0 + i * ss], beta);
    for (int d = last - 1; d >= 0; --d) {  // the next row: the odometer's carry
      s0 += l.src_stride[d];
      d0 += l.dst_stride[d];
      if (++index[d] < l.size[d]) break;
      s0 -= index[d] * l.src_stride[d];
      d0 -= index[d] * l.dst_stride[d];
      index[d] = 0;
    }
  }
}

}  // namespace

// Rows across threads (Note [CPU kernel threads]): each element is stored once, by one thread.
template <typename T>
void strided_copy_cpu(const T* src, T* dst, const StridedLayout& l, float beta) {
  if (l.ndim == 0) return store(dst, *src, beta);
  int64_t rows = 1;
  for (int d = 0; d < l.ndim; ++d) {
    if (l.size[d] == 0) return;
    if (d < l.ndim - 1) rows *= l.size[d];
  }
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / l.size[l.ndim - 1]);
  parallel_for(rows, grain, [&](int64_t r0, int64_t r1) { copy_rows(src, dst, l, r0, r1, beta); });
}

template void strided_copy_cpu(const float*, float*, const StridedLayout&, float);
template void strided_copy_cpu(const BFloat16*, BFloat16*, const StridedLayout&, float);
template void strided_copy_cpu(const Half*, Half*, const StridedLayout&, float);
template void strided_copy_cpu(const int32_t*, int32_t*, const StridedLayout&, float);
template void strided_copy_cpu(const int64_t*, int64_t*, const StridedLayout&, float);
template void strided_copy_cpu(const uint8_t*, uint8_t*, const StridedLayout&, float);

}  // namespace cumulus::kernels
