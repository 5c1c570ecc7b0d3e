// The CPU kernels' parallel_for (kernels/cpu/parallel.h): every chunk runs once, within its range,
// at any thread count and however the threads share the chunks (Note [Chunks stay on their
// thread]); a parallel_for inside a chunk runs serially.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "cumulus/core/threads.h"
#include "kernels/cpu/parallel.h"

namespace cumulus {
namespace {

struct ThreadsGuard {
  int before = cpu_threads();
  ~ThreadsGuard() { set_cpu_threads(before); }
};

TEST(ParallelFor, EveryIndexOnceAtAnyThreadCountAndChunking) {
  ThreadsGuard guard;
  for (int threads : {1, 2, 3, 5}) {
    set_cpu_threads(threads);
    for (int64_t n : {1, 2, 7, 64, 1001}) {
      for (int64_t grain : {1, 3, 64, 5000}) {
        std::vector<std::atomic<int>> seen(static_cast<std::size_t>(n));
        std::atomic<bool> misaligned{false};
        kernels::parallel_for(n, grain, [&](int64_t b, int64_t e) {
          if (b < 0 || e > n || b >= e || (e - b > grain && e - b != n)) misaligned = true;
          for (int64_t i = b; i < e; ++i) seen[static_cast<std::size_t>(i)].fetch_add(1);
        });
        EXPECT_FALSE(misaligned) << threads << " threads, n " << n << ", grain " << grain;
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(seen[static_cast<std::size_t>(i)].load(), 1)
              << "index " << i << ", " << threads << " threads, n " << n << ", grain " << grain;
      }
    }
  }
}

TEST(ParallelFor, TheCallerTakesAHelpersShareWhenItIsBusy) {
  ThreadsGuard guard;
  set_cpu_threads(2);
  // The helper's first chunk waits (at most 10 s) until every other chunk has run: the caller then
  // has run the rest of the helper's share (the second half) besides its own.
  constexpr int64_t n = 40;
  std::atomic<int64_t> done{0}, by_caller{0};
  std::atomic<bool> helper_waited{false};
  const std::thread::id caller = std::this_thread::get_id();
  kernels::parallel_for(n, 1, [&](int64_t, int64_t) {
    if (std::this_thread::get_id() == caller) {
      by_caller.fetch_add(1);
    } else if (!helper_waited.exchange(true)) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (done.load() < n - 1 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    }
    done.fetch_add(1);
  });
  EXPECT_EQ(done.load(), n);
  if (helper_waited) EXPECT_EQ(by_caller.load(), n - 1);  // else the caller ran them all
  else EXPECT_EQ(by_caller.load(), n);
}

TEST(ParallelFor, InsideAChunkItRunsSerially) {
  ThreadsGuard guard;
  set_cpu_threads(2);
  std::atomic<int> inner_calls{0}, whole_ranges{0};
  kernels::parallel_for(4, 1, [&](int64_t, int64_t) {
    kernels::parallel_for(100, 1, [&](int64_t b, int64_t e) {
      inner_calls.fetch_add(1);
      if (b == 0 && e == 100) whole_ranges.fetch_add(1);
    });
  });
  EXPECT_EQ(inner_calls.load(), 4);
  EXPECT_EQ(whole_ranges.load(), 4);
}

}  // namespace
}  // namespace cumulus
