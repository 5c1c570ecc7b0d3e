// Shared by the memory reports (one file per output format: report_table.cpp, the terminal table;
// report_json.cpp, the JSON report; report_trace.cpp, the Chrome trace-event timeline;
// report_svg.cpp, the SVG plot). Internal to engine/memory; not installed.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>

#include "cumulus/memory/tracker.h"

namespace cumulus::memory::report_detail {

// Ordered: the report reads top-down (summary before the long record lists), so keys keep the
// order they are written in.
using ojson = nlohmann::ordered_json;

// Activation checkpointing over the kept records (Note [Recompute] in
// engine/autograd/checkpoint.cpp): the micro-batches that recomputed, their largest activation
// footprint at the micro-batch size with and without recompute, and the time it cost.
struct RecomputeSummary {
  int64_t micro_batches = 0;            // records that recomputed at least one segment
  int64_t segments = 0;                 // most segments one micro-batch recomputed
  int64_t activation_bytes = 0;         // at the end of forward, at micro_batch_size (the largest)
  int64_t stored_activation_bytes = 0;  // the same micro-batch's footprint without recompute
  int64_t recomputed_bytes = 0;         // what its recomputations held, summed
  // Totals over the records that recomputed.
  double recompute_ms = 0.0, backward_ms = 0.0;
};

inline RecomputeSummary summarize_recompute(MemoryTracker& tracker, int64_t micro_batch_size) {
  RecomputeSummary rs;
  for (const MicroBatchRecord& r : tracker.micro_batches()) {
    if (r.recompute_segments == 0) continue;
    rs.micro_batches += 1;
    rs.segments = std::max(rs.segments, r.recompute_segments);
    rs.recompute_ms += r.recompute_ms;
    rs.backward_ms += r.backward_ms;
    if (r.units == micro_batch_size && r.activation_bytes >= rs.activation_bytes) {
      rs.activation_bytes = r.activation_bytes;
      rs.stored_activation_bytes = r.activation_bytes + r.recompute_avoided_bytes;
      rs.recomputed_bytes = r.recomputed_bytes;
    }
  }
  return rs;
}

}  // namespace cumulus::memory::report_detail
