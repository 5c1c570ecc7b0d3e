// Note [Memory prediction]
// A line through the peaks of two probes misses what the allocator adds: rounding, the 2 MiB small
// segments, large segments rounded to 2 MiB, blocks that cannot be reused because a free one is too
// small. So the predictor works at the level of single allocations. The allocator's observer sees
// the stats after every allocation and free; the one category whose `current` changed, and by how
// much, is the event (alloc or free, category, rounded size). Two micro-batches of sizes S < L give
// two sequences; the engine runs the same ops in the same order at every size, so they match event
// by event, and each size is affine in the micro-batch (a [b, k] tensor of 4-byte elements is 4kb
// bytes; with S and L multiples of 128 that is a whole number of 512-B units at both, so the fit has
// no rounding error). A free is paired with the latest live allocation of its category and size
// (backward releases in reverse order), decided once on the larger recording, where sizes collide
// least, and checked on the smaller.
//
// predict(B) builds the sequence for B and replays it through a real CachingAllocator whose backend
// hands out distinct fake addresses and never memory. The allocator only does arithmetic and
// comparisons on block pointers (it splits a block at ptr + size and orders free blocks by address);
// it never reads or writes through them, so nothing is touched. The replay starts from the state at
// rest: one block per category of the bytes held at rest, plus the fixed blocks the caller adds (the
// optimizer state a training step holds). Predicted reserved = the real reserved at rest + what the
// replay reserves above its own rest. The real cache at rest may have room the replay's does not
// (tails of partly used segments), so reserved errs on the high side.
#include "cumulus/memory/prediction.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <utility>

#include "cumulus/core/error.h"

namespace cumulus {

namespace {

// Distinct, never-dereferenced addresses, far apart so no two segments touch.
class FakeBackend final : public MemoryBackend {
 public:
  void* raw_alloc(std::size_t bytes) override {
    const uintptr_t p = next_;
    next_ += (bytes + kAlign - 1) / kAlign * kAlign + kAlign;
    return reinterpret_cast<void*>(p);
  }
  void raw_free(void*) noexcept override {}

 private:
  static constexpr uintptr_t kAlign = 1 << 21;
  uintptr_t next_ = uintptr_t{1} << 40;
};

class Recorder final : public AllocationObserver {
 public:
  explicit Recorder(const MemoryStats& start) {
    for (std::size_t c = 0; c < kNumMemoryCategories; ++c) last_[c] = start.by_category[c].current;
    events.reserve(1 << 12);
  }
  void on_change(const MemoryStats& stats) override {
    for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
      const int64_t d = stats.by_category[c].current - last_[c];
      if (d == 0) continue;
      events.push_back(MemoryEvent{static_cast<MemoryCategory>(c), d > 0, d > 0 ? d : -d});
      last_[c] = stats.by_category[c].current;
    }
  }
  std::vector<MemoryEvent> events;

 private:
  std::array<int64_t, kNumMemoryCategories> last_{};
};

int64_t round_512(double bytes) {
  const int64_t b = std::max<int64_t>(0, static_cast<int64_t>(std::ceil(bytes - 1e-6)));
  constexpr int64_t r = static_cast<int64_t>(CachingAllocator::kRounding);
  return (b + r - 1) / r * r;
}

}  // namespace

std::vector<MemoryEvent> record_allocations(CachingAllocator& alloc, const std::function<void()>& run) {
  const MemoryStats before = alloc.stats();
  Recorder rec(before);
  alloc.set_observer(&rec);
  try {
    run();
  } catch (...) {
    alloc.set_observer(nullptr);
    throw;
  }
  alloc.set_observer(nullptr);
  const int64_t left = alloc.stats().allocated - before.allocated;
  CUMULUS_CHECK(left == 0, InvalidArgument, "record_allocations: the recorded run left ", format_bytes(left),
                " allocated; a micro-batch must free what it allocates");
  return std::move(rec.events);
}

MemoryPredictor MemoryPredictor::from_recordings(int64_t small, const std::vector<MemoryEvent>& se, int64_t large,
                                                 const std::vector<MemoryEvent>& le,
                                                 const std::array<int64_t, kNumMemoryCategories>& rest,
                                                 int64_t rest_reserved, std::vector<FixedBlock> extra_fixed) {
  CUMULUS_CHECK(0 < small && small < large, InvalidArgument, "MemoryPredictor: need 0 < small < large, got ", small,
                " and ", large);
  MemoryPredictor p;
  p.small_ = small;
  p.large_ = large;
  p.rest_ = rest;
  p.rest_reserved_ = rest_reserved;
  p.extra_fixed_ = std::move(extra_fixed);
  auto fail = [&](std::string why) {
    p.ok_ = false;
    p.reason_ = "the recorded allocation sequences of micro-batches " + std::to_string(small) + " and " +
                std::to_string(large) + " do not match: " + why;
    return p;
  };
  if (se.size() != le.size())
    return fail(std::to_string(se.size()) + " vs " + std::to_string(le.size()) + " allocations and frees");
  const std::size_t n = le.size();
  for (std::size_t i = 0; i < n; ++i) {
    if (se[i].category != le[i].category || se[i].alloc != le[i].alloc)
      return fail("event " + std::to_string(i) + " is a " + (se[i].alloc ? "alloc" : "free") + " of " +
                  category_name(se[i].category) + " vs a " + (le[i].alloc ? "alloc" : "free") + " of " +
                  category_name(le[i].category));
  }
  // Pair frees with allocations on the larger recording, latest first; check them on the smaller.
  p.pair_.assign(n, -1);
  std::map<std::pair<int, int64_t>, std::vector<int64_t>> live;
  for (std::size_t i = 0; i < n; ++i) {
    auto& stack = live[{static_cast<int>(le[i].category), le[i].bytes}];
    if (le[i].alloc) {
      stack.push_back(static_cast<int64_t>(i));
      continue;
    }
    if (stack.empty())
      return fail("event " + std::to_string(i) + " frees " + std::to_string(le[i].bytes) + " B of " +
                  category_name(le[i].category) + " that the micro-batch did not allocate");
    p.pair_[i] = stack.back();
    stack.pop_back();
    if (se[static_cast<std::size_t>(p.pair_[i])].bytes != se[i].bytes)
      return fail("event " + std::to_string(i) + " frees a block of another size at micro-batch " +
                  std::to_string(small));
  }
  p.alloc_.resize(n);
  p.category_.resize(n);
  p.intercept_.assign(n, 0.0);
  p.slope_.assign(n, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    p.alloc_[i] = le[i].alloc;
    p.category_[i] = le[i].category;
    if (!le[i].alloc) continue;
    p.slope_[i] = static_cast<double>(le[i].bytes - se[i].bytes) / static_cast<double>(large - small);
    p.intercept_[i] = static_cast<double>(se[i].bytes) - p.slope_[i] * static_cast<double>(small);
  }
  p.ok_ = true;
  p.reason_ = std::to_string(n) + " allocations and frees per micro-batch, matched between micro-batches " +
              std::to_string(small) + " and " + std::to_string(large);
  return p;
}

std::vector<MemoryEvent> MemoryPredictor::sequence(int64_t micro_batch) const {
  CUMULUS_CHECK(ok_, InvalidArgument, "MemoryPredictor: no prediction: ", reason_);
  CUMULUS_CHECK(micro_batch > 0, InvalidArgument, "MemoryPredictor: micro-batch must be > 0, got ", micro_batch);
  std::vector<MemoryEvent> out;
  out.reserve(alloc_.size());
  std::vector<int64_t> bytes(alloc_.size(), 0);
  for (std::size_t i = 0; i < alloc_.size(); ++i) {
    bytes[i] = alloc_[i] ? round_512(intercept_[i] + slope_[i] * static_cast<double>(micro_batch))
                         : bytes[static_cast<std::size_t>(pair_[i])];
    if (bytes[i] > 0) out.push_back(MemoryEvent{category_[i], alloc_[i], bytes[i]});
  }
  return out;
}

PredictedMemory MemoryPredictor::predict(int64_t micro_batch) const {
  CUMULUS_CHECK(ok_, InvalidArgument, "MemoryPredictor: no prediction: ", reason_);
  CUMULUS_CHECK(micro_batch > 0, InvalidArgument, "MemoryPredictor: micro-batch must be > 0, got ", micro_batch);
  CachingAllocator replay(Device::cpu(), std::make_unique<FakeBackend>());
  std::vector<Allocation> held;  // the state at rest and the extra fixed blocks
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c)
    if (rest_[c] > 0) held.push_back(replay.allocate(static_cast<std::size_t>(rest_[c]), static_cast<MemoryCategory>(c)));
  const int64_t replay_rest_reserved = replay.stats().reserved;
  for (const FixedBlock& f : extra_fixed_)
    if (f.bytes > 0) held.push_back(replay.allocate(static_cast<std::size_t>(f.bytes), f.category));
  replay.reset_peak();

  std::vector<Allocation> blocks(alloc_.size());
  for (std::size_t i = 0; i < alloc_.size(); ++i) {
    if (alloc_[i]) {
      const int64_t b = round_512(intercept_[i] + slope_[i] * static_cast<double>(micro_batch));
      if (b > 0) blocks[i] = replay.allocate(static_cast<std::size_t>(b), category_[i]);
    } else {
      blocks[static_cast<std::size_t>(pair_[i])].reset();
    }
  }
  const MemoryStats st = replay.stats();
  PredictedMemory out;
  out.micro_batch = micro_batch;
  out.peak_bytes = st.allocated_peak;
  out.reserved_bytes = rest_reserved_ + (st.reserved_peak - replay_rest_reserved);
  out.peak_by_category = st.at_peak;
  return out;
}

MemoryPredictor record_micro_batch(CachingAllocator& alloc, const std::function<void(int64_t)>& micro_batch,
                                   int64_t small, int64_t large, std::vector<FixedBlock> extra_fixed) {
  CUMULUS_CHECK(0 < small && small < large, InvalidArgument, "record_micro_batch: need 0 < small < large, got ",
                small, " and ", large);
  const int64_t limit = alloc.memory_limit();
  struct RestoreLimit {
    CachingAllocator& a;
    int64_t limit;
    ~RestoreLimit() { a.set_memory_limit(limit); }
  } restore{alloc, limit};
  alloc.set_memory_limit(0);
  micro_batch(small);  // one-time allocations (workspaces, lazily made buffers) happen here
  alloc.empty_cache();
  const MemoryStats rest = alloc.stats();
  std::array<int64_t, kNumMemoryCategories> rest_bytes{};
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) rest_bytes[c] = rest.by_category[c].current;
  const std::vector<MemoryEvent> se = record_allocations(alloc, [&] { micro_batch(small); });
  const std::vector<MemoryEvent> le = record_allocations(alloc, [&] { micro_batch(large); });
  alloc.empty_cache();
  return MemoryPredictor::from_recordings(small, se, large, le, rest_bytes, rest.reserved, std::move(extra_fixed));
}

}  // namespace cumulus
