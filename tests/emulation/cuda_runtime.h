// A CPU emulation of the subset of CUDA that our kernels (kernels/cuda/*.cu) use, so that every
// kernel of ours, the very source nvcc compiles, runs in the CPU test suite (tests/emulated/). It
// stands in for <cuda_runtime.h> only in the emulated translation units (tests/CMakeLists.txt puts
// this folder first on their include path); everything else uses the real CUDA headers.
//
// Why written here: no packaged library runs CUDA C++ kernels on a CPU, and a GPU is lent to this
// project only some of the time; this lets CI execute the kernels' index arithmetic, tiling,
// reductions, barriers, beta and mask rules on every commit, under a schedule that looks for
// trouble rather than one that happens to work.
//
// The model: every CUDA thread is a fiber (ucontext) with its own stack, all on the launching OS
// thread. A fiber runs until it reaches a barrier (__syncthreads, or a warp shuffle, a barrier of
// the warp's lanes: every lane must take part, as with a full mask); then a seeded random
// generator picks which runnable fiber goes next, so the threads of a block run between barriers
// in a different order on every seed. The blocks of a grid run in a random permutation, and
// about one wave in four runs two blocks at once, their fibers interleaved. threadIdx, blockIdx,
// blockDim and gridDim are set for whichever fiber runs. A barrier that some threads never reach
// fails the launch (on a GPU it is undefined). The seed is CUMULUS_EMULATION_SEED (a fixed
// default otherwise); tests/emulated/main.cpp reseeds per test and prints the seed of a failure.
// __shared__ variables are a block's own: tests/CMakeLists.txt rewrites each declaration into
// cuda_emulation::shared, which places it in the block's 48 KiB (the static limit) filled with
// 0xFF bytes (NaN as floats) at the block's start, aligned no more than its type or __align__
// asks; dynamic shared memory (cuda_common::launch_with_shared) is the block's too, as many bytes
// as the launch asks, NaN-filled alike, static and dynamic together at most an A100's 163 KiB.
// Device memory is an arena (device_allocate; tests use DeviceVector from
// tests/emulated/emulated.h): every pointer argument of a launch must be null or inside it, else
// the launch throws naming the kernel and the argument. blockDim over a kernel's
// __launch_bounds__ throws (tests/CMakeLists.txt registers each bound); float4/float2 are aligned
// as on the device and a copy to or from a misaligned one throws. Kernels are launched only
// through cuda_common::launch (Note [Kernel launches] in kernels/cuda/common.cuh), which calls
// cuda_emulation::launch: synchronous, and each launch records the kernel's name
// (launched_kernels) so a test can show every kernel ran; between begin_capture and end_capture
// launches are recorded with their arguments instead, and Recording::replay runs them again.
// Kernel files are compiled with floating-point contraction (FMA) except those listed in
// CUMULUS_CUDA_BITWISE_FILES, as nvcc compiles them.
//
// What it cannot show (only a GPU can): timing and occupancy; registers and spills; the memory
// model between threads or blocks that truly run at once (here one fiber runs at a time, so every
// write is seen by the next fiber: a missing __threadfence or a torn read goes unseen, though
// interleaved blocks do expose an order between blocks that was assumed); warp-synchronous code
// is not in lockstep here (that shows code relying on it, but not the reverse); pointers inside
// structures passed by value are not checked against the arena, nor a float4 member read through
// a misaligned pointer without a copy (UBSan's alignment check sees that); __ldg's read-only
// cache (a plain load here); the last bits of the device's math functions (expf, logf, rsqrtf are
// the host's here, and the host's FMA contraction is not necessarily nvcc's); whether a device
// allows a kernel the dynamic shared memory it asks for (cudaFuncSetAttribute).
#pragma once

#include <ucontext.h>

#include <sys/mman.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cumulus/core/error.h"

#if defined(__SANITIZE_ADDRESS__)
#define CUMULUS_EMULATION_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUMULUS_EMULATION_ASAN 1
#endif
#endif
#ifdef CUMULUS_EMULATION_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

// Tells kernels/cuda/common.cuh to launch through cuda_emulation::launch.
#define CUMULUS_CUDA_EMULATION 1

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// The bound is registered per kernel by tests/CMakeLists.txt (cuda_emulation::LaunchBound).
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// A kernel parameter read in place (no copy): every emulated parameter is an ordinary one.
#define __grid_constant__
// __shared__ is deliberately left undefined: tests/CMakeLists.txt rewrites each declaration into
// cuda_emulation::shared, so one it missed fails the build instead of becoming a static.

struct CUstream_st;
using cudaStream_t = CUstream_st*;
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}  // NOLINT: implicit as CUDA's
};

namespace cuda_emulation {
struct Index {
  unsigned x = 0, y = 0, z = 0;
};

// A vector type copied from or to an address its device alignment does not allow is a
// misaligned access on a GPU (the load faults); here the copy throws.
inline void check_vector_alignment(const void* p, std::size_t alignment, const char* type) {
  CUMULUS_CHECK(reinterpret_cast<uintptr_t>(p) % alignment == 0, cumulus::InvalidArgument, "misaligned ", type,
                " access at ", p, ": a ", type, " must be ", alignment, "-byte aligned");
}
}  // namespace cuda_emulation

// As on the device: 16- and 8-byte aligned, and checked where copied (see check_vector_alignment).
struct alignas(16) float4 {
  float x, y, z, w;
  float4() = default;
  constexpr float4(float x_, float y_, float z_, float w_) : x(x_), y(y_), z(z_), w(w_) {}
  float4(const float4& o) : x(o.x), y(o.y), z(o.z), w(o.w) { cuda_emulation::check_vector_alignment(&o, 16, "float4"); }
  float4& operator=(const float4& o) {
    cuda_emulation::check_vector_alignment(this, 16, "float4");
    cuda_emulation::check_vector_alignment(&o, 16, "float4");
    x = o.x, y = o.y, z = o.z, w = o.w;
    return *this;
  }
};
struct alignas(8) float2 {
  float x, y;
  float2() = default;
  constexpr float2(float x_, float y_) : x(x_), y(y_) {}
  float2(const float2& o) : x(o.x), y(o.y) { cuda_emulation::check_vector_alignment(&o, 8, "float2"); }
  float2& operator=(const float2& o) {
    cuda_emulation::check_vector_alignment(this, 8, "float2");
    cuda_emulation::check_vector_alignment(&o, 8, "float2");
    x = o.x, y = o.y;
    return *this;
  }
};
inline float4 make_float4(float x, float y, float z, float w) { return float4(x, y, z, w); }
inline float2 make_float2(float x, float y) { return float2(x, y); }

inline thread_local cuda_emulation::Index threadIdx, blockIdx, blockDim, gridDim;

namespace cuda_emulation {

// ---- the seed -------------------------------------------------------------------------------

// splitmix64: small, fast, and the same sequence on every platform (std's distributions are not).
class Random {
 public:
  explicit Random(uint64_t seed = 0) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::size_t below(std::size_t n) { return static_cast<std::size_t>(next() % n); }

 private:
  uint64_t state_;
};

constexpr uint64_t kDefaultSeed = 20261124;

// CUMULUS_EMULATION_SEED, or kDefaultSeed (CI's fixed schedule).
inline uint64_t seed() {
  static const uint64_t value = [] {
    const char* text = std::getenv("CUMULUS_EMULATION_SEED");
    return text != nullptr && *text != '\0' ? std::strtoull(text, nullptr, 0) : kDefaultSeed;
  }();
  return value;
}

inline Random& schedule_random() {
  static thread_local Random random(seed());
  return random;
}

// Restarts the schedule from (seed, stream): a test that reseeds with its own name at its start
// gets the same schedule whether it runs alone or after others.
inline void reseed(const std::string& stream) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : stream) h = (h ^ c) * 1099511628211ull;
  schedule_random() = Random(seed() ^ h);
}

// ---- device memory --------------------------------------------------------------------------

// The allocations device_allocate made and not yet freed, by start address.
struct DeviceArena {
  std::mutex mutex;
  std::map<uintptr_t, std::size_t> blocks;
};
inline DeviceArena& device_arena() {
  static DeviceArena arena;
  return arena;
}

constexpr std::size_t kDeviceAlignment = 256;  // cudaMalloc's

// Emulated cudaMalloc: `bytes` of "device" memory, 256-byte aligned and filled with 0xFF (NaN as
// floats), as uninitialized device memory is no promise of zeros. Heap memory, so AddressSanitizer
// still sees accesses past its end.
inline void* device_allocate(std::size_t bytes) {
  void* p = ::operator new(std::max<std::size_t>(bytes, 1), std::align_val_t(kDeviceAlignment));
  std::memset(p, 0xFF, bytes);
  DeviceArena& arena = device_arena();
  std::lock_guard<std::mutex> lock(arena.mutex);
  arena.blocks[reinterpret_cast<uintptr_t>(p)] = bytes;
  return p;
}

inline void device_free(void* p) {
  if (p == nullptr) return;
  DeviceArena& arena = device_arena();
  {
    std::lock_guard<std::mutex> lock(arena.mutex);
    const std::size_t erased = arena.blocks.erase(reinterpret_cast<uintptr_t>(p));
    CUMULUS_CHECK(erased == 1, cumulus::InvalidArgument, "device_free of ", p,
                  ", which device_allocate did not return");
  }
  ::operator delete(p, std::align_val_t(kDeviceAlignment));
}

// Memory a test maps itself (pages it watches for loads) accepted as device memory until
// forget_device_memory.
inline void adopt_device_memory(void* p, std::size_t bytes) {
  DeviceArena& arena = device_arena();
  std::lock_guard<std::mutex> lock(arena.mutex);
  arena.blocks[reinterpret_cast<uintptr_t>(p)] = bytes;
}
inline void forget_device_memory(void* p) {
  DeviceArena& arena = device_arena();
  std::lock_guard<std::mutex> lock(arena.mutex);
  arena.blocks.erase(reinterpret_cast<uintptr_t>(p));
}

// Whether p points into (or one past the end of) an allocation of device_allocate.
inline bool in_device_memory(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  DeviceArena& arena = device_arena();
  std::lock_guard<std::mutex> lock(arena.mutex);
  auto after = arena.blocks.upper_bound(address);
  if (after == arena.blocks.begin()) return false;
  const auto& [start, bytes] = *std::prev(after);
  return address <= start + bytes;
}

// ---- the block's state ----------------------------------------------------------------------

struct Fiber;
class Scheduler;
inline thread_local Scheduler* current_scheduler = nullptr;

// A barrier among `count` fibers: each arrival yields to the scheduler; the last one to arrive
// makes every waiter runnable again.
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  inline void arrive_and_wait();
  bool idle() const { return waiting_.empty(); }

 private:
  const int count_;
  std::vector<Fiber*> waiting_;
};

// A warp's lanes (32, or fewer for the last warp of a block whose size is not a multiple of 32)
// and the slots a shuffle exchanges values through (any type of at most 8 bytes).
struct Warp {
  explicit Warp(int lane_count) : lanes(lane_count), barrier(lane_count) {}
  const int lanes;
  Barrier barrier;
  uint64_t slots[32] = {};
};

constexpr std::size_t kSharedBytes = 48 * 1024;  // static shared memory per block
// Static and dynamic shared memory together, per block: an A100's opt-in limit (sm_80, the
// smallest of the architectures the engine is compiled for; an H100's is 227 KiB).
constexpr std::size_t kMaxSharedBytesPerBlock = 163 * 1024;

struct Block {
  Block(Index index_, int threads, std::size_t dynamic_bytes_)
      : index(index_), barrier(threads), dynamic_bytes(dynamic_bytes_) {
    for (int first = 0; first < threads; first += 32)
      warps.push_back(std::make_unique<Warp>(std::min(32, threads - first)));
    if (dynamic_bytes > 0) {  // new[]'s 16-byte alignment is what the device guarantees
      dynamic_memory = std::make_unique<unsigned char[]>(dynamic_bytes);
      std::memset(dynamic_memory.get(), 0xFF, dynamic_bytes);
    }
  }
  Index index;
  Barrier barrier;
  std::vector<std::unique_ptr<Warp>> warps;
  // __shared__ variables, found by the address of their declaration's site tag.
  std::vector<std::pair<const void*, void*>> shared_slots;
  std::size_t shared_used = 0;
  alignas(64) unsigned char shared_memory[kSharedBytes];
  // The launch's dynamic shared memory (cuda_common::dynamic_shared), filled with 0xFF bytes.
  std::size_t dynamic_bytes = 0;
  std::unique_ptr<unsigned char[]> dynamic_memory;
};

inline thread_local Block* current_block = nullptr;
inline thread_local int current_thread = 0;  // the thread's linear index in its block

// Room for `bytes` aligned to `alignment` but, where that is under 16, deliberately not to 16, so
// a vector cast that only works by luck of placement fails here. Filled with 0xFF bytes.
inline void* allocate_shared(Block& block, std::size_t bytes, std::size_t alignment) {
  std::size_t offset = (block.shared_used + alignment - 1) / alignment * alignment;
  if (alignment < 16 && offset % 16 == 0) offset += alignment;
  CUMULUS_CHECK(offset + bytes <= kSharedBytes, cumulus::InvalidArgument, "the block's __shared__ variables need over ",
                kSharedBytes, " bytes");
  CUMULUS_CHECK(offset + bytes + block.dynamic_bytes <= kMaxSharedBytesPerBlock, cumulus::InvalidArgument,
                "the block's __shared__ variables and its ", block.dynamic_bytes,
                " bytes of dynamic shared memory need over ", kMaxSharedBytesPerBlock, " bytes");
  block.shared_used = offset + bytes;
  std::memset(block.shared_memory + offset, 0xFF, bytes);
  return block.shared_memory + offset;
}

// `__shared__ T name;` as tests/CMakeLists.txt rewrites it: `static char site; auto& name =
// shared<T>(&site);`. Every thread of a block gets the block's one instance.
template <typename T, std::size_t Align = 0>
T& shared(const void* site) {
  static_assert(std::is_trivially_destructible<T>::value, "a __shared__ variable of trivial type");
  Block& block = *current_block;
  for (const auto& [tag, address] : block.shared_slots)
    if (tag == site) return *static_cast<T*>(address);
  void* address = allocate_shared(block, sizeof(T), std::max(Align, alignof(T)));
  block.shared_slots.emplace_back(site, address);
  return *static_cast<T*>(address);
}

// The block's dynamic shared memory (cuda_common::dynamic_shared in a kernel).
inline void* dynamic_shared_memory() {
  Block& block = *current_block;
  CUMULUS_CHECK(block.dynamic_bytes > 0, cumulus::InvalidArgument,
                "a kernel read dynamic shared memory that its launch did not give it");
  return block.dynamic_memory.get();
}

// ---- fibers and their scheduler ---------------------------------------------------------------

constexpr std::size_t kStackBytes = 256 * 1024;  // reserved; only the pages a kernel touches are used
constexpr std::size_t kGuardBytes = 4096;        // below the stack, so an overflow faults

struct Fiber {
  ucontext_t context;
  char* stack = nullptr;
  Block* block = nullptr;
  Index thread_index;
  int thread = 0;
  bool finished = false;
  void* fake_stack = nullptr;  // AddressSanitizer's, while switched out
};

// Stacks are mapped once per OS thread and reused by every launch (two blocks of 1024 at most).
inline char* fiber_stack(std::size_t i) {
  static thread_local std::vector<char*> stacks;
  while (stacks.size() <= i) {
    void* p = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    CUMULUS_CHECK(p != MAP_FAILED, cumulus::OutOfMemory, "emulation: no memory for a fiber's stack");
    mprotect(p, kGuardBytes, PROT_NONE);
    stacks.push_back(static_cast<char*>(p) + kGuardBytes);
  }
  return stacks[i];
}

// Runs one wave (one block, or two interleaved) of a launch: `run_thread(body)` once per fiber.
class Scheduler {
 public:
  Scheduler(void (*run_thread)(const void*), const void* body) : run_thread_(run_thread), body_(body) {}

  void run(std::vector<std::unique_ptr<Block>>& blocks, dim3 block_dim);
  void make_runnable(Fiber* f) { runnable_.push_back(f); }
  // On a fiber: back to the scheduler, until it resumes this fiber again.
  void yield(bool exiting);
  Fiber* running() const { return running_; }

 private:
  static void entry();
  void resume(Fiber& f);
  void fail_unless_all_finished(const std::vector<std::unique_ptr<Block>>& blocks);

  void (*run_thread_)(const void*);
  const void* body_;
  std::vector<Fiber> fibers_;
  std::vector<Fiber*> runnable_;
  Fiber* running_ = nullptr;
  ucontext_t scheduler_context_;
  ucontext_t blank_;
  const void* scheduler_stack_ = nullptr;
  std::size_t scheduler_stack_bytes_ = 0;
  std::exception_ptr error_;
  std::string error_where_;
};

inline std::string describe(const char* what, Index i) {
  return std::string(what) + " (" + std::to_string(i.x) + ", " + std::to_string(i.y) + ", " + std::to_string(i.z) + ")";
}

inline void Scheduler::entry() {
  Scheduler& s = *current_scheduler;
#ifdef CUMULUS_EMULATION_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &s.scheduler_stack_, &s.scheduler_stack_bytes_);
#endif
  try {
    s.run_thread_(s.body_);
  } catch (...) {
    s.error_ = std::current_exception();
    s.error_where_ = describe("block", blockIdx) + ", " + describe("thread", threadIdx);
  }
  s.running_->finished = true;
  s.yield(true);
}

inline void Scheduler::resume(Fiber& f) {
  running_ = &f;
  threadIdx = f.thread_index;
  blockIdx = f.block->index;
  current_block = f.block;
  current_thread = f.thread;
#ifdef CUMULUS_EMULATION_ASAN
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&fake_stack, f.stack, kStackBytes);
#endif
  swapcontext(&scheduler_context_, &f.context);
#ifdef CUMULUS_EMULATION_ASAN
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
}

inline void Scheduler::yield(bool exiting) {
  Fiber& f = *running_;
#ifdef CUMULUS_EMULATION_ASAN
  __sanitizer_start_switch_fiber(exiting ? nullptr : &f.fake_stack, scheduler_stack_, scheduler_stack_bytes_);
#else
  (void)exiting;
#endif
  swapcontext(&f.context, &scheduler_context_);
#ifdef CUMULUS_EMULATION_ASAN
  __sanitizer_finish_switch_fiber(f.fake_stack, &scheduler_stack_, &scheduler_stack_bytes_);
#endif
}

inline void Scheduler::run(std::vector<std::unique_ptr<Block>>& blocks, dim3 block_dim) {
  const int threads = static_cast<int>(block_dim.x * block_dim.y * block_dim.z);
  fibers_.assign(blocks.size() * static_cast<std::size_t>(threads), Fiber{});
  getcontext(&blank_);
  for (std::size_t i = 0; i < fibers_.size(); ++i) {
    Fiber& f = fibers_[i];
    const int t = static_cast<int>(i % static_cast<std::size_t>(threads));
    f.block = blocks[i / static_cast<std::size_t>(threads)].get();
    f.thread = t;
    f.thread_index = Index{t % block_dim.x, t / block_dim.x % block_dim.y, t / (block_dim.x * block_dim.y)};
    f.stack = fiber_stack(i);
    f.context = blank_;  // its floating-point state pointer stays on blank_, which outlives the fibers
    f.context.uc_stack.ss_sp = f.stack;
    f.context.uc_stack.ss_size = kStackBytes;
    f.context.uc_link = nullptr;
    makecontext(&f.context, &Scheduler::entry, 0);
    runnable_.push_back(&f);
  }
  Scheduler* outer = current_scheduler;
  current_scheduler = this;
  while (!runnable_.empty() && !error_) {
    const std::size_t pick = schedule_random().below(runnable_.size());
    Fiber* f = runnable_[pick];
    runnable_[pick] = runnable_.back();
    runnable_.pop_back();
    resume(*f);
  }
  current_scheduler = outer;
  current_block = nullptr;
  fail_unless_all_finished(blocks);
}

inline void Scheduler::fail_unless_all_finished(const std::vector<std::unique_ptr<Block>>& blocks) {
  int unfinished = 0;
  for (Fiber& f : fibers_) {
    if (f.finished) continue;
    ++unfinished;
#ifdef CUMULUS_EMULATION_ASAN
    ASAN_UNPOISON_MEMORY_REGION(f.stack, kStackBytes);  // its frames were abandoned, not returned from
#endif
  }
  if (error_) {
    try {
      std::rethrow_exception(error_);
    } catch (const std::exception& e) {
      CUMULUS_CHECK(false, cumulus::InvalidArgument, error_where_, ": ", e.what());
    }
  }
  if (unfinished == 0) return;
  std::string where;
  for (const auto& b : blocks) where += " " + describe("block", b->index);
  CUMULUS_CHECK(false, cumulus::InvalidArgument, unfinished, " threads of", where,
                " wait at a barrier (__syncthreads or a shuffle) that the block's other threads never reach");
}

inline void Barrier::arrive_and_wait() {
  Scheduler& s = *current_scheduler;
  waiting_.push_back(s.running());
  if (static_cast<int>(waiting_.size()) == count_) {
    for (Fiber* f : waiting_) s.make_runnable(f);
    waiting_.clear();
  }
  s.yield(false);
}

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

// ---- launches -------------------------------------------------------------------------------

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

// Each kernel's __launch_bounds__ maximum, by name; tests/CMakeLists.txt generates one LaunchBound
// per bounded kernel beside the kernel file's emulated translation unit.
inline std::map<std::string, long>& launch_bounds() {
  static std::map<std::string, long> bounds;
  return bounds;
}
struct LaunchBound {
  LaunchBound(const char* kernel, long max_threads) { launch_bounds()[kernel] = max_threads; }
};

inline void check_configuration(const std::string& name, dim3 grid, dim3 block, std::size_t dynamic_bytes) {
  const long threads = static_cast<long>(block.x) * block.y * block.z;
  const long blocks = static_cast<long>(grid.x) * grid.y * grid.z;
  CUMULUS_CHECK(threads >= 1 && threads <= 1024 && blocks >= 1, cumulus::InvalidArgument, "emulated launch of ", name,
                ": ", blocks, " blocks of ", threads, " threads");
  CUMULUS_CHECK(dynamic_bytes <= kMaxSharedBytesPerBlock, cumulus::InvalidArgument, "emulated launch of ", name, ": ",
                dynamic_bytes, " bytes of dynamic shared memory, over the ", kMaxSharedBytesPerBlock,
                " a block may have");
  const auto bound = launch_bounds().find(name);
  CUMULUS_CHECK(bound == launch_bounds().end() || threads <= bound->second, cumulus::InvalidArgument,
                "emulated launch of ", name, ": ", threads, " threads per block, over its __launch_bounds__(",
                bound == launch_bounds().end() ? 0 : bound->second, ")");
}

// Runs every block of the grid in waves: the blocks in a random permutation, about one wave in
// four two blocks interleaved.
inline void run_waves(const std::string& name, dim3 grid, dim3 block, std::size_t dynamic_bytes,
                      void (*run_thread)(const void*), const void* body) {
  {
    std::lock_guard<std::mutex> lock(launched_mutex());
    launched_set().insert(name);
  }
  const std::size_t count = static_cast<std::size_t>(grid.x) * grid.y * grid.z;
  std::vector<std::size_t> order(count);
  for (std::size_t i = 0; i < count; ++i) order[i] = i;
  Random& random = schedule_random();
  for (std::size_t i = count; i > 1; --i) std::swap(order[i - 1], order[random.below(i)]);
  const int threads = static_cast<int>(block.x * block.y * block.z);
  const Index saved_block_dim = blockDim, saved_grid_dim = gridDim;
  blockDim = Index{block.x, block.y, block.z};
  gridDim = Index{grid.x, grid.y, grid.z};
  try {
    for (std::size_t next = 0; next < count;) {
      const std::size_t take = next + 1 < count && random.below(4) == 0 ? 2 : 1;
      std::vector<std::unique_ptr<Block>> wave;
      for (std::size_t k = next; k < next + take; ++k) {
        const std::size_t b = order[k];
        wave.push_back(
            std::make_unique<Block>(Index{static_cast<unsigned>(b % grid.x), static_cast<unsigned>(b / grid.x % grid.y),
                                          static_cast<unsigned>(b / (static_cast<std::size_t>(grid.x) * grid.y))},
                                    threads, dynamic_bytes));
      }
      Scheduler(run_thread, body).run(wave, block);
      next += take;
    }
  } catch (const std::exception& e) {
    blockDim = saved_block_dim, gridDim = saved_grid_dim;
    CUMULUS_CHECK(false, cumulus::InvalidArgument, "emulated launch of ", name, " (CUMULUS_EMULATION_SEED=", seed(),
                  "): ", e.what());
  }
  blockDim = saved_block_dim, gridDim = saved_grid_dim;
}

// The kernel and the arguments one launch runs with; each thread calls the kernel with its own
// copy, as every CUDA thread gets its own parameters.
template <typename Kernel, typename... Params>
struct LaunchBody {
  Kernel kernel;
  std::tuple<Params...> params;
  static void run_thread(const void* self) {
    const auto& body = *static_cast<const LaunchBody*>(self);
    std::tuple<Params...> own = body.params;
    std::apply(body.kernel, std::move(own));
  }
};

// ---- capture --------------------------------------------------------------------------------

// Launches recorded between begin_capture and end_capture, with the arguments they were given
// (converted and copied as a launch does); replay runs them again in order, as a CUDA graph's
// replay does: no host code runs between them, so what should change from one replay to the next
// must live in device memory.
class Recording;
inline void record(std::function<void()> launch);
inline Recording end_capture();

class Recording {
 public:
  void replay() {
    for (const auto& launch : launches_) launch();
  }
  std::size_t launches() const { return launches_.size(); }

 private:
  friend void record(std::function<void()> launch);
  friend Recording end_capture();
  std::vector<std::function<void()>> launches_;
};

inline std::unique_ptr<Recording>& capture_target() {
  static thread_local std::unique_ptr<Recording> target;
  return target;
}
inline void begin_capture() {
  CUMULUS_CHECK(capture_target() == nullptr, cumulus::InvalidArgument, "begin_capture while capturing");
  capture_target() = std::make_unique<Recording>();
}
inline Recording end_capture() {
  CUMULUS_CHECK(capture_target() != nullptr, cumulus::InvalidArgument, "end_capture without begin_capture");
  Recording recording = std::move(*capture_target());
  capture_target().reset();
  return recording;
}
inline void record(std::function<void()> launch) { capture_target()->launches_.push_back(std::move(launch)); }

// Runs `kernel(args...)` as a grid of `grid` blocks of `block` threads (see the model above), or
// records it while capturing. Also for tests that run a lambda as a kernel.
template <typename Kernel, typename... Params>
void run_grid(const std::string& name, Kernel kernel, dim3 grid, dim3 block, std::size_t dynamic_bytes,
              std::tuple<Params...> params) {
  check_configuration(name, grid, block, dynamic_bytes);
  auto body = std::make_shared<const LaunchBody<Kernel, Params...>>(LaunchBody<Kernel, Params...>{kernel, params});
  auto run = [name, grid, block, dynamic_bytes, body] {
    run_waves(name, grid, block, dynamic_bytes, &LaunchBody<Kernel, Params...>::run_thread, body.get());
  };
  if (capture_target() != nullptr) record(run);
  else run();
}

template <auto Kernel>
const char* launch_signature() {
  return __PRETTY_FUNCTION__;
}

template <typename... Params, typename... Args>
std::tuple<std::decay_t<Params>...> kernel_arguments(void (*)(Params...), Args&&... args) {
  return std::tuple<std::decay_t<Params>...>(std::forward<Args>(args)...);
}

// A pointer a kernel receives must be device memory (or null): a host pointer faults on a GPU.
template <typename Param>
void check_pointer_argument(const std::string& kernel, std::size_t position, const Param& value) {
  if constexpr (std::is_pointer<Param>::value) {
    CUMULUS_CHECK(value == nullptr || in_device_memory(value), cumulus::InvalidArgument, "emulated launch of ", kernel,
                  ": argument ", position, " (", static_cast<const void*>(value),
                  ") is not device memory (cuda_emulation::device_allocate)");
  }
}
template <typename... Params, std::size_t... I>
void check_pointer_arguments(const std::string& kernel, const std::tuple<Params...>& params,
                             std::index_sequence<I...>) {
  (check_pointer_argument(kernel, I + 1, std::get<I>(params)), ...);
}

// A test's own kernel (a lambda) run as a grid.
template <typename Kernel, typename... Args>
void run(const std::string& name, Kernel kernel, dim3 grid, dim3 block, Args... args) {
  run_grid(name, kernel, grid, block, 0, std::make_tuple(args...));
}

// cuda_common::launch<Kernel>(grid, block, stream, args...) and launch_with_shared in the
// emulation: pointer arguments (counted from 1) checked against the device arena.
template <auto Kernel, typename... Args>
void launch_with_shared(dim3 grid, dim3 block, std::size_t dynamic_bytes, Args&&... args) {
  const std::string name = kernel_name_from(launch_signature<Kernel>());
  auto params = kernel_arguments(Kernel, std::forward<Args>(args)...);
  check_pointer_arguments(name, params, std::make_index_sequence<std::tuple_size<decltype(params)>::value>());
  run_grid(name, Kernel, grid, block, dynamic_bytes, std::move(params));
}
template <auto Kernel, typename... Args>
void launch(dim3 grid, dim3 block, Args&&... args) {
  launch_with_shared<Kernel>(grid, block, 0, std::forward<Args>(args)...);
}

}  // namespace cuda_emulation

inline void __syncthreads() { cuda_emulation::current_block->barrier.arrive_and_wait(); }
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
// A product rounded on its own, as nvcc never contracts __fmul_rn into an FMA: the empty asm keeps
// the emulation's -ffp-contract=fast from fusing it with what follows.
inline float __fmul_rn(float a, float b) {
  float p = a * b;
  asm("" : "+x"(p));
  return p;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
