#include "cumulus/memory/planner.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "cumulus/core/error.h"
#include "cumulus/memory/category.h"

namespace cumulus {

int64_t parse_byte_size(const std::string& text) {
  const char* s = text.c_str();
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(s, &end);
  const bool number_ok = end != s && errno == 0 && std::isfinite(value) && value >= 0 && !std::isspace(static_cast<unsigned char>(*s));
  std::string unit(number_ok ? end : "");
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  double mult = 0;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "KiB") mult = 1024.0;
  else if (unit == "MiB") mult = 1024.0 * 1024;
  else if (unit == "GiB") mult = 1024.0 * 1024 * 1024;
  else if (unit == "TiB") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "KB" || unit == "kB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  else if (unit == "TB") mult = 1e12;
  const double bytes = value * mult;
  CUMULUS_CHECK(number_ok && mult > 0 && bytes < 9.0e18, InvalidArgument, "invalid size '", text,
                "' (expected a number of bytes with an optional unit: B, KiB, MiB, GiB, TiB, KB, MB, GB, TB; e.g. 64MiB, 1.5GiB)");
  CUMULUS_CHECK(mult > 1 || std::floor(value) == value, InvalidArgument, "invalid size '", text,
                "': a byte count must be a whole number");
  return static_cast<int64_t>(std::llround(bytes));
}

MemoryCost memory_cost_from_probes(int64_t small, int64_t small_peak, int64_t large, int64_t large_peak) {
  CUMULUS_CHECK(0 < small && small < large, InvalidArgument, "memory_cost_from_probes: need 0 < small < large, got ",
                small, " and ", large);
  MemoryCost c;
  c.peak_bytes_per_sample = std::max(0.0, static_cast<double>(large_peak - small_peak) / static_cast<double>(large - small));
  c.fixed_bytes = std::max<int64_t>(0, small_peak - static_cast<int64_t>(c.peak_bytes_per_sample * static_cast<double>(small)));
  return c;
}

MicroBatchPlan plan_micro_batch(int64_t budget, int64_t effective_batch, const MemoryCost& cost, double safety_margin,
                                int64_t max_micro_batch) {
  CUMULUS_CHECK(budget > 0, InvalidArgument, "planner: the memory budget must be > 0");
  CUMULUS_CHECK(effective_batch > 0, InvalidArgument, "planner: the effective batch must be > 0");
  CUMULUS_CHECK(safety_margin >= 0 && safety_margin < 1, InvalidArgument, "planner: safety margin in [0, 1)");
  const int64_t usable = static_cast<int64_t>(static_cast<double>(budget) * (1.0 - safety_margin));
  const int64_t start = max_micro_batch > 0 ? std::min(max_micro_batch, effective_batch) : effective_batch;
  for (int64_t b = start; b >= 1; --b) {
    if (effective_batch % b != 0) continue;
    const int64_t peak = cost.predicted_peak(b);
    if (peak > usable) continue;
    MicroBatchPlan plan;
    plan.micro_batch = b;
    plan.accum_steps = static_cast<int>(effective_batch / b);
    plan.predicted_peak = peak;
    plan.reason = "micro-batch " + std::to_string(b) + " x " + std::to_string(plan.accum_steps) +
                  " steps = effective batch " + std::to_string(effective_batch) + ": predicted peak " +
                  format_bytes(peak) + " (fixed " + format_bytes(cost.fixed_bytes) + " + " +
                  format_bytes(static_cast<int64_t>(cost.peak_bytes_per_sample)) + "/sample) within " +
                  format_bytes(usable) + " (budget " + format_bytes(budget) + " less " +
                  std::to_string(static_cast<int>(safety_margin * 100)) + "% margin)";
    if (b < start) {
      int64_t next = b + 1;
      while (next < start && effective_batch % next != 0) ++next;
      plan.reason += "; the next larger divisor, " + std::to_string(next) + ", would need " +
                     format_bytes(cost.predicted_peak(next));
    }
    return plan;
  }
  throw OutOfMemory("planner: even a micro-batch of 1 needs " + format_bytes(cost.predicted_peak(1)) +
                    " (fixed costs " + format_bytes(cost.fixed_bytes) + "), more than the usable " +
                    format_bytes(usable) + " of the budget " + format_bytes(budget));
}

}  // namespace cumulus
