// The caching allocator: one caching layer over a backend (cudaMalloc, or aligned host memory),
// one instance per device. See docs/ARCHITECTURE.md, "Memory accounting", and Note [Caching allocator] in
// engine/memory/caching_allocator.cpp.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cumulus/core/device.h"
#include "cumulus/memory/category.h"

namespace cumulus {

struct CategoryStats {
  int64_t current = 0;  // bytes held now (requests rounded up to 512 B)
  int64_t peak = 0;     // most bytes held at once since the last reset_peak()
  int64_t allocs = 0;   // allocations since the start
  int64_t frees = 0;
};

struct MemoryStats {
  std::array<CategoryStats, kNumMemoryCategories> by_category{};
  int64_t allocated = 0;       // bytes in live blocks, all categories
  int64_t allocated_peak = 0;  // since the last reset_peak()
  // The split by category at the moment allocated_peak was reached.
  std::array<int64_t, kNumMemoryCategories> at_peak{};
  int64_t reserved = 0;  // bytes held from the backend (live + cached)
  int64_t reserved_peak = 0;
  int64_t backend_allocs = 0;  // calls that reached cudaMalloc / the host allocator
  int64_t backend_frees = 0;
  int64_t limit = 0;  // 0: no limit
  int64_t oom_count = 0;
  // Note [Graph pool]: bytes reserved by segments of the graph pool (part of `reserved`).
  int64_t graph_pool_reserved = 0;

  const CategoryStats& operator[](MemoryCategory c) const {
    return by_category[static_cast<std::size_t>(c)];
  }
  // Every category's live bytes (by_category[c].current).
  std::array<int64_t, kNumMemoryCategories> current_by_category() const {
    std::array<int64_t, kNumMemoryCategories> current{};
    for (std::size_t c = 0; c < kNumMemoryCategories; ++c) current[c] = by_category[c].current;
    return current;
  }
};

// The state of the allocator when it threw OutOfMemory: the failing request and what held the
// memory then. Live bytes by category and by op each add up to `allocated`.
struct OutOfMemoryRecord {
  int64_t sequence = 0;         // MemoryStats::oom_count counting this failure
  int64_t requested_bytes = 0;  // as asked
  int64_t rounded_bytes = 0;    // rounded up to 512 B
  int64_t segment_bytes = 0;    // what it tried to reserve from the backend for it
  MemoryCategory category = MemoryCategory::other;
  std::string op;  // the op that asked ("linear", "conv2d backward", "(no op)")
  int64_t limit = 0;  // 0: none (the backend itself failed)
  int64_t reserved = 0;  // after returning the cache to the backend
  int64_t allocated = 0;
  int64_t peak_bytes = 0;  // allocated peak since the last reset_peak()
  int64_t reserved_peak = 0;
  std::array<int64_t, kNumMemoryCategories> live_by_category{};
  std::vector<std::pair<std::string, int64_t>> live_by_op;  // largest first
};

// Raw memory from a device, no caching. Returns nullptr when the device is out of memory.
class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  virtual void* raw_alloc(std::size_t bytes) = 0;
  virtual void raw_free(void* ptr) noexcept = 0;
};

class CachingAllocator;

// One live block (CachingAllocator::live_blocks): what a replay of the state needs (Note [Memory
// prediction] in engine/plan/prediction.cpp).
struct LiveBlock {
  int64_t bytes = 0;  // the request rounded up to 512 B, as the stats count it
  MemoryCategory category = MemoryCategory::other;
  bool small = false;   // in the small pool
  int64_t segment = 0;  // index of its segment, in the order the segments were reserved
  int64_t offset = 0;   // from the start of its segment
  int64_t segment_bytes = 0;
};

// Told of every allocation and free, with the stats after it, while the allocator's lock is held:
// it must be quick and must not allocate from the same allocator. Used for memory timelines.
class AllocationObserver {
 public:
  virtual ~AllocationObserver() = default;
  virtual void on_change(const MemoryStats& stats) = 0;
};

// A move-only owner of one allocated block; returns it to its allocator when destroyed.
class Allocation {
 public:
  Allocation() = default;
  ~Allocation() { reset(); }
  Allocation(Allocation&& o) noexcept { *this = std::move(o); }
  Allocation& operator=(Allocation&& o) noexcept;
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;

  void* get() const { return ptr_; }
  std::size_t size() const { return size_; }  // the request rounded up to 512 B
  MemoryCategory category() const { return category_; }
  void reset() noexcept;
  // Moves the live block to category `c`: the stats count it as freed in the old category and
  // allocated in the new one (the observer is told once). For the engine: an op output allocated
  // before anything said what it is (Note [Custom op outputs are activations] in
  // engine/autograd/engine.cpp).
  void recategorize(MemoryCategory c);

 private:
  friend class CachingAllocator;
  void* ptr_ = nullptr;
  std::size_t size_ = 0;
  MemoryCategory category_ = MemoryCategory::other;
  void* block_ = nullptr;  // the allocator's bookkeeping record
  CachingAllocator* owner_ = nullptr;
};

class CachingAllocator {
 public:
  static constexpr std::size_t kRounding = 512;             // every block is a multiple of this
  static constexpr std::size_t kSmallRequest = 1 << 20;      // up to 1 MiB: the small pool
  static constexpr std::size_t kSmallSegment = 2 << 20;      // small requests share 2 MiB segments
  static constexpr std::size_t kLargeSegmentRounding = 2 << 20;

  CachingAllocator(Device device, std::unique_ptr<MemoryBackend> backend);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Zero bytes gives an empty Allocation. Throws OutOfMemory (see the class note).
  Allocation allocate(std::size_t bytes, MemoryCategory category);

  MemoryStats stats() const;
  // Every live block, segment by segment, in address order within a segment.
  std::vector<LiveBlock> live_blocks() const;
  // The last out-of-memory this allocator threw, if any (kept until the next one).
  std::optional<OutOfMemoryRecord> last_out_of_memory() const;
  void reset_peak();         // peaks (total, per category, reserved) restart from current values
  void empty_cache();        // returns every wholly free segment to the backend
  void set_memory_limit(int64_t bytes);  // reserved bytes may not exceed this; 0 removes the limit
  int64_t memory_limit() const;
  const Device& device() const { return device_; }
  // At most one observer; nullptr removes it. The caller keeps it alive while installed.
  void set_observer(AllocationObserver* observer);

  // Note [Graph pool] in engine/memory/caching_allocator.cpp. While routed, every allocation comes
  // from the graph pool (a graph capture is recording). Each live graph holds one use of the pool;
  // when the last is released, the pool's segments join the general cache.
  void begin_graph_pool_routing();
  void end_graph_pool_routing();
  void acquire_graph_pool();
  void release_graph_pool() noexcept;

 private:
  friend class Allocation;
  struct Block;
  struct Pools;
  void release(void* block) noexcept;
  void recategorize(void* block, MemoryCategory category);
  Block* allocate_segment_locked(std::size_t segment_bytes, bool small);
  void release_cached_segments_locked();
  [[noreturn]] void throw_oom_locked(std::size_t bytes, std::size_t segment_bytes, MemoryCategory category);

  Device device_;
  std::unique_ptr<MemoryBackend> backend_;
  std::unique_ptr<Pools> pools_;
};

// The allocator of a device (created on first use). Throws DeviceError if unavailable.
CachingAllocator& allocator_for(const Device& device);

// An allocator's memory limit for a scope (0: none), the one before it restored at its end: a
// budget a run trains within, lifted around what is not the plan's memory (a checkpoint's writing).
class MemoryLimitScope {
 public:
  MemoryLimitScope(CachingAllocator& alloc, int64_t limit) : alloc_(alloc), before_(alloc.memory_limit()) {
    alloc_.set_memory_limit(limit);
  }
  ~MemoryLimitScope() { alloc_.set_memory_limit(before_); }
  MemoryLimitScope(const MemoryLimitScope&) = delete;
  MemoryLimitScope& operator=(const MemoryLimitScope&) = delete;

 private:
  CachingAllocator& alloc_;
  int64_t before_;
};

// The host-state pool: host memory of its own (page-locked where a GPU is present, so copies to
// and from it run asynchronously), for optimizer state placed on the host
// (optim::Optimizer::place_state). Its stats and limit are its own: no device's budget counts it,
// allocator_for(Device::cpu())'s included.
CachingAllocator& host_state_allocator();

}  // namespace cumulus
