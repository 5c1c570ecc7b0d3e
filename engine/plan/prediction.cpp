// Note [Memory prediction]
// A line through the peaks of two probes misses what the allocator adds: rounding, the 2 MiB small
// segments, large segments rounded to 2 MiB, blocks that cannot be reused because a free one is too
// small. So the predictor works at the level of single allocations. The allocator's observer sees
// the stats after every allocation and free; the one category whose `current` changed, and by how
// much, is the event (alloc or free, category, rounded size). Micro-batches of different sizes give
// sequences that match event by event (the engine runs the same ops in the same order at every
// size). A free is paired with the latest live allocation of its category and size (backward
// releases in reverse order), decided once on the largest recording, where sizes collide least,
// and checked on the others.
//
// Most sizes are affine in the micro-batch B (a [B, k] tensor of 4-byte elements is 4kB bytes; at
// the two largest recorded sizes, multiples of 128 in practice, that is a whole number of 512-B
// units, so the line through them has no rounding error). Not all: a buffer capped in samples bends.
// The CPU convolution's im2col scratch holds min(B, c) samples (c = 41 for the CNN's first layer,
// 18 for its second), so it is constant at 128 and 256 and the line through them over-predicted
// every micro-batch below c (+121% peak at B = 1). Hence a size is modelled as piecewise affine:
// record_micro_batch also records small / 2, small / 4, ..., 1; the top piece is the line through
// the two largest sizes, extended down while it reproduces the recorded size (after rounding to
// 512 B; within one 512-B unit, since a line through rounded sizes may be off by that); where it
// stops, a new piece starts, the widest line through recorded sizes below that reproduces all
// between. Between two pieces lies a bend at an unrecorded size; refinement_sizes() asks for the
// midpoints of such gaps and record_micro_batch records them until each bend sits between two
// adjacent sizes (a handful of recordings, all smaller than `small`). A size still in a gap (too
// many bends) is predicted as the larger of its two neighbouring pieces: over, never under. Not
// seen: a bend above the largest recorded size or between the two largest (the top piece is their
// line), so a buffer capped above 256 samples is over-predicted there.
//
// A path the engine takes only up to some size changes the sequence itself: on CUDA the seed MLP
// runs the fused op up to 64 samples and the generic ops above (models::SeedMLP::fuses). The
// recordings that do not match the two largest then form a regime of their own, fitted the same
// way on its recordings (recursively: a third sequence further down would be a third regime), and
// predict(B) takes the regime whose recorded sizes reach B; between the top regime's smallest size
// and the regime below's largest, where the switch lies unseen, the larger of the two predictions.
//
// predict(B) builds the sequence for B and replays it through a real CachingAllocator whose backend
// hands out distinct fake addresses and never memory. The allocator only does arithmetic and
// comparisons on block pointers (it splits a block at ptr + size and orders free blocks by address);
// it never reads or writes through them, so nothing is touched. The replay starts from the state at
// rest, its segments rebuilt block by block (Note [Replaying the state at rest]; from the
// two-recording entry point, which has no blocks, one block per category), plus the fixed blocks the
// caller adds (the optimizer state a training step holds). Predicted reserved = the real reserved
// at rest + what the replay reserves above its own rest.
#include "engine/plan/prediction.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "cumulus/core/error.h"

namespace cumulus::plan {

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
    // Frees first: a recategorized block (Allocation::recategorize) changes two categories at once,
    // and replayed as a free then an allocation it is never held twice.
    for (const bool freed : {true, false})
      for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
        const int64_t d = stats.by_category[c].current - last_[c];
        if (d == 0 || (d < 0) != freed) continue;
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

// Note [Replaying the state at rest]
// What a micro-batch reserves depends on the room the cache has at rest: the tail of the small
// segment that holds the batch-norm buffers, a free block left in a large segment by an earlier
// model. So the replay rebuilds the segments as live_blocks() reports them, in order. A large
// segment is made by allocating its whole size and freeing it (the only free large block then, as
// everything placed before is still held); blocks are then placed in address order, each hole
// before a block and each small segment's tail taken by a filler, so no later block lands in them;
// the fillers are freed last and coalesce into the holes the real cache has. A hole of at most
// 1 MiB in a large segment cannot be made (such a request goes to the small pool) and is closed
// up; it serves no request either way (large requests exceed 1 MiB), it only shifts what follows.
void replay_layout(CachingAllocator& replay, const std::vector<LiveBlock>& blocks, std::vector<Allocation>& held) {
  constexpr int64_t kSmallRequest = static_cast<int64_t>(CachingAllocator::kSmallRequest);
  std::vector<Allocation> fillers;
  auto fill = [&](int64_t bytes, bool small) {
    if (!small) {
      if (bytes > kSmallRequest)
        fillers.push_back(replay.allocate(static_cast<std::size_t>(bytes), MemoryCategory::other));
      return;
    }
    for (; bytes > 0; bytes -= kSmallRequest)
      fillers.push_back(
          replay.allocate(static_cast<std::size_t>(std::min(bytes, kSmallRequest)), MemoryCategory::other));
  };
  for (std::size_t i = 0; i < blocks.size();) {
    const LiveBlock& first = blocks[i];
    if (!first.small) replay.allocate(static_cast<std::size_t>(first.segment_bytes), MemoryCategory::other).reset();
    int64_t pos = 0;
    for (; i < blocks.size() && blocks[i].segment == first.segment; ++i) {
      fill(blocks[i].offset - pos, first.small);
      held.push_back(replay.allocate(static_cast<std::size_t>(blocks[i].bytes), blocks[i].category));
      pos = blocks[i].offset + blocks[i].bytes;
    }
    fill(first.segment_bytes - pos, first.small);  // a large tail of at most 1 MiB went to the last block
  }
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

namespace {

// Whether `r` has the structure of the reference recording: the same events in kind and category,
// and every free (paired on the reference) returning a block of its size.
std::string mismatch(const std::vector<MemoryEvent>& r, const std::vector<MemoryEvent>& ref,
                     const std::vector<int64_t>& pair) {
  if (r.size() != ref.size())
    return std::to_string(r.size()) + " vs " + std::to_string(ref.size()) + " allocations and frees";
  for (std::size_t i = 0; i < r.size(); ++i) {
    if (r[i].category != ref[i].category || r[i].alloc != ref[i].alloc)
      return "event " + std::to_string(i) + " is a " + (r[i].alloc ? "alloc" : "free") + " of " +
             category_name(r[i].category) + " vs a " + (ref[i].alloc ? "alloc" : "free") + " of " +
             category_name(ref[i].category);
    if (!r[i].alloc && r[static_cast<std::size_t>(pair[i])].bytes != r[i].bytes)
      return "event " + std::to_string(i) + " frees a block of another size";
  }
  return {};
}

// The recordings sorted by micro-batch, largest first; each size positive and recorded once.
void sort_recordings(std::vector<MemoryRecording>& recs) {
  CUMULUS_CHECK(recs.size() >= 2, InvalidArgument, "MemoryPredictor: need recordings at two sizes at least, got ",
                recs.size());
  std::sort(recs.begin(), recs.end(),
            [](const MemoryRecording& a, const MemoryRecording& b) { return a.micro_batch > b.micro_batch; });
  for (std::size_t j = 0; j < recs.size(); ++j) {
    CUMULUS_CHECK(recs[j].micro_batch > 0, InvalidArgument, "MemoryPredictor: micro-batch sizes must be > 0, got ",
                  recs[j].micro_batch);
    CUMULUS_CHECK(j == 0 || recs[j].micro_batch != recs[j - 1].micro_batch, InvalidArgument,
                  "MemoryPredictor: micro-batch ", recs[j].micro_batch, " recorded twice");
  }
}

// The live blocks at rest (none: not given) add up to the bytes at rest, category by category.
void check_rest_blocks(const std::vector<LiveBlock>& blocks, const std::array<int64_t, kNumMemoryCategories>& rest) {
  if (blocks.empty()) return;
  std::array<int64_t, kNumMemoryCategories> sum{};
  for (const LiveBlock& b : blocks) sum[static_cast<std::size_t>(b.category)] += b.bytes;
  CUMULUS_CHECK(sum == rest, InvalidArgument,
                "MemoryPredictor: the live blocks at rest do not add up to the bytes at rest by category");
}

// pair[i] = the allocation that free i returns (latest first, by category and size), -1 for an
// allocation; or why the recording cannot be paired.
std::string pair_frees(const std::vector<MemoryEvent>& events, std::vector<int64_t>& pair) {
  pair.assign(events.size(), -1);
  std::map<std::pair<int, int64_t>, std::vector<int64_t>> live;
  for (std::size_t i = 0; i < events.size(); ++i) {
    auto& stack = live[{static_cast<int>(events[i].category), events[i].bytes}];
    if (events[i].alloc) {
      stack.push_back(static_cast<int64_t>(i));
      continue;
    }
    if (stack.empty())
      return "event " + std::to_string(i) + " frees " + std::to_string(events[i].bytes) + " B of " +
             category_name(events[i].category) + " that the micro-batch did not allocate";
    pair[i] = stack.back();
    stack.pop_back();
  }
  return {};
}

}  // namespace

MemoryPredictor MemoryPredictor::from_recordings(int64_t small, const std::vector<MemoryEvent>& se, int64_t large,
                                                 const std::vector<MemoryEvent>& le,
                                                 const std::array<int64_t, kNumMemoryCategories>& rest,
                                                 int64_t rest_reserved, std::vector<FixedBlock> extra_fixed) {
  CUMULUS_CHECK(0 < small && small < large, InvalidArgument, "MemoryPredictor: need 0 < small < large, got ", small,
                " and ", large);
  return from_recordings({MemoryRecording{small, se}, MemoryRecording{large, le}}, rest, rest_reserved,
                         std::move(extra_fixed));
}

MemoryPredictor MemoryPredictor::from_recordings(std::vector<MemoryRecording> recs,
                                                 const std::array<int64_t, kNumMemoryCategories>& rest,
                                                 int64_t rest_reserved, std::vector<FixedBlock> extra_fixed,
                                                 std::vector<LiveBlock> rest_blocks) {
  sort_recordings(recs);
  MemoryPredictor p;
  p.large_ = recs[0].micro_batch;
  p.small_ = recs[1].micro_batch;
  p.rest_ = rest;
  p.rest_reserved_ = rest_reserved;
  p.extra_fixed_ = std::move(extra_fixed);
  check_rest_blocks(rest_blocks, rest);
  p.rest_blocks_ = std::move(rest_blocks);
  auto fail = [&](std::string why) {
    p.ok_ = false;
    p.reason_ = "the recorded allocation sequences of micro-batches " + std::to_string(p.small_) + " and " +
                std::to_string(p.large_) + " do not match: " + why;
    return p;
  };
  const std::vector<MemoryEvent>& le = recs[0].events;
  const std::size_t n = le.size();  // events a micro-batch
  // Frees paired with allocations on the largest recording.
  if (std::string why = pair_frees(le, p.pair_); !why.empty()) return fail(why);
  if (std::string why = mismatch(recs[1].events, le, p.pair_); !why.empty())
    return fail(why + " at micro-batch " + std::to_string(p.small_));
  // The smaller recordings that match join the fit; those that do not may form the regime below.
  std::vector<const MemoryRecording*> used{&recs[0], &recs[1]};
  std::vector<MemoryRecording> others;
  for (std::size_t j = 2; j < recs.size(); ++j)
    if (mismatch(recs[j].events, le, p.pair_).empty()) used.push_back(&recs[j]);
    else others.push_back(recs[j]);
  if (others.size() >= 2) {
    MemoryPredictor below = from_recordings(others, rest, rest_reserved, p.extra_fixed_, p.rest_blocks_);
    if (below.ok()) p.below_ = std::make_shared<const MemoryPredictor>(std::move(below));
  }
  std::string dropped;
  if (!p.below_)
    for (const MemoryRecording& r : others) dropped += (dropped.empty() ? "" : ", ") + std::to_string(r.micro_batch);
  for (const MemoryRecording* r : used) p.sizes_.push_back(r->micro_batch);
  // Each allocation's bytes as a piecewise line in the micro-batch, over the matching recordings.
  p.alloc_.resize(n);
  p.category_.resize(n);
  p.pieces_.assign(n, {});
  const std::size_t m = used.size();
  std::vector<int64_t> v(m);
  for (std::size_t i = 0; i < n; ++i) {
    p.alloc_[i] = le[i].alloc;
    p.category_[i] = le[i].category;
    if (!le[i].alloc) continue;
    for (std::size_t j = 0; j < m; ++j) v[j] = used[j]->events[i].bytes;
    p.pieces_[i] = fit_pieces(p.sizes_, v);
  }
  p.ok_ = true;
  p.reason_ = std::to_string(n) + " allocations and frees per micro-batch, matched over micro-batches " +
              std::to_string(p.sizes_.back()) + " to " + std::to_string(p.large_) + " (" + std::to_string(m) +
              " sizes), " + std::to_string(p.piecewise_events()) + " of them piecewise in the micro-batch";
  if (p.below_) p.reason_ += "; below, a sequence of its own: " + p.below_->reason_;
  if (!dropped.empty()) p.reason_ += "; left out, not matching: micro-batch " + dropped;
  return p;
}

namespace {

// The recorded sizes s (largest first) and an allocation's bytes v at each.
struct SizedBytes {
  const std::vector<int64_t>& s;
  const std::vector<int64_t>& v;

  // The line through recorded sizes a and b, s[a] > s[b].
  AllocationPiece line(std::size_t a, std::size_t b) const {
    AllocationPiece q;
    q.hi = s[a];
    q.lo = s[b];
    q.slope = static_cast<double>(v[a] - v[b]) / static_cast<double>(s[a] - s[b]);
    q.intercept = static_cast<double>(v[b]) - q.slope * static_cast<double>(s[b]);
    return q;
  }
  // How far q misses size j's bytes; within one 512-B unit a line through sizes rounded up to 512 B
  // may miss by one (the note).
  int64_t miss(const AllocationPiece& q, std::size_t j) const {
    return std::abs(round_512(q.intercept + q.slope * static_cast<double>(s[j])) - v[j]);
  }
};

constexpr int64_t kUnit = static_cast<int64_t>(CachingAllocator::kRounding);

// A new piece from s[j] down: the widest line through s[j] and a smaller size that reproduces every
// size between; a single size when none does (constant there). last: the piece's smallest size.
AllocationPiece widest_piece_from(const SizedBytes& f, std::size_t j, std::size_t& last) {
  AllocationPiece q;
  q.hi = q.lo = f.s[j];
  q.intercept = static_cast<double>(f.v[j]);
  last = j;
  for (std::size_t k = f.s.size() - 1; k > j; --k) {
    const AllocationPiece c = f.line(j, k);
    bool all = true;
    for (std::size_t t = j + 1; t < k && all; ++t) all = f.miss(c, t) <= kUnit;
    if (all) {
      last = k;
      return c;
    }
  }
  return q;
}

// Of the lines through two of the sizes [j, last], the widest that reproduces all of them exactly,
// if any (it has no rounding error at the recorded sizes), spanning [j, last]; else q.
AllocationPiece exact_piece_within(const SizedBytes& f, std::size_t j, std::size_t last, const AllocationPiece& q) {
  for (std::size_t span = last - j; span >= 1; --span) {
    for (std::size_t a = j; a + span <= last; ++a) {
      AllocationPiece c = f.line(a, a + span);
      bool all = true;
      for (std::size_t t = j; t <= last && all; ++t) all = f.miss(c, t) == 0;
      if (all) {
        c.hi = f.s[j];
        c.lo = f.s[last];
        return c;
      }
    }
  }
  return q;
}

}  // namespace

std::vector<MemoryPredictor::Piece> MemoryPredictor::fit_pieces(const std::vector<int64_t>& s,
                                                                const std::vector<int64_t>& v) {
  const SizedBytes f{s, v};
  std::vector<Piece> out{f.line(0, 1)};
  std::size_t j = 2;
  while (j < s.size()) {
    if (f.miss(out.back(), j) <= kUnit) {
      out.back().lo = s[j++];
      continue;
    }
    std::size_t last = j;
    const Piece widest = widest_piece_from(f, j, last);
    out.push_back(exact_piece_within(f, j, last, widest));
    j = last + 1;
  }
  return out;
}

std::size_t MemoryPredictor::piecewise_events() const {
  std::size_t k = 0;
  for (const auto& ps : pieces_) k += ps.size() > 1 ? 1 : 0;
  return k;
}

std::vector<int64_t> MemoryPredictor::refinement_sizes() const {
  std::set<int64_t> out;
  for (const auto& ps : pieces_)
    for (std::size_t k = 1; k < ps.size(); ++k)
      if (ps[k - 1].lo - ps[k].hi > 1) out.insert((ps[k - 1].lo + ps[k].hi) / 2);
  if (below_)
    for (int64_t b : below_->refinement_sizes()) out.insert(b);
  return {out.begin(), out.end()};
}

int64_t MemoryPredictor::bytes_at(std::size_t i, int64_t b) const {
  const std::vector<Piece>& ps = pieces_[i];
  auto at = [b](const Piece& q) { return round_512(q.intercept + q.slope * static_cast<double>(b)); };
  for (std::size_t k = 0; k < ps.size(); ++k) {
    if (b < ps[k].lo) continue;
    if (k == 0 || b <= ps[k].hi) return at(ps[k]);
    return std::max(at(ps[k]), at(ps[k - 1]));  // in the gap above piece k: the bend is unknown
  }
  return at(ps.back());  // below the smallest recorded size
}

std::vector<MemoryEvent> MemoryPredictor::sequence(int64_t micro_batch) const {
  CUMULUS_CHECK(ok_, InvalidArgument, "MemoryPredictor: no prediction: ", reason_);
  CUMULUS_CHECK(micro_batch > 0, InvalidArgument, "MemoryPredictor: micro-batch must be > 0, got ", micro_batch);
  if (below_ && micro_batch <= below_->large_) return below_->sequence(micro_batch);
  std::vector<MemoryEvent> out;
  out.reserve(alloc_.size());
  std::vector<int64_t> bytes(alloc_.size(), 0);
  for (std::size_t i = 0; i < alloc_.size(); ++i) {
    bytes[i] = alloc_[i] ? bytes_at(i, micro_batch) : bytes[static_cast<std::size_t>(pair_[i])];
    if (bytes[i] > 0) out.push_back(MemoryEvent{category_[i], alloc_[i], bytes[i]});
  }
  return out;
}

PredictedMemory MemoryPredictor::predict(int64_t micro_batch) const {
  CUMULUS_CHECK(ok_, InvalidArgument, "MemoryPredictor: no prediction: ", reason_);
  CUMULUS_CHECK(micro_batch > 0, InvalidArgument, "MemoryPredictor: micro-batch must be > 0, got ", micro_batch);
  if (!below_ || micro_batch >= sizes_.back()) return replay(micro_batch);
  if (micro_batch <= below_->large_) return below_->predict(micro_batch);
  // Between the two regimes' recorded sizes the switch is not seen: the larger prediction.
  PredictedMemory lower = below_->predict(micro_batch), upper = replay(micro_batch);
  PredictedMemory& out = lower.peak_bytes > upper.peak_bytes ? lower : upper;
  out.reserved_bytes = std::max(lower.reserved_bytes, upper.reserved_bytes);
  return out;
}

PredictedMemory MemoryPredictor::replay(int64_t micro_batch) const {
  CachingAllocator replay(Device::cpu(), std::make_unique<FakeBackend>());
  std::vector<Allocation> held;  // the state at rest and the extra fixed blocks
  if (!rest_blocks_.empty()) {
    replay_layout(replay, rest_blocks_, held);
  } else {
    for (std::size_t c = 0; c < kNumMemoryCategories; ++c)
      if (rest_[c] > 0)
        held.push_back(replay.allocate(static_cast<std::size_t>(rest_[c]), static_cast<MemoryCategory>(c)));
  }
  const int64_t replay_rest_reserved = replay.stats().reserved;
  for (const FixedBlock& f : extra_fixed_)
    if (f.bytes > 0) held.push_back(replay.allocate(static_cast<std::size_t>(f.bytes), f.category));
  replay.reset_peak();

  std::vector<Allocation> blocks(alloc_.size());
  for (std::size_t i = 0; i < alloc_.size(); ++i) {
    if (alloc_[i]) {
      const int64_t b = bytes_at(i, micro_batch);
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
                                   int64_t small, int64_t large, std::vector<FixedBlock> extra_fixed, bool lift_limit) {
  CUMULUS_CHECK(0 < small && small < large, InvalidArgument, "record_micro_batch: need 0 < small < large, got ", small,
                " and ", large);
  const int64_t limit = alloc.memory_limit();
  struct RestoreLimit {
    CachingAllocator& a;
    int64_t limit;
    ~RestoreLimit() { a.set_memory_limit(limit); }
  } restore{alloc, limit};
  if (lift_limit) alloc.set_memory_limit(0);
  micro_batch(small);  // one-time allocations (workspaces, lazily made buffers) happen here
  alloc.empty_cache();
  const MemoryStats rest = alloc.stats();
  std::array<int64_t, kNumMemoryCategories> rest_bytes{};
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) rest_bytes[c] = rest.by_category[c].current;
  std::vector<MemoryRecording> recs;
  std::set<int64_t> recorded;
  auto record = [&](int64_t b) {
    recorded.insert(b);
    recs.push_back(MemoryRecording{b, record_allocations(alloc, [&] { micro_batch(b); })});
  };
  record(small);
  record(large);
  for (int64_t b = small / 2; b >= 1; b /= 2) record(b);
  const std::vector<LiveBlock> rest_blocks = alloc.live_blocks();
  MemoryPredictor p = MemoryPredictor::from_recordings(recs, rest_bytes, rest.reserved, extra_fixed, rest_blocks);
  // Pin the bends (Note [Memory prediction]): each round records the midpoints of the open gaps.
  for (int extra = 0; p.ok();) {
    bool more = false;
    for (int64_t b : p.refinement_sizes()) {
      if (extra >= kMaxRefinements || recorded.count(b) > 0) continue;
      record(b);
      ++extra;
      more = true;
    }
    if (!more) break;
    p = MemoryPredictor::from_recordings(recs, rest_bytes, rest.reserved, extra_fixed, rest_blocks);
  }
  alloc.empty_cache();
  return p;
}

}  // namespace cumulus::plan
