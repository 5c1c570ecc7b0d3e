// What every CUDA kernel file shares: the launch, the block size, grid sizing for grid-stride
// loops, and the block reduction. One definition each, so a change of policy is made in one place.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "kernels/float16.h"

#ifndef CUMULUS_CUDA_EMULATION
#include "kernels/cuda/cuda_check.h"
#endif

namespace cumulus::kernels::cuda_common {

// Note [Kernel launches]
// Every kernel in kernels/cuda is launched as launch<kernel>(grid, block, stream, args...): under
// nvcc a triple-chevron launch followed by CUMULUS_LAUNCH_CHECK (the launch counted, a bad
// configuration caught at the launch site); in the CPU emulation (tests/emulation/cuda_runtime.h,
// which defines CUMULUS_CUDA_EMULATION) the emulated launch, which also records the kernel's name.
// One syntax for both, so no launch can escape the emulated test suite: tests/CMakeLists.txt
// refuses a kernel file with `<<<` in it, and compiles every kernel file into the emulation (a file
// it cannot build fails the build). launch_with_shared<kernel>(grid, block, bytes, stream, args...)
// also gives each block `bytes` of dynamic shared memory, which the kernel reaches through
// dynamic_shared<T>(); past the 48 KiB every kernel may have, the kernel is allowed more first
// (cudaFuncSetAttribute, as FlashAttention's launches do, also while a graph is captured).
template <auto Kernel, typename... Args>
void launch_with_shared(dim3 grid, dim3 block, std::size_t shared_bytes, cudaStream_t stream, Args&&... args) {
#ifdef CUMULUS_CUDA_EMULATION
  (void)stream;
  cuda_emulation::launch_with_shared<Kernel>(grid, block, shared_bytes, std::forward<Args>(args)...);
#else
  if (shared_bytes > 48 * 1024)
    CUMULUS_CUDA_CHECK(
        cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared_bytes)));
  // (clang-format would split the chevrons)
  // clang-format off
  Kernel<<<grid, block, shared_bytes, stream>>>(std::forward<Args>(args)...);
  // clang-format on
  CUMULUS_LAUNCH_CHECK();
#endif
}
template <auto Kernel, typename... Args>
void launch(dim3 grid, dim3 block, cudaStream_t stream, Args&&... args) {
  launch_with_shared<Kernel>(grid, block, 0, stream, std::forward<Args>(args)...);
}

// The block's dynamic shared memory (launch_with_shared), 16-byte aligned.
template <typename T>
__device__ __forceinline__ T* dynamic_shared() {
#ifdef CUMULUS_CUDA_EMULATION
  return static_cast<T*>(cuda_emulation::dynamic_shared_memory());
#else
  extern __shared__ __align__(16) float4 cumulus_dynamic_shared[];
  return reinterpret_cast<T*>(cumulus_dynamic_shared);
#endif
}

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

// for (int64_t i = ...; i < n; ...) over the whole grid, for kernels launched with blocks_for(n).
#define CUMULUS_GRID_STRIDE_LOOP(i, n)                                                   \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// A gradient sink's write (GradientMode as the GEMM-style beta): *dst = value + beta * *dst, stored
// as T (one rounding for 16 bits). Beta 0 overwrites without loading *dst at all: the old value may
// be anything (NaN included, and it must not leak), or never written (a fresh buffer, which
// compute-sanitizer's initcheck would report as read). The destination is a pointer, not a value,
// so that no caller can load it before beta is tested.
template <typename T>
__device__ __forceinline__ void store_blend(T* dst, float value, float beta) {
  *dst = from_f32<T>(beta == 0.0f ? value : value + beta * to_f32(*dst));
}

// store_blend for the pointwise ops' gradients, each contribution rounded to T before it is added
// (Note [16-bit gradient sums] in kernels/float16.h).
template <typename T>
__device__ __forceinline__ void store_blend_rounded(T* dst, float value, float beta) {
  *dst = beta == 0.0f ? from_f32<T>(value) : blend_gradient<T>(value, beta, *dst);
}

// Max / sum over the warp's 32 lanes by a butterfly of xor shuffles: every lane gets the result,
// and the order is fixed (the same bits on every run). All 32 lanes must take part.
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
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

// Sum of x[0, n) by the whole block (every thread gets it): each thread a strided partial sum,
// then block_sum. The order depends only on n and blockDim, so a loss summed in one kernel or in
// another gives the same bits.
__device__ inline float block_sum_all(const float* x, int64_t n) {
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  return block_sum(s);
}

}  // namespace cumulus::kernels::cuda_common
