// The planner's two fits, each a line in the micro-batch's size (units): its fallback's memory line
// through two probes' allocated peaks, and the time line through the timed probes (Note
// [Predicting time] in engine/plan/planner.cpp). Internal to the planner; tests check them here.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "cumulus/plan/planner.h"

namespace cumulus::plan {

// A line through the allocated peaks of two probes: memory that does not depend on the batch size
// and the peak's growth per unit (a sample, or whatever PlanRequest counts). plan_batch's fallback
// when recordings do not match.
struct MemoryCost {
  int64_t fixed_bytes = 0;
  double peak_bytes_per_unit = 0.0;
  int64_t predicted_peak(int64_t micro_batch) const {
    return fixed_bytes + static_cast<int64_t>(peak_bytes_per_unit * static_cast<double>(micro_batch) + 0.5);
  }
};

// Derives the cost from two probed micro-batches of sizes small < large and their peaks.
MemoryCost memory_cost_from_probes(int64_t small, int64_t small_peak, int64_t large, int64_t large_peak);

// Least squares through (units, seconds) pairs, relative residuals: the median per size first,
// so one slow repetition moves nothing. One size gives a line through the origin; the slope and
// the fixed part are kept >= 0.
TimeFit fit_time(const std::vector<std::pair<int64_t, double>>& timings);

}  // namespace cumulus::plan
