// The memory timeline as Chrome trace events (memory_trace_json; opens in Perfetto or
// chrome://tracing).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>

#include "cumulus/memory/report.h"
#include "report_internal.h"

namespace cumulus::memory {

using report_detail::ojson;

std::string memory_trace_json(MemoryTracker& tracker) {
  // Trace-event format: "C" counter events (one track per category, bytes), "X" complete events
  // for the phases. Timestamps in microseconds.
  ojson events = ojson::array();
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", 1},
                    {"args", {{"name", "cumulus " + tracker.device().describe()}}}});
  for (const TimelineSample& s : tracker.timeline()) {
    ojson args = ojson::object();
    for (std::size_t c = 0; c < kNumMemoryCategories; ++c)
      args[category_name(static_cast<MemoryCategory>(c))] = s.bytes[c];
    events.push_back({{"name", "memory (bytes)"}, {"ph", "C"}, {"pid", 1}, {"ts", s.ms * 1000.0}, {"args", args}});
  }
  for (const TimelineSlice& s : tracker.slices()) {
    ojson args = ojson::object();
    args["epoch"] = s.epoch + 1;
    args[s.name == "step" ? "step" : "index"] = s.index;
    if (s.communication_ms > 0.0) args["all_reduce_ms"] = s.communication_ms;  // data parallel
    events.push_back({{"name", s.name},
                      {"ph", "X"},
                      {"pid", 1},
                      {"tid", 1},
                      {"ts", s.start_ms * 1000.0},
                      {"dur", std::max(0.0, s.end_ms - s.start_ms) * 1000.0},
                      {"args", args}});
  }
  // Recomputations of checkpointed segments, nested inside their backward slice.
  for (const TimelineSlice& s : tracker.recompute_slices()) {
    ojson args = ojson::object();
    args["epoch"] = s.epoch + 1;
    args["index"] = s.index;
    args["recomputed_bytes"] = s.bytes;
    events.push_back({{"name", s.name},
                      {"ph", "X"},
                      {"pid", 1},
                      {"tid", 1},
                      {"ts", s.start_ms * 1000.0},
                      {"dur", std::max(0.0, s.end_ms - s.start_ms) * 1000.0},
                      {"args", args}});
  }
  ojson j;
  j["traceEvents"] = std::move(events);
  j["displayTimeUnit"] = "ms";
  return j.dump() + "\n";
}

}  // namespace cumulus::memory
