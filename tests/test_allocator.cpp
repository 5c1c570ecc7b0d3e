// The caching allocator: rounding, caching (no backend calls in a steady loop), splitting and
// coalescing, per-category statistics, the memory limit and OutOfMemory, release-and-retry.
//
// Two kinds of cases:
//  - a standalone CachingAllocator over CountingBackend (malloc underneath, counts every call, can
//    be told to fail), where backend calls are counted exactly;
//  - the process-global allocator of each device (allocator_for), parameterized over devices.
//    Those allocators are shared by the whole process, so every check is a delta of stats taken
//    before and after, and a memory limit is always removed again (LimitGuard).
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cumulus/core/error.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/memory/category.h"
#include "cumulus/tensor/tensor.h"
#include "test_util.h"

namespace cumulus {
namespace {

using testing::DeviceTest;

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * 1024;

// ---- a fake backend --------------------------------------------------------------------------

struct BackendState {
  int64_t alloc_calls = 0;     // every raw_alloc call, including the failed ones
  int64_t failed_allocs = 0;
  int64_t free_calls = 0;
  int64_t live_bytes = 0;      // bytes handed out and not yet freed
  int64_t capacity = 0;        // 0: unlimited; otherwise raw_alloc fails past this many live bytes
  bool fail_all = false;       // every raw_alloc returns nullptr
  std::map<void*, std::size_t> live;
};

class CountingBackend final : public MemoryBackend {
 public:
  explicit CountingBackend(std::shared_ptr<BackendState> state) : state_(std::move(state)) {}
  void* raw_alloc(std::size_t bytes) override {
    state_->alloc_calls += 1;
    if (state_->fail_all ||
        (state_->capacity > 0 && state_->live_bytes + static_cast<int64_t>(bytes) > state_->capacity)) {
      state_->failed_allocs += 1;
      return nullptr;
    }
    void* p = std::malloc(bytes);
    if (p == nullptr) {
      state_->failed_allocs += 1;
      return nullptr;
    }
    state_->live[p] = bytes;
    state_->live_bytes += static_cast<int64_t>(bytes);
    return p;
  }
  void raw_free(void* ptr) noexcept override {
    state_->free_calls += 1;
    auto it = state_->live.find(ptr);
    if (it == state_->live.end()) {
      ADD_FAILURE() << "raw_free of a pointer the backend never handed out (or freed twice)";
      return;
    }
    state_->live_bytes -= static_cast<int64_t>(it->second);
    state_->live.erase(it);
    std::free(ptr);
  }

 private:
  std::shared_ptr<BackendState> state_;
};

struct Fake {
  std::shared_ptr<BackendState> state = std::make_shared<BackendState>();
  std::unique_ptr<CachingAllocator> alloc =
      std::make_unique<CachingAllocator>(Device::cpu(), std::make_unique<CountingBackend>(state));
};

// Whether [a, a+na) and [b, b+nb) overlap.
bool overlap(const Allocation& a, const Allocation& b) {
  auto pa = reinterpret_cast<std::uintptr_t>(a.get()), pb = reinterpret_cast<std::uintptr_t>(b.get());
  return pa < pb + b.size() && pb < pa + a.size();
}

// Removes a device allocator's memory limit when the test ends, pass or fail.
class LimitGuard {
 public:
  explicit LimitGuard(CachingAllocator& a) : a_(a) {}
  ~LimitGuard() { a_.set_memory_limit(0); }
  LimitGuard(const LimitGuard&) = delete;
  LimitGuard& operator=(const LimitGuard&) = delete;

 private:
  CachingAllocator& a_;
};

const CategoryStats& cat(const MemoryStats& s, MemoryCategory c) { return s[c]; }

// ---- standalone allocator over the fake backend ----------------------------------------------

TEST(FakeAllocator, RoundsTo512AndZeroIsEmpty) {
  Fake f;
  Allocation a = f.alloc->allocate(1, MemoryCategory::other);
  EXPECT_NE(a.get(), nullptr);
  EXPECT_EQ(a.size(), 512u) << "1 byte rounds up to one 512-B block";
  Allocation b = f.alloc->allocate(512, MemoryCategory::other);
  EXPECT_EQ(b.size(), 512u);
  Allocation c = f.alloc->allocate(513, MemoryCategory::other);
  EXPECT_EQ(c.size(), 1024u) << "513 bytes round up to 1024";
  Allocation d = f.alloc->allocate(100000, MemoryCategory::other);
  EXPECT_EQ(d.size(), 100352u) << "100000 rounds up to 196 * 512";
  EXPECT_EQ(d.category(), MemoryCategory::other);

  const int64_t calls = f.state->alloc_calls;
  Allocation z = f.alloc->allocate(0, MemoryCategory::activations);
  EXPECT_EQ(z.get(), nullptr) << "zero bytes give an empty Allocation";
  EXPECT_EQ(z.size(), 0u);
  EXPECT_EQ(f.state->alloc_calls, calls) << "a zero-byte request must not reach the backend";
  const MemoryStats st = f.alloc->stats();
  EXPECT_EQ(st[MemoryCategory::activations].allocs, 0) << "a zero-byte request is not counted";
  EXPECT_EQ(st.allocated, int64_t(512 + 512 + 1024 + 100352));
  z.reset();  // resetting an empty allocation is harmless
  EXPECT_EQ(f.alloc->stats().allocated, st.allocated);
}

TEST(FakeAllocator, BlocksDoNotOverlapAndHoldData) {
  Fake f;
  const std::vector<std::size_t> sizes = {1, 512, 700, 4 * KiB, 100 * KiB, MiB, MiB + 1, 3 * MiB, 5 * MiB + 7};
  std::vector<Allocation> blocks;
  for (std::size_t s : sizes) blocks.push_back(f.alloc->allocate(s, MemoryCategory::other));
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_GE(blocks[i].size(), sizes[i]);
    EXPECT_EQ(blocks[i].size() % CachingAllocator::kRounding, 0u);
    std::memset(blocks[i].get(), int(i + 1), blocks[i].size());
    for (std::size_t j = 0; j < i; ++j)
      EXPECT_FALSE(overlap(blocks[i], blocks[j])) << "blocks " << i << " and " << j << " overlap";
  }
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const auto* p = static_cast<const unsigned char*>(blocks[i].get());
    bool intact = true;
    for (std::size_t k = 0; k < blocks[i].size(); ++k) intact = intact && p[k] == (unsigned char)(i + 1);
    EXPECT_TRUE(intact) << "block " << i << " was overwritten by another block";
  }
}

TEST(FakeAllocator, SmallBlocksShareOneSegment) {
  Fake f;
  Allocation a = f.alloc->allocate(512, MemoryCategory::other);
  Allocation b = f.alloc->allocate(512, MemoryCategory::other);
  EXPECT_EQ(f.alloc->stats().backend_allocs, 1) << "two 512-B blocks come from one 2 MiB segment";
  EXPECT_EQ(f.state->alloc_calls, 1);
  EXPECT_EQ(f.alloc->stats().reserved, int64_t(CachingAllocator::kSmallSegment));
  EXPECT_FALSE(overlap(a, b));
  const auto pa = reinterpret_cast<std::uintptr_t>(a.get()), pb = reinterpret_cast<std::uintptr_t>(b.get());
  EXPECT_LT(pa > pb ? pa - pb : pb - pa, CachingAllocator::kSmallSegment);

  // Filling the rest of the segment with small blocks still needs no new segment.
  std::vector<Allocation> more;
  for (int i = 0; i < 3; ++i) more.push_back(f.alloc->allocate(512 * KiB, MemoryCategory::other));
  EXPECT_EQ(f.alloc->stats().backend_allocs, 1) << "1 KiB + 3 x 512 KiB fit in one 2 MiB segment";
  more.push_back(f.alloc->allocate(512 * KiB, MemoryCategory::other));
  EXPECT_EQ(f.alloc->stats().backend_allocs, 2) << "the fifth 512 KiB block needs a second segment";
}

TEST(FakeAllocator, LargeSegmentsAreRoundedTo2MiB) {
  Fake f;
  Allocation a = f.alloc->allocate(3 * MiB, MemoryCategory::other);
  EXPECT_EQ(a.size(), 3 * MiB);
  MemoryStats st = f.alloc->stats();
  EXPECT_EQ(st.backend_allocs, 1);
  EXPECT_EQ(st.reserved, int64_t(4 * MiB)) << "a 3 MiB request gets its own 4 MiB segment";
  EXPECT_EQ(st.allocated, int64_t(3 * MiB));
  ASSERT_EQ(f.state->live.size(), 1u);
  EXPECT_EQ(f.state->live.begin()->second, 4 * MiB);
}

TEST(FakeAllocator, FreedLargeBlockIsSplitForSmallerLargeRequests) {
  Fake f;
  { Allocation big = f.alloc->allocate(8 * MiB, MemoryCategory::other); }
  EXPECT_EQ(f.alloc->stats().backend_allocs, 1);
  EXPECT_EQ(f.alloc->stats().allocated, 0);
  EXPECT_EQ(f.alloc->stats().reserved, int64_t(8 * MiB)) << "freed blocks stay cached";

  std::vector<Allocation> parts;
  for (int i = 0; i < 4; ++i) parts.push_back(f.alloc->allocate(2 * MiB, MemoryCategory::other));
  EXPECT_EQ(f.alloc->stats().backend_allocs, 1)
      << "four 2 MiB requests are split out of the cached 8 MiB block";
  EXPECT_EQ(f.alloc->stats().allocated, int64_t(8 * MiB));
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < i; ++j) EXPECT_FALSE(overlap(parts[i], parts[j])) << i << " vs " << j;

  // Free in a scrambled order: the pieces coalesce back into one 8 MiB block.
  parts[1].reset();
  parts[3].reset();
  parts[0].reset();
  parts[2].reset();
  { Allocation again = f.alloc->allocate(8 * MiB, MemoryCategory::other); }
  EXPECT_EQ(f.alloc->stats().backend_allocs, 1)
      << "freed neighbours must coalesce so the 8 MiB request is met from the cache";

  f.alloc->empty_cache();
  const MemoryStats st = f.alloc->stats();
  EXPECT_EQ(st.reserved, 0);
  EXPECT_EQ(st.backend_frees, st.backend_allocs);
  EXPECT_EQ(f.state->live_bytes, 0);
}

TEST(FakeAllocator, SmallBlocksCoalesceAndEmptyCacheReturnsEverySegment) {
  Fake f;
  std::vector<Allocation> blocks;
  // ~5 MiB of small blocks of assorted sizes: several small segments.
  const std::size_t sizes[] = {512, 1000, 4096, 30000, 200 * KiB, 700 * KiB, MiB};
  for (int rep = 0; rep < 4; ++rep)
    for (std::size_t s : sizes) blocks.push_back(f.alloc->allocate(s, MemoryCategory::activations));
  // and a few large ones
  blocks.push_back(f.alloc->allocate(3 * MiB, MemoryCategory::activations));
  blocks.push_back(f.alloc->allocate(MiB + 512, MemoryCategory::activations));
  const int64_t segments = f.alloc->stats().backend_allocs;
  EXPECT_GE(segments, 3);

  // Free every other block, then the rest in reverse: coalescing in both directions.
  for (std::size_t i = 0; i < blocks.size(); i += 2) blocks[i].reset();
  f.alloc->empty_cache();
  EXPECT_GT(f.alloc->stats().reserved, 0) << "segments with live blocks must stay";
  for (std::size_t i = blocks.size(); i-- > 0;) blocks[i].reset();

  // A whole small segment's worth is available again without a new backend call.
  { Allocation m = f.alloc->allocate(MiB, MemoryCategory::other); }
  EXPECT_EQ(f.alloc->stats().backend_allocs, segments);

  f.alloc->empty_cache();
  const MemoryStats st = f.alloc->stats();
  EXPECT_EQ(st.allocated, 0);
  EXPECT_EQ(st.reserved, 0) << "every segment is wholly free after coalescing";
  EXPECT_EQ(st.backend_frees, st.backend_allocs);
  EXPECT_EQ(f.state->live_bytes, 0);
  EXPECT_EQ(f.state->free_calls, f.state->alloc_calls - f.state->failed_allocs);
}

TEST(FakeAllocator, SteadyLoopMakesNoBackendCalls) {
  Fake f;
  const std::vector<std::size_t> pattern = {512,     3000,     70000,   MiB,       100,
                                            MiB + 1, 1536 * KiB, 5 * MiB, 12 * MiB + 3, 40000};
  auto iteration = [&] {
    std::vector<Allocation> held;
    for (std::size_t i = 0; i < pattern.size(); ++i) {
      held.push_back(f.alloc->allocate(pattern[i], MemoryCategory::activations));
      if (i % 3 == 2) held[i - 1].reset();  // some frees in the middle, as in a backward pass
    }
  };
  iteration();  // warm-up
  const int64_t allocs = f.alloc->stats().backend_allocs;
  const int64_t calls = f.state->alloc_calls;
  for (int i = 0; i < 100; ++i) iteration();
  EXPECT_EQ(f.alloc->stats().backend_allocs, allocs) << "the steady state is served from the cache";
  EXPECT_EQ(f.state->alloc_calls, calls);
  EXPECT_EQ(f.state->free_calls, 0);
  EXPECT_EQ(f.alloc->stats()[MemoryCategory::activations].allocs, int64_t(101 * pattern.size()));
  EXPECT_EQ(f.alloc->stats()[MemoryCategory::activations].frees, int64_t(101 * pattern.size()));
}

TEST(FakeAllocator, DestructorReturnsCachedSegments) {
  Fake f;
  {
    Allocation a = f.alloc->allocate(100, MemoryCategory::other);
    Allocation b = f.alloc->allocate(10 * MiB, MemoryCategory::other);
  }
  EXPECT_GT(f.state->live_bytes, 0);
  f.alloc.reset();
  EXPECT_EQ(f.state->live_bytes, 0) << "destroying the allocator frees its cache";
}

TEST(FakeAllocator, ReleasesCacheAndRetriesWhenBackendFails) {
  Fake f;
  f.state->capacity = 8 * MiB;
  {
    Allocation a = f.alloc->allocate(3 * MiB, MemoryCategory::other);        // 4 MiB segment
    Allocation b = f.alloc->allocate(3 * MiB + 512, MemoryCategory::other);  // 4 MiB segment
  }
  EXPECT_EQ(f.alloc->stats().reserved, int64_t(8 * MiB));
  EXPECT_EQ(f.state->live_bytes, int64_t(8 * MiB));
  const MemoryStats before = f.alloc->stats();
  const int64_t calls = f.state->alloc_calls;

  // 6 MiB fits neither cached block, and the backend is full until the cache is released.
  Allocation c;
  ASSERT_NO_THROW(c = f.alloc->allocate(6 * MiB, MemoryCategory::activations));
  EXPECT_NE(c.get(), nullptr);
  const MemoryStats after = f.alloc->stats();
  EXPECT_EQ(after.backend_frees - before.backend_frees, 2) << "both cached segments were released";
  EXPECT_EQ(after.backend_allocs - before.backend_allocs, 1);
  EXPECT_EQ(f.state->alloc_calls - calls, 2) << "one failed try, then one retry";
  EXPECT_EQ(after.reserved, int64_t(6 * MiB));
  EXPECT_EQ(after.oom_count, 0);
  EXPECT_EQ(after[MemoryCategory::activations].current, int64_t(6 * MiB));
}

TEST(FakeAllocator, ReleasesCacheAndRetriesUnderMemoryLimit) {
  Fake f;
  f.alloc->set_memory_limit(int64_t(10 * MiB));
  EXPECT_EQ(f.alloc->memory_limit(), int64_t(10 * MiB));
  EXPECT_EQ(f.alloc->stats().limit, int64_t(10 * MiB));
  Allocation keep = f.alloc->allocate(1000, MemoryCategory::parameters);  // a small segment stays live
  {
    std::vector<Allocation> tmp;
    for (int i = 0; i < 3; ++i) tmp.push_back(f.alloc->allocate(MiB + 512, MemoryCategory::other));
  }
  const MemoryStats before = f.alloc->stats();
  EXPECT_EQ(before.reserved, int64_t(2 * MiB + 3 * 2 * MiB));

  // 7 MiB needs an 8 MiB segment: 8 + 8 > 10 MiB until the three cached 2 MiB segments go.
  Allocation big;
  ASSERT_NO_THROW(big = f.alloc->allocate(7 * MiB, MemoryCategory::activations));
  const MemoryStats after = f.alloc->stats();
  EXPECT_EQ(after.backend_frees - before.backend_frees, 3);
  EXPECT_EQ(after.reserved, int64_t(2 * MiB + 8 * MiB));
  EXPECT_LE(after.reserved, after.limit);
  EXPECT_EQ(after.oom_count, 0);
  EXPECT_EQ(f.state->live_bytes, after.reserved);
}

TEST(FakeAllocator, OutOfMemoryWhenNothingCanBeReleased) {
  Fake f;
  f.state->capacity = 4 * MiB;
  Allocation held = f.alloc->allocate(3 * MiB, MemoryCategory::parameters);
  const MemoryStats before = f.alloc->stats();
  try {
    Allocation x = f.alloc->allocate(2 * MiB, MemoryCategory::gradients);
    ADD_FAILURE() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cpu"), std::string::npos) << msg;
    EXPECT_NE(msg.find(format_bytes(2 * MiB)), std::string::npos) << msg;
    EXPECT_NE(msg.find("gradients"), std::string::npos) << msg;
    EXPECT_NE(msg.find("parameters"), std::string::npos) << msg;
  }
  const MemoryStats after = f.alloc->stats();
  EXPECT_EQ(after.oom_count, before.oom_count + 1);
  EXPECT_EQ(after.allocated, before.allocated) << "a failed request leaves the accounting alone";
  EXPECT_EQ(after[MemoryCategory::gradients].allocs, 0);
  EXPECT_EQ(after.reserved, before.reserved);

  // Still usable once the backend has room again.
  f.state->capacity = 0;
  Allocation small = f.alloc->allocate(512, MemoryCategory::other);
  EXPECT_NE(small.get(), nullptr);
  held.reset();
  small.reset();
  f.alloc->empty_cache();
  EXPECT_EQ(f.alloc->stats().reserved, 0);
  EXPECT_EQ(f.state->live_bytes, 0);
}

TEST(FakeAllocator, PerCategoryStatsAndPeakSplit) {
  Fake f;
  CachingAllocator& A = *f.alloc;
  Allocation p = A.allocate(MiB, MemoryCategory::parameters);
  Allocation g = A.allocate(MiB, MemoryCategory::gradients);
  {
    Allocation act1 = A.allocate(3 * MiB, MemoryCategory::activations);
    Allocation act2 = A.allocate(1000, MemoryCategory::activations);
    const MemoryStats s = A.stats();
    EXPECT_EQ(s[MemoryCategory::activations].current, int64_t(3 * MiB + 1024));
    EXPECT_EQ(s.allocated, int64_t(2 * MiB + 3 * MiB + 1024));
  }
  Allocation t = A.allocate(2000, MemoryCategory::backward_temporaries);
  const MemoryStats s = A.stats();
  EXPECT_EQ(s[MemoryCategory::parameters].current, int64_t(MiB));
  EXPECT_EQ(s[MemoryCategory::parameters].allocs, 1);
  EXPECT_EQ(s[MemoryCategory::parameters].frees, 0);
  EXPECT_EQ(s[MemoryCategory::activations].current, 0);
  EXPECT_EQ(s[MemoryCategory::activations].peak, int64_t(3 * MiB + 1024));
  EXPECT_EQ(s[MemoryCategory::activations].allocs, 2);
  EXPECT_EQ(s[MemoryCategory::activations].frees, 2);
  EXPECT_EQ(s[MemoryCategory::backward_temporaries].current, 2048);
  EXPECT_EQ(s[MemoryCategory::workspace].allocs, 0);
  EXPECT_EQ(s.allocated, int64_t(2 * MiB + 2048));
  EXPECT_EQ(s.allocated_peak, int64_t(5 * MiB + 1024));
  EXPECT_EQ(s.at_peak[size_t(MemoryCategory::activations)], int64_t(3 * MiB + 1024))
      << "at_peak is the split when allocated_peak was reached";
  EXPECT_EQ(s.at_peak[size_t(MemoryCategory::parameters)], int64_t(MiB));
  EXPECT_EQ(s.at_peak[size_t(MemoryCategory::backward_temporaries)], 0);
  int64_t sum = 0;
  for (int64_t v : s.at_peak) sum += v;
  EXPECT_EQ(sum, s.allocated_peak);

  A.reset_peak();
  const MemoryStats r = A.stats();
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
    EXPECT_EQ(r.by_category[c].peak, r.by_category[c].current) << category_name(MemoryCategory(c));
    EXPECT_EQ(r.at_peak[c], r.by_category[c].current) << category_name(MemoryCategory(c));
  }
  EXPECT_EQ(r.allocated_peak, r.allocated);
  EXPECT_EQ(r.reserved_peak, r.reserved);
  EXPECT_EQ(r[MemoryCategory::activations].allocs, 2) << "reset_peak keeps the counters";
}

// ---- the per-device allocators ---------------------------------------------------------------

class AllocatorTest : public DeviceTest {
 protected:
  CachingAllocator& alloc() { return allocator_for(device()); }
};

TEST_P(AllocatorTest, RoundingAndZeroBytes) {
  CachingAllocator& A = alloc();
  EXPECT_EQ(A.device(), device());
  const MemoryStats before = A.stats();
  {
    Allocation a = A.allocate(1, MemoryCategory::other);
    Allocation b = A.allocate(513, MemoryCategory::other);
    Allocation z = A.allocate(0, MemoryCategory::other);
    EXPECT_EQ(a.size(), 512u);
    EXPECT_EQ(b.size(), 1024u);
    EXPECT_EQ(z.get(), nullptr);
    EXPECT_EQ(z.size(), 0u);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.get()) % 64, 0u) << "blocks are at least 64-B aligned";
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.get()) % 64, 0u);
    const MemoryStats mid = A.stats();
    EXPECT_EQ(mid.allocated - before.allocated, 1536);
    EXPECT_EQ(mid[MemoryCategory::other].allocs - before[MemoryCategory::other].allocs, 2);
  }
  const MemoryStats after = A.stats();
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_EQ(after[MemoryCategory::other].frees - before[MemoryCategory::other].frees, 2);
}

TEST_P(AllocatorTest, SteadyLoopMakesNoBackendAllocations) {
  CachingAllocator& A = alloc();
  const std::vector<std::size_t> pattern = {512, 4000, 64 * KiB, MiB, 2 * MiB + 5, 700, 6 * MiB, 300 * KiB};
  auto iteration = [&] {
    std::vector<Allocation> held;
    for (std::size_t s : pattern) held.push_back(A.allocate(s, MemoryCategory::activations));
    held[1].reset();
    held.push_back(A.allocate(3000, MemoryCategory::backward_temporaries));
    held[4].reset();
    held.push_back(A.allocate(2 * MiB, MemoryCategory::backward_temporaries));
  };
  iteration();  // warm-up
  const MemoryStats before = A.stats();
  for (int i = 0; i < 100; ++i) iteration();
  const MemoryStats after = A.stats();
  EXPECT_EQ(after.backend_allocs, before.backend_allocs) << "no backend allocation in the steady state";
  EXPECT_EQ(after.backend_frees, before.backend_frees);
  EXPECT_EQ(after.reserved, before.reserved);
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_EQ(after[MemoryCategory::activations].allocs - before[MemoryCategory::activations].allocs,
            int64_t(100 * pattern.size()));
}

TEST_P(AllocatorTest, TensorsCarryTheCategoryOfTheScope) {
  CachingAllocator& A = alloc();
  const MemoryStats before = A.stats();
  {
    MemoryCategoryScope outer(MemoryCategory::parameters);
    Tensor p = Tensor::empty({1000}, DType::f32, device());  // 4000 B -> 4096
    EXPECT_EQ(p.memory_category(), MemoryCategory::parameters);
    {
      MemoryCategoryScope inner(MemoryCategory::activations);
      EXPECT_EQ(current_memory_category(), MemoryCategory::activations);
      Tensor a = Tensor::empty({3, 100}, DType::f32, device());  // 1200 B -> 1536
      EXPECT_EQ(a.memory_category(), MemoryCategory::activations);
      const MemoryStats mid = A.stats();
      EXPECT_EQ(mid[MemoryCategory::activations].current - before[MemoryCategory::activations].current, 1536);
      EXPECT_EQ(mid[MemoryCategory::activations].allocs - before[MemoryCategory::activations].allocs, 1);
      EXPECT_GE(mid[MemoryCategory::activations].peak, before[MemoryCategory::activations].current + 1536);
      EXPECT_EQ(mid[MemoryCategory::parameters].current - before[MemoryCategory::parameters].current, 4096);
      EXPECT_EQ(mid.allocated - before.allocated, 4096 + 1536);
    }
    EXPECT_EQ(current_memory_category(), MemoryCategory::parameters) << "scopes nest";
    Tensor q = Tensor::zeros({10}, DType::i32, device());
    EXPECT_EQ(q.memory_category(), MemoryCategory::parameters);
    const MemoryStats mid = A.stats();
    EXPECT_EQ(mid[MemoryCategory::activations].current, before[MemoryCategory::activations].current);
    EXPECT_EQ(mid[MemoryCategory::activations].frees - before[MemoryCategory::activations].frees, 1);
    EXPECT_EQ(mid[MemoryCategory::parameters].current - before[MemoryCategory::parameters].current, 4096 + 512);
  }
  EXPECT_EQ(current_memory_category(), MemoryCategory::other) << "no scope open: the fallback";
  EXPECT_EQ(current_memory_category(MemoryCategory::data), MemoryCategory::data);
  Tensor o = Tensor::empty({7}, DType::u8, device());
  EXPECT_EQ(o.memory_category(), MemoryCategory::other) << "factories outside any scope: other";
  const MemoryStats after = A.stats();
  EXPECT_EQ(after[MemoryCategory::parameters].current, before[MemoryCategory::parameters].current);
  EXPECT_EQ(after[MemoryCategory::parameters].allocs - before[MemoryCategory::parameters].allocs, 2);
  EXPECT_EQ(after[MemoryCategory::parameters].frees - before[MemoryCategory::parameters].frees, 2);
  EXPECT_EQ(after[MemoryCategory::other].current - before[MemoryCategory::other].current, 512);
}

// Allocation::recategorize (Note [Custom op outputs are activations]): the live block moves, counted
// as a free in the old category and an allocation in the new one; the total does not change.
TEST_P(AllocatorTest, RecategorizeMovesALiveBlock) {
  CachingAllocator& A = alloc();
  const MemoryStats before = A.stats();
  Allocation a = A.allocate(1000, MemoryCategory::other);  // 1024
  a.recategorize(MemoryCategory::activations);
  EXPECT_EQ(a.category(), MemoryCategory::activations);
  const MemoryStats mid = A.stats();
  EXPECT_EQ(mid[MemoryCategory::other].current, before[MemoryCategory::other].current);
  EXPECT_EQ(mid[MemoryCategory::other].allocs - before[MemoryCategory::other].allocs, 1);
  EXPECT_EQ(mid[MemoryCategory::other].frees - before[MemoryCategory::other].frees, 1);
  EXPECT_EQ(mid[MemoryCategory::activations].current - before[MemoryCategory::activations].current, 1024);
  EXPECT_EQ(mid[MemoryCategory::activations].allocs - before[MemoryCategory::activations].allocs, 1);
  EXPECT_GE(mid[MemoryCategory::activations].peak, mid[MemoryCategory::activations].current);
  EXPECT_EQ(mid.allocated - before.allocated, 1024);
  a.reset();
  const MemoryStats after = A.stats();
  EXPECT_EQ(after[MemoryCategory::activations].current, before[MemoryCategory::activations].current);
  EXPECT_EQ(after[MemoryCategory::activations].frees - before[MemoryCategory::activations].frees, 1);
  EXPECT_EQ(after.allocated, before.allocated);
}

TEST_P(AllocatorTest, DirectAllocationsByCategoryAndPeakSplit) {
  CachingAllocator& A = alloc();
  A.reset_peak();
  const MemoryStats base = A.stats();
  EXPECT_EQ(base.allocated_peak, base.allocated);
  const auto data = MemoryCategory::data, ws = MemoryCategory::workspace;
  Allocation d = A.allocate(MiB, data);
  EXPECT_EQ(d.category(), data);
  {
    Allocation w = A.allocate(2 * MiB, ws);
    Allocation w2 = A.allocate(100, ws);
    const MemoryStats s = A.stats();
    EXPECT_EQ(s[ws].current - base[ws].current, int64_t(2 * MiB + 512));
    EXPECT_EQ(s[ws].allocs - base[ws].allocs, 2);
  }
  Allocation d2 = A.allocate(512, data);
  const MemoryStats s = A.stats();
  EXPECT_EQ(s[data].current - base[data].current, int64_t(MiB + 512));
  EXPECT_EQ(s[data].allocs - base[data].allocs, 2);
  EXPECT_EQ(s[ws].current, base[ws].current);
  EXPECT_EQ(s[ws].frees - base[ws].frees, 2);
  EXPECT_EQ(s[ws].peak, base[ws].current + int64_t(2 * MiB + 512));
  EXPECT_EQ(s.allocated_peak - base.allocated, int64_t(MiB + 2 * MiB + 512))
      << "the peak was with the workspace blocks alive, before the second data block";
  EXPECT_EQ(s.at_peak[size_t(ws)] - base[ws].current, int64_t(2 * MiB + 512));
  EXPECT_EQ(s.at_peak[size_t(data)] - base[data].current, int64_t(MiB));

  // reset_peak: the peaks fall back to the current values.
  A.reset_peak();
  const MemoryStats r = A.stats();
  EXPECT_EQ(r[ws].peak, r[ws].current);
  EXPECT_EQ(r[data].peak, r[data].current);
  EXPECT_EQ(r.allocated_peak, r.allocated);
  EXPECT_EQ(r.at_peak[size_t(data)], r[data].current);
  EXPECT_EQ(r.reserved_peak, r.reserved);
}

TEST_P(AllocatorTest, MemoryLimitThrowsOutOfMemoryAndRecovers) {
  CachingAllocator& A = alloc();
  LimitGuard guard(A);
  A.empty_cache();
  const MemoryStats base = A.stats();
  const int64_t limit = base.reserved + int64_t(8 * MiB);
  A.set_memory_limit(limit);
  EXPECT_EQ(A.memory_limit(), limit);
  EXPECT_EQ(A.stats().limit, limit);

  Allocation params = A.allocate(2 * MiB, MemoryCategory::parameters);  // within the limit
  const MemoryStats before = A.stats();
  const std::size_t request = 16 * MiB;
  bool thrown = false;
  try {
    Allocation big = A.allocate(request, MemoryCategory::activations);
  } catch (const OutOfMemory& e) {
    thrown = true;
    const std::string msg = e.what();
    EXPECT_NE(msg.find(device().str()), std::string::npos) << "names the device: " << msg;
    EXPECT_NE(msg.find(format_bytes(int64_t(request))), std::string::npos) << "names the request size: " << msg;
    EXPECT_NE(msg.find("activations"), std::string::npos) << "names the request's category: " << msg;
    EXPECT_NE(msg.find("parameters"), std::string::npos) << "gives the usage by category: " << msg;
    EXPECT_NE(msg.find("gradients"), std::string::npos) << msg;
  }
  EXPECT_TRUE(thrown) << "a request past the memory limit must throw OutOfMemory";
  const MemoryStats after = A.stats();
  EXPECT_EQ(after.oom_count - before.oom_count, 1);
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_LE(after.reserved, limit);
  EXPECT_EQ(after[MemoryCategory::activations].allocs, before[MemoryCategory::activations].allocs);

  // Still usable under the limit.
  {
    Allocation small = A.allocate(512, MemoryCategory::other);
    EXPECT_NE(small.get(), nullptr);
    Allocation medium = A.allocate(3 * MiB, MemoryCategory::activations);
    EXPECT_NE(medium.get(), nullptr);
  }
  // Lifting the limit lets the big request through.
  A.set_memory_limit(0);
  EXPECT_EQ(A.memory_limit(), 0);
  Allocation big;
  ASSERT_NO_THROW(big = A.allocate(request, MemoryCategory::activations));
  EXPECT_EQ(big.size(), request);
  EXPECT_EQ(A.stats().oom_count, after.oom_count);
  EXPECT_THROW(A.set_memory_limit(-1), InvalidArgument);
}

TEST_P(AllocatorTest, TensorFactoryOutOfMemoryNamesTheCategory) {
  CachingAllocator& A = alloc();
  LimitGuard guard(A);
  A.empty_cache();
  A.set_memory_limit(A.stats().reserved + int64_t(4 * MiB));
  MemoryCategoryScope scope(MemoryCategory::optimizer_state);
  try {
    Tensor t = Tensor::empty({int64_t(4 * MiB)}, DType::f32, device());  // 16 MiB
    ADD_FAILURE() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer_state"), std::string::npos) << e.what();
  }
  A.set_memory_limit(0);
  Tensor t = Tensor::empty({int64_t(4 * MiB)}, DType::f32, device());
  EXPECT_EQ(t.memory_category(), MemoryCategory::optimizer_state);
}

TEST_P(AllocatorTest, EmptyCacheKeepsLiveBlocks) {
  CachingAllocator& A = alloc();
  A.empty_cache();  // no cached free space left for the blocks below to be cut from
  Allocation live = A.allocate(5 * MiB, MemoryCategory::other);
  { Allocation tmp = A.allocate(9 * MiB, MemoryCategory::other); }
  const MemoryStats before = A.stats();
  A.empty_cache();
  const MemoryStats after = A.stats();
  EXPECT_GE(after.reserved, int64_t(6 * MiB)) << "the live 5 MiB block's segment stays";
  EXPECT_LE(after.reserved, before.reserved - int64_t(10 * MiB)) << "the cached 10 MiB segment goes";
  EXPECT_GT(after.backend_frees, before.backend_frees);
  EXPECT_EQ(after.allocated, before.allocated);
}

CUMULUS_INSTANTIATE_DEVICES(AllocatorTest);

TEST(Category, NamesAndFormatBytes) {
  EXPECT_STREQ(category_name(MemoryCategory::parameters), "parameters");
  EXPECT_STREQ(category_name(MemoryCategory::backward_temporaries), "backward_temporaries");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(12 * MiB), "12.0 MiB");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
}

}  // namespace
}  // namespace cumulus
