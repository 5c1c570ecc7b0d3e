// Note [CPU kernel threads] in kernels/cpu/parallel.h.
#include "kernels/cpu/parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace cumulus::kernels {

namespace {

std::atomic<int> g_threads{1};
std::atomic<bool> g_gemm_splits{false};

// Whether this thread is running a chunk: a parallel_for inside one runs serially (the job's mutex
// is already held, by this thread or by the caller a helper works for).
thread_local bool t_in_chunk = false;

class HelperPool {
 public:
  // Never destroyed: a helper blocked in its wait would keep a destructor that joins it from
  // returning at exit; the process's end stops them.
  static HelperPool& instance() {
    static HelperPool* pool = new HelperPool();
    return *pool;
  }

  // Runs chunk(c) for c in [0, chunks) on the caller and up to `helpers` helpers; false (nothing run)
  // when another call holds the helpers or none could be started.
  bool run(int64_t chunks, int helpers, const std::function<void(int64_t)>& chunk) {
    if (t_in_chunk) return false;
    std::unique_lock<std::mutex> job(job_mutex_, std::try_to_lock);
    if (!job.owns_lock() || !start_helpers(helpers)) return false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      chunk_ = &chunk;
      helpers_ = helpers;
      shares_ = std::min<int>(helpers + 1, static_cast<int>(share_.size()));
      for (int s = 0; s < shares_; ++s) {
        share_[s].next.store(chunks * s / shares_, std::memory_order_relaxed);
        share_[s].end = chunks * (s + 1) / shares_;
      }
      open_ = true;
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    work(0);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      open_ = false;  // a helper that wakes from now on skips this job
    }
    while (active_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
    return true;
  }

 private:
  // Starts helpers up to n (at least one must exist to return true).
  bool start_helpers(int n) {
    try {
      while (static_cast<int>(threads_.size()) < n) {
        const int slot = static_cast<int>(threads_.size()) + 1;
        threads_.emplace_back([this, slot] { serve(slot); });
      }
    } catch (const std::system_error&) {
    }
    return !threads_.empty();
  }

  // Note [Chunks stay on their thread]
  // A job's chunks are cut into one contiguous share per thread (the caller's first, then helper
  // 1's, ...), and each thread runs its own share first, then takes what is left of the others'.
  // Consecutive ops that split the same rows alike then run each part on the same thread, so an
  // op reads what the one before wrote from its own core's caches rather than the other's (chunks
  // handed to whichever thread asks first alternate between them). A helper slow to wake still
  // costs only its share: the others take its chunks.
  void work(int slot) {
    t_in_chunk = true;
    for (int i = 0; i < shares_; ++i) {
      Share& share = share_[(slot + i) % shares_];
      for (int64_t c; (c = share.next.fetch_add(1, std::memory_order_relaxed)) < share.end;) (*chunk_)(c);
    }
    t_in_chunk = false;
  }

  // A helper spins this long for the next job before it sleeps: about the gap between two parallel
  // ops of a training step, so a step's ops find it awake (a wake-up through the kernel costs a
  // chunk's worth of time and two context switches). The spin costs only the helper's own core:
  // the GEMMs run on this same pool (Note [One pool for the kernels and the BLAS], gemm.cpp).
  static constexpr std::chrono::microseconds kSpin{100};

  void spin_for_job(uint64_t seen) const {
    const auto until = std::chrono::steady_clock::now() + kSpin;
    for (int i = 1; generation_.load(std::memory_order_acquire) == seen; ++i) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
      if (i % 64 == 0 && std::chrono::steady_clock::now() > until) return;
    }
  }

  void serve(int slot) {
    uint64_t seen = 0;
    for (;;) {
      spin_for_job(seen);
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load() != seen; });
      seen = generation_.load();
      if (!open_ || slot > helpers_) continue;  // a job of fewer threads than have started
      active_.fetch_add(1);
      lock.unlock();
      work(slot);
      active_.fetch_sub(1, std::memory_order_release);
    }
  }

  std::mutex job_mutex_;  // held by the call using the helpers
  std::mutex mutex_;      // guards open_ and the job's fields as a helper joins; generation_'s changes
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};  // read unlocked by a spinning helper
  bool open_ = false;
  const std::function<void(int64_t)>* chunk_ = nullptr;
  static constexpr int kMaxShares = 1024;  // the apps' --threads at most; more threads take others' shares
  // Each thread's contiguous share of the job's chunks (Note [Chunks stay on their thread]).
  struct alignas(64) Share {
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };
  std::vector<Share> share_ = std::vector<Share>(kMaxShares);
  int shares_ = 0;
  int helpers_ = 0;             // the helpers the job asked for: slots 1..helpers_ join it
  std::atomic<int> active_{0};  // helpers inside the current job
  std::vector<std::thread> threads_;
};

}  // namespace

void set_kernel_threads(int n, bool gemm_splits) {
  g_threads.store(std::max(1, n));
  g_gemm_splits.store(gemm_splits);
}

int kernel_threads() { return g_threads.load(); }

bool gemm_splits() { return g_gemm_splits.load(); }

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int helpers = g_threads.load(std::memory_order_relaxed) - 1;
  const int64_t chunks = (n + grain - 1) / grain;
  if (helpers < 1 || chunks < 2) return fn(0, n);
  const std::function<void(int64_t)> chunk = [&](int64_t c) { fn(c * grain, std::min(n, (c + 1) * grain)); };
  if (!HelperPool::instance().run(chunks, std::min<int64_t>(helpers, chunks - 1), chunk)) fn(0, n);
}

}  // namespace cumulus::kernels
