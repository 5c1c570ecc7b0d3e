// Note [CPU kernel threads]
// The CPU kernels split their work across cpu_threads() threads (set_cpu_threads): the calling
// thread and up to cpu_threads() - 1 helper threads, started on first use and kept waiting between
// calls (spinning briefly, then asleep). The GEMMs run on the same threads (Note [One pool for the
// kernels and the BLAS], gemm.cpp). The work is cut into chunks, each thread first running a
// contiguous share of them (the caller the first), then claiming what is left of the others'
// (Note [Chunks stay on their thread], parallel.cpp), so a helper that is slow to wake (a busy
// machine) costs nothing but its share: the others take the chunks it has not. Each chunk
// computes its elements (or rows, or columns) as the serial loop does, so the results are the same
// bits at any thread count. One call at a time uses the helpers; a call that finds them busy (from
// another thread of the program, or from inside a chunk), or that cannot start one (an
// address-space limit), runs serially.
// Written here rather than taken from OpenMP: the OpenBLAS we link is its pthreads build, and an
// OpenMP runtime beside it would keep a second pool of spinning threads on the same cores (OpenBLAS
// advises its OpenMP build for OpenMP programs); these loops need only counters and a wake-up.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>

namespace cumulus::kernels {

// Calls fn(begin, end) over [0, n) in chunks of `grain` (the last may be shorter) on up to
// cpu_threads() threads, or once with the whole [0, n) when it runs serially: fn takes any range.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// The threads parallel_for runs on (core/threads.cpp sets them with set_cpu_threads), and whether a
// GEMM splits its output across them, OpenBLAS running one thread per call (true), or runs on
// OpenBLAS's own threads (false: under an address-space limit, Note [OpenBLAS under an
// address-space limit] in core/threads.cpp).
void set_kernel_threads(int n, bool gemm_splits);
int kernel_threads();
bool gemm_splits();

// The chunk of elementwise work worth handing to another thread: about 30 microseconds of an
// activation's arithmetic.
inline constexpr int64_t kParallelGrain = 8192;

// Items (rows, planes, channels, samples) per chunk when each holds `elements` of that work: at
// least one.
inline int64_t grain_for(int64_t elements) {
  return std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(elements, 1));
}

}  // namespace cumulus::kernels
