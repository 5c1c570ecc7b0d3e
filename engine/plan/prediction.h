// Memory prediction from a recorded allocation sequence (docs/ARCHITECTURE.md, "Memory accounting";
// Note [Memory prediction] in engine/plan/prediction.cpp): record what one micro-batch allocates
// and frees at several sizes, model every event's size as piecewise affine in the micro-batch size
// (affine for most; capped scratch buffers bend), and replay the sequence predicted for any size
// through a real CachingAllocator over a backend that hands out addresses but no memory. Rounding,
// pools, segments and reservation are then the allocator's own.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cumulus/memory/allocator.h"
#include "cumulus/memory/category.h"

namespace cumulus::plan {

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

// One micro-batch's recorded events (record_allocations) and its size.
struct MemoryRecording {
  int64_t micro_batch = 0;
  std::vector<MemoryEvent> events;
};

struct PredictedMemory {
  int64_t micro_batch = 0;
  int64_t peak_bytes = 0;      // allocated at the peak, all categories, fixed costs included
  int64_t reserved_bytes = 0;  // reserved at the peak (what --memory-budget limits)
  std::array<int64_t, kNumMemoryCategories> peak_by_category{};  // the split at the peak
};

// One affine piece of an allocation's size, fitted on the recorded sizes [lo, hi] (hi is the
// largest recorded size for the top piece, which also extends above it).
struct AllocationPiece {
  int64_t lo = 0, hi = 0;
  double intercept = 0, slope = 0;
};

class MemoryPredictor {
 public:
  MemoryPredictor() = default;

  // False when the recordings could not be matched (see reason()); predict() then throws.
  bool ok() const { return ok_; }
  const std::string& reason() const { return reason_; }  // why not ok, or a one-line summary
  int64_t small_size() const { return small_; }          // the two largest recorded sizes (the top piece)
  int64_t large_size() const { return large_; }
  std::size_t events() const { return alloc_.size(); }
  // Every size whose recording the fit uses, largest first.
  const std::vector<int64_t>& recorded_sizes() const { return sizes_; }
  // Allocations whose size is not one affine function of the micro-batch over the recorded sizes.
  std::size_t piecewise_events() const;
  // Sizes whose recording would narrow a bend not yet pinned to two adjacent sizes (the midpoints
  // of those gaps, ascending, the regime below's too); empty when every bend is pinned.
  // record_micro_batch records them.
  std::vector<int64_t> refinement_sizes() const;
  int64_t rest_reserved() const { return rest_reserved_; }
  const std::array<int64_t, kNumMemoryCategories>& rest_by_category() const { return rest_; }

  // The predicted event sequence of a micro-batch of `micro_batch` units (sizes rounded to 512 B;
  // an event predicted at zero bytes is left out, with its free): the regime below's up to its
  // largest recorded size.
  std::vector<MemoryEvent> sequence(int64_t micro_batch) const;
  // Replays sequence(micro_batch) from the state at rest (plus the extra fixed blocks); below the
  // recorded sizes of this sequence, the regime below's prediction (regime_below()).
  PredictedMemory predict(int64_t micro_batch) const;
  // The predictor of the smaller recordings whose sequence differs from this one's (a path the
  // engine takes only up to some size, such as the fused MLP's), fitted on its own; null when
  // there is none, or fewer than two of them match each other (those are left out).
  const MemoryPredictor* regime_below() const { return below_.get(); }

  // From recordings at two or more distinct sizes, all made from the same state at rest
  // (per-category bytes `rest`, `rest_reserved` reserved after empty_cache()). The two largest
  // must match: same length, order of categories and alloc/free pattern, every free returning an
  // earlier allocation of its category and size; otherwise ok() is false. The smaller recordings
  // that do not match them form the regime below when its own two largest match (recursively);
  // the rest are left out of the fit (reason() says so). `rest_blocks`, when given, are
  // the live blocks at rest (CachingAllocator::live_blocks(); their bytes by category must add up
  // to `rest`): the replay then starts from them, the small pool's room at rest included, instead
  // of one block per category.
  static MemoryPredictor from_recordings(std::vector<MemoryRecording> recordings,
                                         const std::array<int64_t, kNumMemoryCategories>& rest, int64_t rest_reserved,
                                         std::vector<FixedBlock> extra_fixed = {},
                                         std::vector<LiveBlock> rest_blocks = {});
  // The same from two recordings, small < large.
  static MemoryPredictor from_recordings(int64_t small, const std::vector<MemoryEvent>& small_events, int64_t large,
                                         const std::vector<MemoryEvent>& large_events,
                                         const std::array<int64_t, kNumMemoryCategories>& rest, int64_t rest_reserved,
                                         std::vector<FixedBlock> extra_fixed = {});

 private:
  using Piece = AllocationPiece;
  // The pieces of one allocation from its sizes `bytes` at the recorded `sizes` (largest first).
  static std::vector<Piece> fit_pieces(const std::vector<int64_t>& sizes, const std::vector<int64_t>& bytes);
  int64_t bytes_at(std::size_t event, int64_t micro_batch) const;
  // predict() on this sequence alone.
  PredictedMemory replay(int64_t micro_batch) const;

  bool ok_ = false;
  std::string reason_;
  int64_t small_ = 0, large_ = 0;
  std::vector<int64_t> sizes_;
  // Per event: alloc or free, category, the pieces of its size (alloc events; largest sizes first),
  // and for a free the index of the allocation it returns.
  std::vector<bool> alloc_;
  std::vector<MemoryCategory> category_;
  std::vector<std::vector<Piece>> pieces_;
  std::vector<int64_t> pair_;
  std::array<int64_t, kNumMemoryCategories> rest_{};
  int64_t rest_reserved_ = 0;
  std::vector<LiveBlock> rest_blocks_;
  std::vector<FixedBlock> extra_fixed_;
  std::shared_ptr<const MemoryPredictor> below_;
};

// Records the events `run` causes on `alloc` through its observer (installed for the call, removed
// after: any other observer is replaced). Every block `run` allocates must be freed when it returns;
// otherwise an InvalidArgument names the bytes left.
std::vector<MemoryEvent> record_allocations(CachingAllocator& alloc, const std::function<void()>& run);

// The whole recipe: runs `micro_batch(small)` once unrecorded (one-time allocations such as library
// workspaces happen there), empties the cache, takes the state at rest, then records
// `micro_batch(large)`, `micro_batch(small)` and the halvings of `small` down to 1 (small / 2,
// small / 4, ..., 1), then the refinement_sizes() until every bend of a piecewise allocation is
// pinned (at most kMaxRefinements more recordings, all below `small`, so the whole costs about two
// micro-batches of `small`). `micro_batch(b)` must run one training micro-batch of b units
// (batch, forward, loss, backward) and free all it allocated. Sizes that are multiples of 128 make
// the top piece exact for tensors of 4-byte elements (b * 4 * k bytes are whole 512-B units). With
// `lift_limit` the memory limit is lifted while recording and restored after; without it the
// recordings run under the allocator's limit as it is (plan_batch's: its budget), and an
// OutOfMemory passes through.
constexpr int kMaxRefinements = 32;
MemoryPredictor record_micro_batch(CachingAllocator& alloc, const std::function<void(int64_t)>& micro_batch,
                                   int64_t small, int64_t large, std::vector<FixedBlock> extra_fixed = {},
                                   bool lift_limit = true);

}  // namespace cumulus::plan
