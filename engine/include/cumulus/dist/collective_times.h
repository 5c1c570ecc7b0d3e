// What the ranks' collectives cost, measured on the communicator that will train (Note [Collective
// time model] in engine/dist/collective_times.cpp), for the planner's predicted time (PlanRequest::
// collective_times: Note [Predicting time] in engine/plan/planner.cpp).
//
//   const dist::CollectiveTimes times = dist::measure_collective_times(*comm, flat, 1 << 20);  // every rank
//   if (comm->is_root()) { request.collective_times = times; plan::plan_batch(request); }
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cumulus/core/device.h"
#include "cumulus/dist/communicator.h"
#include "cumulus/nn/flat_parameters.h"

namespace cumulus::dist {

// One collective's seconds as a line in the bytes of the f32 array it is called on (the whole
// array, also for all_gather and reduce_scatter_sum, whose ranks each own a shard of it).
struct CollectiveLine {
  double latency_seconds = 0.0;
  double seconds_per_byte = 0.0;
  double predict(int64_t bytes) const {
    return bytes > 0 ? latency_seconds + seconds_per_byte * static_cast<double>(bytes) : 0.0;
  }
};

// The three collectives a data-parallel step makes, fitted over one world. world_size 1: nothing
// was measured (a world of one, or a rank alone), and every line is 0.
struct CollectiveTimes {
  int world_size = 1;
  CollectiveLine all_reduce;      // all_reduce_sum: the gradient's buckets (ZeRO 0 and 1), the step's sums
  CollectiveLine reduce_scatter;  // reduce_scatter_sum: each backward's buckets (ZeRO 2)
  CollectiveLine all_gather;      // all_gather: the updated weights (ZeRO 1 and 2)
  int sizes = 0;                  // the array sizes each line was fitted over
  // "all-reduce 31.2 us + 0.52 ms/MiB, reduce-scatter ..., all-gather ... (2 ranks, 5 sizes)".
  std::string text() const;
};

// The sizes (bytes) to measure at: 1 KiB (the latency), a quarter bucket, a bucket, their
// geometric middle with the whole gradient, and the whole gradient; multiples of 256 bytes (whole
// 64-element shards), ascending, without repeats.
std::vector<int64_t> collective_probe_sizes(int64_t bucket_bytes, int64_t gradient_bytes);

// A line through (bytes, seconds) points by least squares on relative residuals; latency and
// slope >= 0 (a negative latency refits through the origin).
CollectiveLine fit_collective_line(const std::vector<std::pair<int64_t, double>>& points);

// A collective: every rank of `comm` calls it with the same sizes and repeats, arrays on `device`.
// Times all_reduce_sum, reduce_scatter_sum and all_gather at each size `repeats` times (after one
// untimed call), each call started together behind a barrier and waited for, and fits each kind's
// line through the per-size medians averaged over the ranks, so every rank returns the same lines.
// The communicator's counters and spans are left as they were. A world of one, or a rank alone
// (Communicator::alone): nothing is measured, CollectiveTimes{}.
CollectiveTimes measure_collective_times(Communicator& comm, const std::vector<int64_t>& sizes_bytes, Device device,
                                         int repeats = 5);

// The probe a data-parallel run of `flat`'s parameters needs: the sizes of collective_probe_sizes
// for buckets of `bucket_bytes` and the whole gradient, on flat's device.
CollectiveTimes measure_collective_times(Communicator& comm, const nn::FlatParameters& flat, int64_t bucket_bytes);

}  // namespace cumulus::dist
