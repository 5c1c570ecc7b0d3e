// Batch gather for the DataLoader: row r of the batch is sample s = order[start + r] (or
// start + r without an order) of a u8 dataset [n, row]:
//   x[r, c] = images[s, c] / 255   (in f32, as torchvision's ToTensor: a true division, not * (1/255);
//                                   nvcc's default -prec-div=true makes it the same IEEE-rounded
//                                   quotient as the CPU kernel, bit for bit; then stored as T,
//                                   rounded once for a 16-bit batch, as the CPU kernel does)
//   y[r]    = labels[s]            (written by the thread of column 0: one launch per batch; by a
//                                   loop of their own for rows of 0 pixels)
// No backward: data has no gradient.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace cumulus::kernels {

namespace {

using cuda_common::blocks_for;
using cuda_common::kThreads;
using cuda_common::launch;

template <typename T>
__device__ __forceinline__ void gather_rows(const uint8_t* images, const int32_t* labels, const int32_t* order,
                                            int64_t start, int64_t count, int64_t row, T* x, int32_t* y) {
  const int64_t n = count * row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t r = i / row, c = i - r * row;
    const int64_t s = order ? static_cast<int64_t>(order[start + r]) : start + r;
    x[i] = from_f32<T>(static_cast<float>(images[s * row + c]) / 255.0f);
    if (c == 0) y[r] = labels[s];
  }
  // Images of no pixels have no column 0 to carry the labels, which gather_batch_cpu still writes.
  if (row == 0)
    CUMULUS_GRID_STRIDE_LOOP(r, count) y[r] = labels[order ? static_cast<int64_t>(order[start + r]) : start + r];
}

template <typename T>
__global__ void gather_batch_kernel(const uint8_t* images, const int32_t* labels, const int32_t* order,
                                    int64_t start, int64_t count, int64_t row, T* x, int32_t* y) {
  gather_rows(images, labels, order, start, count, row, x, y);
}

// The batch at cursor->position (or in ring slot cursor->ring_slot); the last block to finish
// advances the cursor (every block has read it by then: each reads it before counting itself done).
template <typename T>
__global__ void gather_batch_at_cursor_kernel(const uint8_t* images, const int32_t* labels, const int32_t* order,
                                              GatherCursor* cursor, int64_t batch_size, int64_t ring, int64_t count,
                                              int64_t row, T* x, int32_t* y) {
  __shared__ int64_t start;
  if (threadIdx.x == 0) start = (ring > 0 ? int64_t(cursor->ring_slot) : cursor->position) * batch_size;
  __syncthreads();
  gather_rows(images, labels, order, start, count, row, x, y);
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&cursor->blocks_done, 1u) == gridDim.x - 1) {
      cursor->position += 1;
      if (ring > 0) cursor->ring_slot = static_cast<uint32_t>((cursor->ring_slot + 1) % ring);
      cursor->blocks_done = 0;
    }
  }
}

}  // namespace

template <typename T>
void gather_batch_cuda(const uint8_t* images, const int32_t* labels, const int32_t* order, int64_t start,
                       int64_t count, int64_t row, T* x, int32_t* y, cudaStream_t stream) {
  if (count == 0) return;  // (row 0 still writes the labels)
  launch<gather_batch_kernel<T>>(blocks_for(count * row), kThreads, stream, images, labels, order, start, count, row, x,
                                 y);
}

template <typename T>
void gather_batch_at_cursor_cuda(const uint8_t* images, const int32_t* labels, const int32_t* order,
                                 GatherCursor* cursor, int64_t batch_size, int64_t ring, int64_t count, int64_t row,
                                 T* x, int32_t* y, cudaStream_t stream) {
  launch<gather_batch_at_cursor_kernel<T>>(blocks_for(count * row), kThreads, stream, images, labels, order, cursor,
                                           batch_size, ring, count, row, x, y);
}

#define CUMULUS_INSTANTIATE(T)                                                                                   \
  template void gather_batch_cuda(const uint8_t*, const int32_t*, const int32_t*, int64_t, int64_t, int64_t, T*, \
                                  int32_t*, cudaStream_t);                                                       \
  template void gather_batch_at_cursor_cuda(const uint8_t*, const int32_t*, const int32_t*, GatherCursor*,       \
                                            int64_t, int64_t, int64_t, int64_t, T*, int32_t*, cudaStream_t);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
