// Memory prediction from a recorded allocation sequence (docs/ARCHITECTURE.md, "Memory accounting";
// Note [Memory prediction] in engine/memory/prediction.cpp): record what one micro-batch allocates
// and frees at two sizes, model every event's size as affine in the micro-batch size, and replay
// the sequence predicted for any size through a real CachingAllocator over a backend that hands out
// addresses but no memory. Rounding, pools, segments and reservation are then the allocator's own.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cumulus/memory/allocator.h"
#include "cumulus/memory/category.h"

namespace cumulus {

// One allocation or free seen by the observer: the category whose `current` changed and by how much
// (the request rounded up to 512 B).
struct MemoryEvent {
  MemoryCategory category = MemoryCategory::other;
  bool alloc = true;
  int64_t bytes = 0;
};

// A block that is not live at rest but will be during every micro-batch of training (the optimizer
// state, allocated at the first step): the replay holds it from the start.
struct FixedBlock {
  MemoryCategory category = MemoryCategory::optimizer_state;
  int64_t bytes = 0;
};

struct PredictedMemory {
  int64_t micro_batch = 0;
  int64_t peak_bytes = 0;      // allocated at the peak, all categories, fixed costs included
  int64_t reserved_bytes = 0;  // reserved at the peak (what --memory-budget limits)
  std::array<int64_t, kNumMemoryCategories> peak_by_category{};  // the split at the peak
};

class MemoryPredictor {
 public:
  MemoryPredictor() = default;

  // False when the two recordings could not be matched (see reason()); predict() then throws.
  bool ok() const { return ok_; }
  const std::string& reason() const { return reason_; }  // why not ok, or a one-line summary
  int64_t small_size() const { return small_; }
  int64_t large_size() const { return large_; }
  std::size_t events() const { return alloc_.size(); }
  int64_t rest_reserved() const { return rest_reserved_; }
  const std::array<int64_t, kNumMemoryCategories>& rest_by_category() const { return rest_; }

  // The predicted event sequence of a micro-batch of `micro_batch` samples (sizes rounded to 512 B;
  // an event predicted at zero bytes is left out, with its free).
  std::vector<MemoryEvent> sequence(int64_t micro_batch) const;
  // Replays sequence(micro_batch) from the state at rest (plus the extra fixed blocks).
  PredictedMemory predict(int64_t micro_batch) const;

  // From two recorded sequences of sizes small < large, both made from the same state at rest
  // (per-category bytes `rest`, `rest_reserved` reserved after empty_cache()). Fails (ok() false)
  // when the sequences differ in length, order of categories, alloc/free pattern, or when a free has
  // no earlier allocation of its category and size.
  static MemoryPredictor from_recordings(int64_t small, const std::vector<MemoryEvent>& small_events, int64_t large,
                                         const std::vector<MemoryEvent>& large_events,
                                         const std::array<int64_t, kNumMemoryCategories>& rest, int64_t rest_reserved,
                                         std::vector<FixedBlock> extra_fixed = {});

 private:
  bool ok_ = false;
  std::string reason_;
  int64_t small_ = 0, large_ = 0;
  // Per event: alloc or free, category, size affine in the micro-batch (alloc events), and for a
  // free the index of the allocation it returns.
  std::vector<bool> alloc_;
  std::vector<MemoryCategory> category_;
  std::vector<double> intercept_, slope_;
  std::vector<int64_t> pair_;
  std::array<int64_t, kNumMemoryCategories> rest_{};
  int64_t rest_reserved_ = 0;
  std::vector<FixedBlock> extra_fixed_;
};

// Records the events `run` causes on `alloc` through its observer (installed for the call, removed
// after: any other observer is replaced). Every block `run` allocates must be freed when it returns;
// otherwise an InvalidArgument names the bytes left.
std::vector<MemoryEvent> record_allocations(CachingAllocator& alloc, const std::function<void()>& run);

// The whole recipe: runs `micro_batch(small)` once unrecorded (one-time allocations such as library
// workspaces happen there), empties the cache, takes the state at rest, then records
// `micro_batch(small)` and `micro_batch(large)`. `micro_batch(b)` must run one training micro-batch
// of b samples (batch, forward, loss, backward) and free all it allocated. Sizes that are multiples
// of 128 make the fit exact for tensors of 4-byte elements (b * 4 * k bytes are whole 512-B units).
// The memory limit is lifted while recording and restored after.
MemoryPredictor record_micro_batch(CachingAllocator& alloc, const std::function<void(int64_t)>& micro_batch,
                                   int64_t small, int64_t large, std::vector<FixedBlock> extra_fixed = {});

}  // namespace cumulus
