// Note [Caching allocator]
// Requests are rounded up to 512 B. Requests up to 1 MiB are served from 2 MiB segments shared
// by many blocks (the small pool); larger ones get a segment of their own, rounded to 2 MiB (the
// large pool). A free block is found best-fit (smallest size >= request, then lowest address) and
// split when the remainder is worth keeping (>= 512 B in the small pool, > 1 MiB in the large one,
// so big blocks are not cut into slivers). Freed blocks coalesce with free neighbours of the same
// segment. In the steady state of a training loop every request is met from the cache: no
// cudaMalloc/cudaFree, no synchronization. All work of a device is on one stream, so a block freed
// on the host may be handed out again at once: the next use is queued after the last.
//
// When the backend fails (or the memory limit would be passed), the wholly free segments are
// returned to the backend and the request is tried once more; then OutOfMemory is thrown with the
// request, the op that asked, the device and the usage by category and by op; the same facts are
// kept as an OutOfMemoryRecord for the memory report. The allocator stays consistent and usable.
// Each live block notes the op that allocated it (a pointer to the name OpScope set, no string
// built), so live bytes by op cost nothing until a failure walks the segments.
//
// Note [Graph pool]
// A CUDA graph replays the addresses it was captured with, and nothing tells the allocator when a
// replay runs. So the blocks a capture allocates (its activations and scratch, freed on the host
// as the capture goes) must not be handed to anyone else while the graph lives: an eager tensor
// placed there and held across a replay would be overwritten by it. Captures therefore allocate
// from a second set of free lists, the graph pool, whose segments serve nothing else. All of a
// device's work, replays included, runs in order on one stream, and a graph writes each of its
// temporaries before reading it within one replay, so every graph of the device may share the one
// pool (a capture reuses what an earlier capture freed). Segments of the pool are never returned
// to the backend while a graph holds it; when the last graph is destroyed they become ordinary
// cache. Categories count the same in both pools, so the memory report adds up either way; the
// pool's segments are reported as graph_pool_reserved.
#include "cumulus/memory/allocator.h"

#include <algorithm>
#include <mutex>
#include <set>
#include <sstream>
#include <vector>

#include "cumulus/core/error.h"

namespace cumulus {

struct CachingAllocator::Block {
  char* ptr = nullptr;
  std::size_t size = 0;       // bytes this block spans in its segment
  std::size_t requested = 0;  // while allocated: the rounded request, what the stats count
  bool allocated = false;
  bool small = false;
  int pool = 0;  // kGeneralPool or kGraphPool, the same for every block of a segment
  MemoryCategory category = MemoryCategory::other;
  bool op_backward = false;
  const char* op = nullptr;  // while allocated: the OpScope name current then (nullptr: no op)
  Block* prev = nullptr;     // neighbours within the same segment
  Block* next = nullptr;
};

struct CachingAllocator::Pools {
  // Best fit: smallest block first, then lowest address.
  struct BySize {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
    }
  };
  using FreeList = std::set<Block*, BySize>;
  mutable std::mutex mutex;
  FreeList free[2][2];           // [pool][small]
  std::vector<Block*> segments;  // first block of every segment held from the backend
  bool routing_to_graph_pool = false;
  int graph_pool_users = 0;
  FreeList& free_list(const Block* b) { return free[b->pool][b->small ? 1 : 0]; }
  MemoryStats stats;
  AllocationObserver* observer = nullptr;
  std::optional<OutOfMemoryRecord> last_oom;
};

namespace {
std::size_t round_up(std::size_t n, std::size_t m) { return (n + m - 1) / m * m; }
constexpr int kGeneralPool = 0;
constexpr int kGraphPool = 1;
}  // namespace

// ---- Allocation ------------------------------------------------------------------------------

Allocation& Allocation::operator=(Allocation&& o) noexcept {
  if (this != &o) {
    reset();
    ptr_ = o.ptr_;
    size_ = o.size_;
    category_ = o.category_;
    block_ = o.block_;
    owner_ = o.owner_;
    o.ptr_ = nullptr;
    o.size_ = 0;
    o.block_ = nullptr;
    o.owner_ = nullptr;
  }
  return *this;
}

void Allocation::reset() noexcept {
  if (owner_ != nullptr) owner_->release(block_);
  ptr_ = nullptr;
  size_ = 0;
  block_ = nullptr;
  owner_ = nullptr;
}

void Allocation::recategorize(MemoryCategory c) {
  if (owner_ == nullptr || c == category_) return;
  owner_->recategorize(block_, c);
  category_ = c;
}

// ---- CachingAllocator ------------------------------------------------------------------------

CachingAllocator::CachingAllocator(Device device, std::unique_ptr<MemoryBackend> backend)
    : device_(device), backend_(std::move(backend)), pools_(std::make_unique<Pools>()) {}

CachingAllocator::~CachingAllocator() {
  // Blocks still alive at exit (static tensors) are left to the OS; free the cached rest.
  std::lock_guard<std::mutex> lock(pools_->mutex);
  release_cached_segments_locked();
}

CachingAllocator::Block* CachingAllocator::allocate_segment_locked(std::size_t segment_bytes, bool small) {
  MemoryStats& st = pools_->stats;
  if (st.limit > 0 && st.reserved + static_cast<int64_t>(segment_bytes) > st.limit) return nullptr;
  void* p = backend_->raw_alloc(segment_bytes);
  if (p == nullptr) return nullptr;
  auto* b = new Block;
  b->ptr = static_cast<char*>(p);
  b->size = segment_bytes;
  b->small = small;
  b->pool = pools_->routing_to_graph_pool ? kGraphPool : kGeneralPool;
  pools_->segments.push_back(b);
  if (b->pool == kGraphPool) st.graph_pool_reserved += static_cast<int64_t>(segment_bytes);
  st.reserved += static_cast<int64_t>(segment_bytes);
  st.reserved_peak = std::max(st.reserved_peak, st.reserved);
  st.backend_allocs += 1;
  return b;
}

void CachingAllocator::release_cached_segments_locked() {
  // cudaFree synchronizes the device: never while a capture is recording.
  if (pools_->routing_to_graph_pool) return;
  auto& segs = pools_->segments;
  for (auto it = segs.begin(); it != segs.end();) {
    Block* b = *it;
    // A segment that is one free block; the graph pool's only once no graph holds it.
    const bool pinned = b->pool == kGraphPool && pools_->graph_pool_users > 0;
    if (!b->allocated && b->next == nullptr && !pinned) {
      pools_->free_list(b).erase(b);
      if (b->pool == kGraphPool) pools_->stats.graph_pool_reserved -= static_cast<int64_t>(b->size);
      backend_->raw_free(b->ptr);
      pools_->stats.reserved -= static_cast<int64_t>(b->size);
      pools_->stats.backend_frees += 1;
      delete b;
      it = segs.erase(it);
    } else {
      ++it;
    }
  }
}

namespace {

// One op's live bytes: name's pointer and direction, as blocks record them.
struct LiveByOpKey {
  const char* name;
  bool backward;
  int64_t bytes;
};

// The keys' bytes by label, largest first (equal names from different literals merge here).
std::vector<std::pair<std::string, int64_t>> label_live_bytes(const std::vector<LiveByOpKey>& keys) {
  std::vector<std::pair<std::string, int64_t>> by_op;
  for (const LiveByOpKey& k : keys) {
    std::string label = op_label(k.name, k.backward);
    auto it = std::find_if(by_op.begin(), by_op.end(), [&](const auto& e) { return e.first == label; });
    if (it == by_op.end()) by_op.emplace_back(std::move(label), k.bytes);
    else it->second += k.bytes;
  }
  std::stable_sort(by_op.begin(), by_op.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return by_op;
}

// The exception's one line: the request, the limit, what is reserved and allocated by category, and
// the three ops holding the most.
std::string oom_message(const Device& device, const OutOfMemoryRecord& r, const MemoryStats& st) {
  std::ostringstream os;
  os << "out of memory on " << device.str() << ": tried to allocate " << format_bytes(r.requested_bytes) << " ("
     << category_name(r.category) << ") in " << r.op;
  if (st.limit > 0) os << "; memory limit " << format_bytes(st.limit);
  os << "; reserved " << format_bytes(st.reserved) << ", allocated " << format_bytes(st.allocated) << " [";
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
    os << (c ? ", " : "") << category_name(static_cast<MemoryCategory>(c)) << " "
       << format_bytes(st.by_category[c].current);
  }
  os << "]";
  if (!r.live_by_op.empty()) {
    os << "; largest live by op:";
    for (std::size_t i = 0; i < r.live_by_op.size() && i < 3; ++i)
      os << (i ? ", " : " ") << r.live_by_op[i].first << " " << format_bytes(r.live_by_op[i].second);
  }
  return os.str();
}

// Stats count the rounded request, not the block: an unsplit tail (< 1 MiB of a large segment) is
// cache, not usage, so parameter bytes equal the model's sizes up to the 512-B rounding.
void count_allocation(MemoryStats& st, MemoryCategory category, std::size_t size) {
  auto& cs = st.by_category[static_cast<std::size_t>(category)];
  cs.current += static_cast<int64_t>(size);
  cs.peak = std::max(cs.peak, cs.current);
  cs.allocs += 1;
  st.allocated += static_cast<int64_t>(size);
  if (st.allocated > st.allocated_peak) {
    st.allocated_peak = st.allocated;
    for (std::size_t c = 0; c < kNumMemoryCategories; ++c) st.at_peak[c] = st.by_category[c].current;
  }
}

}  // namespace

void CachingAllocator::throw_oom_locked(std::size_t bytes, std::size_t segment_bytes, MemoryCategory category) {
  MemoryStats& st = pools_->stats;
  st.oom_count += 1;
  const CurrentOp asking = current_op();
  OutOfMemoryRecord r;
  r.sequence = st.oom_count;
  r.requested_bytes = static_cast<int64_t>(bytes);
  r.rounded_bytes = static_cast<int64_t>(round_up(bytes, kRounding));
  r.segment_bytes = static_cast<int64_t>(segment_bytes);
  r.category = category;
  r.op = op_label(asking.name, asking.backward);
  r.limit = st.limit;
  r.reserved = st.reserved;
  r.allocated = st.allocated;
  r.peak_bytes = st.allocated_peak;
  r.reserved_peak = st.reserved_peak;
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) r.live_by_category[c] = st.by_category[c].current;
  // Live bytes by op: one walk over every block (only on failure).
  std::vector<LiveByOpKey> keys;
  for (Block* seg : pools_->segments) {
    for (Block* b = seg; b; b = b->next) {
      if (!b->allocated) continue;
      auto it = std::find_if(keys.begin(), keys.end(),
                             [&](const LiveByOpKey& k) { return k.name == b->op && k.backward == b->op_backward; });
      if (it == keys.end()) keys.push_back({b->op, b->op_backward, static_cast<int64_t>(b->requested)});
      else it->bytes += static_cast<int64_t>(b->requested);
    }
  }
  r.live_by_op = label_live_bytes(keys);
  std::string message = oom_message(device_, r, st);
  pools_->last_oom = std::move(r);
  throw OutOfMemory(message);
}

Allocation CachingAllocator::allocate(std::size_t bytes, MemoryCategory category) {
  Allocation out;
  if (bytes == 0) return out;
  const std::size_t size = round_up(bytes, kRounding);
  const bool small = size <= kSmallRequest;

  std::lock_guard<std::mutex> lock(pools_->mutex);
  auto& pool = pools_->free[pools_->routing_to_graph_pool ? kGraphPool : kGeneralPool][small ? 1 : 0];
  Block key;
  key.size = size;
  auto it = pool.lower_bound(&key);
  Block* block = nullptr;
  if (it != pool.end()) {
    block = *it;
    pool.erase(it);
  } else {
    const std::size_t seg = small ? kSmallSegment : round_up(size, kLargeSegmentRounding);
    block = allocate_segment_locked(seg, small);
    if (block == nullptr) {
      release_cached_segments_locked();
      block = allocate_segment_locked(seg, small);
    }
    if (block == nullptr) throw_oom_locked(bytes, seg, category);
  }

  const std::size_t remainder = block->size - size;
  const bool split = small ? remainder >= kRounding : remainder > kSmallRequest;
  if (split) {
    auto* rest = new Block;
    rest->ptr = block->ptr + size;
    rest->size = remainder;
    rest->small = small;
    rest->pool = block->pool;
    rest->prev = block;
    rest->next = block->next;
    if (block->next) block->next->prev = rest;
    block->next = rest;
    block->size = size;
    pool.insert(rest);
  }
  block->allocated = true;
  block->requested = size;
  block->category = category;
  const CurrentOp op = current_op();
  block->op = op.name;
  block->op_backward = op.backward;

  MemoryStats& st = pools_->stats;
  count_allocation(st, category, size);

  if (pools_->observer) pools_->observer->on_change(st);
  out.ptr_ = block->ptr;
  out.size_ = size;
  out.category_ = category;
  out.block_ = block;
  out.owner_ = this;
  return out;
}

void CachingAllocator::release(void* opaque) noexcept {
  auto* block = static_cast<Block*>(opaque);
  std::lock_guard<std::mutex> lock(pools_->mutex);
  MemoryStats& st = pools_->stats;
  auto& cs = st.by_category[static_cast<std::size_t>(block->category)];
  cs.current -= static_cast<int64_t>(block->requested);
  cs.frees += 1;
  st.allocated -= static_cast<int64_t>(block->requested);
  block->allocated = false;

  auto& pool = pools_->free_list(block);
  // Coalesce with free neighbours; the segment's first block keeps its identity (segments list).
  if (Block* n = block->next; n && !n->allocated) {
    pool.erase(n);
    block->size += n->size;
    block->next = n->next;
    if (n->next) n->next->prev = block;
    delete n;
  }
  if (Block* p = block->prev; p && !p->allocated) {
    pool.erase(p);
    p->size += block->size;
    p->next = block->next;
    if (block->next) block->next->prev = p;
    delete block;
    block = p;
  }
  pool.insert(block);
  if (pools_->observer) pools_->observer->on_change(st);
}

void CachingAllocator::recategorize(void* opaque, MemoryCategory category) {
  auto* block = static_cast<Block*>(opaque);
  std::lock_guard<std::mutex> lock(pools_->mutex);
  MemoryStats& st = pools_->stats;
  const auto bytes = static_cast<int64_t>(block->requested);
  auto& from = st.by_category[static_cast<std::size_t>(block->category)];
  from.current -= bytes;
  from.frees += 1;
  auto& to = st.by_category[static_cast<std::size_t>(category)];
  to.current += bytes;
  to.peak = std::max(to.peak, to.current);
  to.allocs += 1;
  block->category = category;
  if (pools_->observer) pools_->observer->on_change(st);
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(pools_->mutex);
  return pools_->stats;
}

std::vector<LiveBlock> CachingAllocator::live_blocks() const {
  std::lock_guard<std::mutex> lock(pools_->mutex);
  std::vector<LiveBlock> out;
  const auto& segs = pools_->segments;
  for (std::size_t i = 0; i < segs.size(); ++i) {
    int64_t seg_bytes = 0;
    for (const Block* b = segs[i]; b != nullptr; b = b->next) seg_bytes += static_cast<int64_t>(b->size);
    for (const Block* b = segs[i]; b != nullptr; b = b->next)
      if (b->allocated)
        out.push_back(LiveBlock{static_cast<int64_t>(b->requested), b->category, b->small, static_cast<int64_t>(i),
                                static_cast<int64_t>(b->ptr - segs[i]->ptr), seg_bytes});
  }
  return out;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(pools_->mutex);
  MemoryStats& st = pools_->stats;
  for (auto& c : st.by_category) c.peak = c.current;
  st.allocated_peak = st.allocated;
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) st.at_peak[c] = st.by_category[c].current;
  st.reserved_peak = st.reserved;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(pools_->mutex);
  release_cached_segments_locked();
}

void CachingAllocator::set_memory_limit(int64_t bytes) {
  CUMULUS_CHECK(bytes >= 0, InvalidArgument, "set_memory_limit: negative limit ", bytes);
  std::lock_guard<std::mutex> lock(pools_->mutex);
  pools_->stats.limit = bytes;
}

void CachingAllocator::set_observer(AllocationObserver* observer) {
  std::lock_guard<std::mutex> lock(pools_->mutex);
  pools_->observer = observer;
}

void CachingAllocator::begin_graph_pool_routing() {
  std::lock_guard<std::mutex> lock(pools_->mutex);
  CUMULUS_CHECK(!pools_->routing_to_graph_pool, InvalidArgument, "graph pool routing is already on for ", device_.str(),
                " (nested graph captures are not supported)");
  pools_->routing_to_graph_pool = true;
}

void CachingAllocator::end_graph_pool_routing() {
  std::lock_guard<std::mutex> lock(pools_->mutex);
  pools_->routing_to_graph_pool = false;
}

void CachingAllocator::acquire_graph_pool() {
  std::lock_guard<std::mutex> lock(pools_->mutex);
  pools_->graph_pool_users += 1;
}

void CachingAllocator::release_graph_pool() noexcept {
  std::lock_guard<std::mutex> lock(pools_->mutex);
  if (--pools_->graph_pool_users > 0 || pools_->routing_to_graph_pool) return;
  // The last graph is gone: the pool's segments become ordinary cache (live blocks in them, such
  // as optimizer state first allocated during a capture, stay where they are).
  for (Block* seg : pools_->segments) {
    if (seg->pool != kGraphPool) continue;
    pools_->stats.graph_pool_reserved -= static_cast<int64_t>([&] {
      std::size_t n = 0;
      for (Block* b = seg; b; b = b->next) n += b->size;
      return n;
    }());
    for (Block* b = seg; b; b = b->next) {
      const bool was_free = !b->allocated;
      if (was_free) pools_->free_list(b).erase(b);
      b->pool = kGeneralPool;
      if (was_free) pools_->free_list(b).insert(b);
    }
  }
}

std::optional<OutOfMemoryRecord> CachingAllocator::last_out_of_memory() const {
  std::lock_guard<std::mutex> lock(pools_->mutex);
  return pools_->last_oom;
}

int64_t CachingAllocator::memory_limit() const {
  std::lock_guard<std::mutex> lock(pools_->mutex);
  return pools_->stats.limit;
}

}  // namespace cumulus
