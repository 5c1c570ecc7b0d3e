// Note [CPU kernel threads] in kernels/cpu/parallel.h.
#include "kernels/cpu/parallel.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace cumulus::kernels {

namespace {

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
      chunks_ = chunks;
      next_.store(0);
      open_ = true;
      ++generation_;
    }
    wake_.notify_all();
    work();
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
      while (static_cast<int>(threads_.size()) < n) threads_.emplace_back([this] { serve(); });
    } catch (const std::system_error&) {
    }
    return !threads_.empty();
  }

  void work() {
    t_in_chunk = true;
    for (int64_t c; (c = next_.fetch_add(1)) < chunks_;) (*chunk_)(c);
    t_in_chunk = false;
  }

  void serve() {
    uint64_t seen = 0;
    for (;;) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      if (!open_) continue;
      active_.fetch_add(1);
      lock.unlock();
      work();
      active_.fetch_sub(1, std::memory_order_release);
    }
  }

  std::mutex job_mutex_;  // held by the call using the helpers
  std::mutex mutex_;      // guards generation_, open_ and the job's fields as a helper joins
  std::condition_variable wake_;
  uint64_t generation_ = 0;
  bool open_ = false;
  const std::function<void(int64_t)>* chunk_ = nullptr;
  int64_t chunks_ = 0;
  std::atomic<int64_t> next_{0};
  std::atomic<int> active_{0};  // helpers inside the current job
  std::vector<std::thread> threads_;
};

}  // namespace

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int helpers = openblas_get_num_threads() - 1;  // cpu_threads(), which kernels/ may not include
  const int64_t chunks = (n + grain - 1) / grain;
  if (helpers < 1 || chunks < 2) return fn(0, n);
  const std::function<void(int64_t)> chunk = [&](int64_t c) { fn(c * grain, std::min(n, (c + 1) * grain)); };
  if (!HelperPool::instance().run(chunks, std::min<int64_t>(helpers, chunks - 1), chunk)) fn(0, n);
}

}  // namespace cumulus::kernels
