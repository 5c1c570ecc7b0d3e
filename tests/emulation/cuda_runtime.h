// A CPU emulation of the subset of CUDA that kernels/cuda/fused_mlp.cu uses, so that file's
// kernels (their index arithmetic, tiling, reductions, barriers, the beta and mask rules) run in
// the CPU test suite: tests/test_fused_kernels_emulated.cpp. It stands in for <cuda_runtime.h>
// only in that test's translation units (tests/CMakeLists.txt puts this folder first on their
// include path); everything else in the repository uses the real CUDA headers.
//
// Why written here: no packaged library runs CUDA C++ kernels on a CPU, and the fused kernels were
// written on a machine without a GPU; this lets CI execute exactly the source nvcc compiles.
// The model: every CUDA thread of a block is a std::thread; blocks run one after another, so a
// function-local static is the block's shared memory (and the last block to arrive is the last
// launched). __syncthreads is a barrier of the block's threads and a warp shuffle a barrier of the
// warp's 32 (every lane must take part, as with a full mask). A barrier that not every thread
// reaches hangs, as it would be undefined on a GPU. What it cannot show: timing, the memory model
// across blocks running at once, nvcc's code generation.
#pragma once

#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cumulus/core/error.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct CUstream_st;
using cudaStream_t = CUstream_st*;
struct float4 {
  float x, y, z, w;
};

// After every launch (kernels/cuda's convention): nothing to check on the CPU.
#define CUMULUS_LAUNCH_CHECK() \
  do {                         \
  } while (0)

namespace cuda_emulation {
struct Index {
  unsigned x = 0, y = 0, z = 0;
};
}  // namespace cuda_emulation

inline thread_local cuda_emulation::Index threadIdx, blockIdx, blockDim, gridDim;

namespace cuda_emulation {

// std::barrier is C++20; the repository is C++17.
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t generation = generation_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  const int count_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

struct Warp {
  Barrier barrier{32};
  float lanes[32] = {};
};
struct Block {
  std::unique_ptr<Barrier> barrier;
  std::vector<std::unique_ptr<Warp>> warps;
};

inline thread_local Block* current_block = nullptr;

// Lane `lane` of the calling thread's warp gets what lane `source(lane)` passed in.
template <typename Source>
float exchange(float v, Source source) {
  Warp& warp = *current_block->warps[threadIdx.x / 32];
  const int lane = static_cast<int>(threadIdx.x % 32);
  warp.lanes[lane] = v;
  warp.barrier.arrive_and_wait();
  const float got = warp.lanes[source(lane)];
  warp.barrier.arrive_and_wait();  // nobody overwrites lanes before everyone has read
  return got;
}

}  // namespace cuda_emulation

inline void __syncthreads() { cuda_emulation::current_block->barrier->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int mask) {
  return cuda_emulation::exchange(v, [&](int lane) { return lane ^ mask; });
}
inline float __shfl_down_sync(unsigned, float v, int delta) {
  return cuda_emulation::exchange(v, [&](int lane) { return lane + delta < 32 ? lane + delta : lane; });
}
template <typename T>
T __ldg(const T* p) {
  return *p;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// kernel<<<grid, threads, 0, stream>>>(args...): the test's build rewrites launches into this.
// One std::thread per CUDA thread of a block, reused for every block of the grid in turn (a
// barrier after each block, so a block's threads never overlap the next block's).
template <typename Kernel, typename... Args>
void cumulus_emulate_launch(Kernel kernel, unsigned grid, int threads, Args... args) {
  CUMULUS_CHECK(threads % 32 == 0 && threads <= 1024, cumulus::InvalidArgument, "emulated launch of ", threads,
                " threads per block");
  cuda_emulation::Block block;
  block.barrier = std::make_unique<cuda_emulation::Barrier>(threads);
  for (int w = 0; w < threads / 32; ++w) block.warps.push_back(std::make_unique<cuda_emulation::Warp>());
  cuda_emulation::Barrier block_done(threads);
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      threadIdx.x = static_cast<unsigned>(t);
      blockDim.x = static_cast<unsigned>(threads);
      gridDim.x = grid;
      cuda_emulation::current_block = &block;
      for (unsigned b = 0; b < grid; ++b) {
        blockIdx.x = b;
        kernel(args...);
        block_done.arrive_and_wait();
      }
    });
  for (std::thread& t : pool) t.join();
}
