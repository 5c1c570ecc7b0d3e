// A CPU emulation of the subset of CUDA that our kernels (kernels/cuda/*.cu) use, so that every
// kernel of ours, the very source nvcc compiles, runs in the CPU test suite (tests/emulated/). It
// stands in for <cuda_runtime.h> only in the emulated translation units (tests/CMakeLists.txt puts
// this folder first on their include path); everything else uses the real CUDA headers.
//
// Why written here: no packaged library runs CUDA C++ kernels on a CPU, and a GPU is lent to this
// project only some of the time; this lets CI execute the kernels' index arithmetic, tiling,
// reductions, barriers, beta and mask rules on every commit.
//
// The model: every CUDA thread of a block is a std::thread; the blocks of a grid run one after
// another, so a function-local static is the block's shared memory and the last block to arrive at
// a counter is the last one launched. __syncthreads is a barrier of the block's threads, a warp
// shuffle a barrier of the warp's lanes (every lane must take part, as with a full mask); a
// barrier that not every thread reaches hangs, as it would be undefined on a GPU. Kernels are
// launched only through cuda_common::launch (Note [Kernel launches] in kernels/cuda/common.cuh),
// which here calls cuda_emulation::launch: synchronous, device pointers are host pointers, and each
// launch records the kernel's name (launched_kernels) so a test can show every kernel ran.
//
// What it cannot show (only a GPU can): timing and occupancy; resource limits (registers, shared
// memory size, launch bounds); the memory model between blocks running at the same time (here
// they never overlap, so a missing fence or a race between blocks goes unseen); races between the
// threads of a block are real threads here but scheduled by the OS, so a race may pass by luck;
// warp-synchronous code that relies on lockstep execution without a shuffle or barrier; __ldg's
// read-only cache (a plain load here); the last bits of the device's math functions (expf, logf,
// rsqrtf are the host's here; nvcc's fused multiply-adds are not applied either); dynamic shared
// memory (none of our kernels uses it; launch has no parameter for it).
#pragma once

#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "cumulus/core/error.h"

// Tells kernels/cuda/common.cuh to launch through cuda_emulation::launch.
#define CUMULUS_CUDA_EMULATION 1

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
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}  // NOLINT: implicit as CUDA's
};

namespace cuda_emulation {
struct Index {
  unsigned x = 0, y = 0, z = 0;
};
}  // namespace cuda_emulation

inline thread_local cuda_emulation::Index threadIdx, blockIdx, blockDim, gridDim;

namespace cuda_emulation {

// std::barrier is C++20; the repository is C++17. On Linux a futex: the last thread to arrive
// wakes the others, which return without queueing again on a mutex as a condition variable's
// waiters do (that queue of up to 1024 threads was about half the emulated suite's time).
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  void arrive_and_wait() {
#ifdef __linux__
    const uint32_t generation = __atomic_load_n(&generation_, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&arrived_, 1, __ATOMIC_ACQ_REL) == count_) {
      __atomic_store_n(&arrived_, 0, __ATOMIC_RELAXED);  // before the release below: seen by the next round
      __atomic_add_fetch(&generation_, 1, __ATOMIC_RELEASE);
      syscall(SYS_futex, &generation_, FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
      return;
    }
    while (__atomic_load_n(&generation_, __ATOMIC_ACQUIRE) == generation)
      syscall(SYS_futex, &generation_, FUTEX_WAIT_PRIVATE, generation, nullptr, nullptr, 0);
#else
    std::unique_lock<std::mutex> lock(mutex_);
    const uint32_t generation = generation_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation; });
#endif
  }

 private:
  const int count_;
  int arrived_ = 0;
  uint32_t generation_ = 0;
#ifndef __linux__
  std::mutex mutex_;
  std::condition_variable cv_;
#endif
};

// A warp's lanes (32, or fewer for the last warp of a block whose size is not a multiple of 32)
// and the slots a shuffle exchanges values through (any type of at most 8 bytes).
struct Warp {
  explicit Warp(int lane_count) : lanes(lane_count), barrier(lane_count) {}
  const int lanes;
  Barrier barrier;
  uint64_t slots[32] = {};
};
struct Block {
  std::unique_ptr<Barrier> barrier;
  std::vector<std::unique_ptr<Warp>> warps;
};

inline thread_local Block* current_block = nullptr;
inline thread_local int current_thread = 0;  // the thread's linear index in its block

// Lane `lane` of the calling thread's warp gets what lane `source(lane)` passed in; a source lane
// outside the warp gives the caller's own value (CUDA's rule for shuffles out of range).
template <typename T, typename Source>
T exchange(T v, Source source) {
  static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= sizeof(uint64_t), "shuffled type");
  Warp& warp = *current_block->warps[static_cast<std::size_t>(current_thread / 32)];
  const int lane = current_thread % 32;
  std::memcpy(&warp.slots[lane], &v, sizeof(T));
  warp.barrier.arrive_and_wait();
  const int from = source(lane);
  T got;
  std::memcpy(&got, &warp.slots[from >= 0 && from < warp.lanes ? from : lane], sizeof(T));
  warp.barrier.arrive_and_wait();  // nobody overwrites a slot before everyone has read
  return got;
}

// The names of the kernels launched so far in this process, for tests that show every kernel ran.
inline std::mutex& launched_mutex() {
  static std::mutex m;
  return m;
}
inline std::set<std::string>& launched_set() {
  static std::set<std::string> s;
  return s;
}
inline std::set<std::string> launched_kernels() {
  std::lock_guard<std::mutex> lock(launched_mutex());
  return launched_set();
}

// "relu_forward_kernel" from GCC's or Clang's __PRETTY_FUNCTION__ of launch<Kernel>: the text after
// "Kernel = " up to the end of the argument, without '&', template arguments and qualifiers.
inline std::string kernel_name_from(const std::string& pretty) {
  const std::string key = "Kernel = ";
  std::size_t begin = pretty.find(key);
  if (begin == std::string::npos) return pretty;
  begin += key.size();
  if (pretty[begin] == '&') ++begin;
  std::size_t end = begin;
  while (end < pretty.size() && pretty[end] != '<' && pretty[end] != ';' && pretty[end] != ']' && pretty[end] != ',')
    ++end;
  std::string name = pretty.substr(begin, end - begin);
  const std::size_t colons = name.rfind("::");
  return colons == std::string::npos ? name : name.substr(colons + 2);
}

// Runs `kernel(args...)` as a grid of `grid` blocks of `block` threads: one std::thread per CUDA
// thread of a block, reused for every block in turn (a barrier after each block, so a block's
// threads never overlap the next block's). Each thread gets its own copy of the arguments,
// converted to the kernel's parameter types as a launch converts them. Also for tests that run a
// lambda as a kernel.
template <typename Kernel, typename... Params>
void run_grid(const std::string& name, Kernel kernel, dim3 grid, dim3 block, std::tuple<Params...> params) {
  const long threads = static_cast<long>(block.x) * block.y * block.z;
  const long blocks = static_cast<long>(grid.x) * grid.y * grid.z;
  CUMULUS_CHECK(threads >= 1 && threads <= 1024 && blocks >= 1, cumulus::InvalidArgument, "emulated launch of ", name,
                ": ", blocks, " blocks of ", threads, " threads");
  {
    std::lock_guard<std::mutex> lock(launched_mutex());
    launched_set().insert(name);
  }
  Block state;
  state.barrier = std::make_unique<Barrier>(static_cast<int>(threads));
  for (long first = 0; first < threads; first += 32)
    state.warps.push_back(std::make_unique<Warp>(static_cast<int>(std::min(32L, threads - first))));
  Barrier block_done(static_cast<int>(threads));
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(threads));
  for (long t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      current_thread = static_cast<int>(t);
      threadIdx = Index{static_cast<unsigned>(t % block.x), static_cast<unsigned>(t / block.x % block.y),
                        static_cast<unsigned>(t / (block.x * block.y))};
      blockDim = Index{block.x, block.y, block.z};
      gridDim = Index{grid.x, grid.y, grid.z};
      current_block = &state;
      for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
          for (unsigned x = 0; x < grid.x; ++x) {
            blockIdx = Index{x, y, z};
            std::tuple<Params...> own = params;
            std::apply(kernel, std::move(own));
            block_done.arrive_and_wait();
          }
    });
  for (std::thread& t : pool) t.join();
}

template <auto Kernel>
const char* launch_signature() {
  return __PRETTY_FUNCTION__;
}

template <typename... Params, typename... Args>
std::tuple<std::decay_t<Params>...> kernel_arguments(void (*)(Params...), Args&&... args) {
  return std::tuple<std::decay_t<Params>...>(std::forward<Args>(args)...);
}

// A test's own kernel (a lambda) run as a grid.
template <typename Kernel, typename... Args>
void run(const std::string& name, Kernel kernel, dim3 grid, dim3 block, Args... args) {
  run_grid(name, kernel, grid, block, std::make_tuple(args...));
}

// cuda_common::launch<Kernel>(grid, block, stream, args...) in the emulation.
template <auto Kernel, typename... Args>
void launch(dim3 grid, dim3 block, Args&&... args) {
  run_grid(kernel_name_from(launch_signature<Kernel>()), Kernel, grid, block,
           kernel_arguments(Kernel, std::forward<Args>(args)...));
}

}  // namespace cuda_emulation

inline void __syncthreads() { cuda_emulation::current_block->barrier->arrive_and_wait(); }
template <typename T>
T __shfl_xor_sync(unsigned, T v, int mask) {
  return cuda_emulation::exchange(v, [&](int lane) { return lane ^ mask; });
}
template <typename T>
T __shfl_down_sync(unsigned, T v, unsigned delta) {
  return cuda_emulation::exchange(v, [&](int lane) { return lane + static_cast<int>(delta); });
}
template <typename T>
T __shfl_sync(unsigned, T v, int source) {
  return cuda_emulation::exchange(v, [&](int) { return source; });
}
template <typename T>
T __ldg(const T* p) {
  return *p;
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
