// What every CUDA kernel file shares: the block size, grid sizing for grid-stride loops, and the
// block reduction. One definition each, so a change of policy is made in one place.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace cumulus::kernels::cuda_common {

// 256 threads: 8 warps, enough to hide latency in the memory-bound kernels we write, and a
// multiple of every warp-level reduction below.
constexpr int kThreads = 256;
// Grid-stride loops need no more blocks than the GPU keeps resident (132 SMs x 16 blocks of 256
// threads on an H100 is ~2100); 4096 leaves room for larger parts without launching idle blocks.
constexpr int64_t kMaxBlocks = 4096;

// Blocks for n elements, one per thread, capped for a grid-stride loop.
inline unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks)));
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the total.
// Warp shuffles, then one value per warp through shared memory: a fixed order, so results are
// reproducible bit for bit.
template <typename T>
__device__ T block_sum(T v) {
  __shared__ T warp_sums[32];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  T total = 0;
  if (warp == 0) {
    total = lane < static_cast<int>(blockDim.x / 32) ? warp_sums[lane] : T(0);
    for (int offset = 16; offset > 0; offset /= 2) total += __shfl_down_sync(0xffffffffu, total, offset);
    if (lane == 0) warp_sums[0] = total;
  }
  __syncthreads();
  total = warp_sums[0];
  __syncthreads();  // warp_sums may be reused by the next call
  return total;
}

}  // namespace cumulus::kernels::cuda_common
