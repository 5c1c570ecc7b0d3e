// Budgets and the micro-batch planner (docs/ARCHITECTURE.md, "Memory accounting"): predict before you run out.
#pragma once

#include <cstdint>
#include <string>

namespace cumulus {

// Parses a byte size: "1048576", "512KiB", "64MiB", "1.5GiB", "2GB" (KB/MB/GB are powers of 1000,
// KiB/MiB/GiB of 1024; a space before the unit is allowed). Throws InvalidArgument naming the text.
int64_t parse_byte_size(const std::string& text);

// What one micro-batch costs, measured by a probe: memory that does not depend on the batch size
// (parameters, gradients, optimizer state, workspace, data) and the peak's growth per sample.
struct MemoryCost {
  int64_t fixed_bytes = 0;
  double peak_bytes_per_sample = 0.0;
  int64_t predicted_peak(int64_t micro_batch) const {
    return fixed_bytes + static_cast<int64_t>(peak_bytes_per_sample * static_cast<double>(micro_batch) + 0.5);
  }
};

// Derives the cost from two probed micro-batches of sizes small < large and their peaks.
MemoryCost memory_cost_from_probes(int64_t small, int64_t small_peak, int64_t large, int64_t large_peak);

struct MicroBatchPlan {
  int64_t micro_batch = 0;
  int accum_steps = 0;
  int64_t predicted_peak = 0;
  std::string reason;  // one or two sentences for the user
};

// The largest micro-batch (at most `max_micro_batch`, 0: no cap) that divides `effective_batch`
// and whose predicted peak stays within `budget` minus a safety margin (for allocator rounding and
// fragmentation), and the accumulation steps that make up the effective batch. Throws OutOfMemory
// if even a micro-batch of 1 does not fit.
MicroBatchPlan plan_micro_batch(int64_t budget, int64_t effective_batch, const MemoryCost& cost,
                                double safety_margin = 0.05, int64_t max_micro_batch = 0);

}  // namespace cumulus
