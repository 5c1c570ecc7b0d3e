// The memory reports: a terminal table, JSON (the schema in the README), a Chrome trace-event
// timeline (opens in Perfetto or chrome://tracing) and an SVG plot of memory by category.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "cumulus/memory/tracker.h"

namespace cumulus {

namespace {

using nlohmann::json;

json by_category_json(const std::array<int64_t, kNumMemoryCategories>& bytes) {
  json j = json::object();
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) j[category_name(static_cast<MemoryCategory>(c))] = bytes[c];
  return j;
}

}  // namespace

void print_memory_table(MemoryTracker& tracker, std::FILE* out) {
  const MemorySummary s = tracker.summary();
  int64_t activations = 0;
  for (const auto& r : tracker.micro_batches())
    if (r.samples == s.micro_batch_size) activations = std::max(activations, r.activation_bytes);
  std::fprintf(out, "memory per micro-batch (%lld samples) on %s: activations %s (%s/sample), peak %s\n",
               static_cast<long long>(s.micro_batch_size), tracker.device().str().c_str(),
               format_bytes(activations).c_str(),
               format_bytes(static_cast<int64_t>(std::llround(s.activation_bytes_per_sample))).c_str(),
               format_bytes(s.peak_at_micro_batch).c_str());
  std::fprintf(out, "  parameters %s | gradients %s | optimizer state %s | workspace %s | data %s\n",
               format_bytes(s.parameters_bytes).c_str(), format_bytes(s.gradients_bytes).c_str(),
               format_bytes(s.optimizer_state_bytes).c_str(), format_bytes(s.workspace_bytes).c_str(),
               format_bytes(s.data_bytes).c_str());
  std::fprintf(out, "  run peak %s (reserved peak %s) | %lld x %d: peak %s vs one batch of %lld: %s (%s)\n",
               format_bytes(s.peak_bytes).c_str(), format_bytes(s.reserved_peak_bytes).c_str(),
               static_cast<long long>(s.micro_batch_size), s.accum_steps,
               format_bytes(s.peak_at_micro_batch).c_str(),
               static_cast<long long>(s.micro_batch_size * s.accum_steps),
               format_bytes(s.peak_at_effective_batch).c_str(),
               s.effective_batch_measured ? "measured" : "predicted");
}

std::string memory_report_json(MemoryTracker& tracker) {
  const MemorySummary s = tracker.summary();
  json j;
  j["device"] = tracker.device().str();
  j["model"] = tracker.options().model;
  j["micro_batch_size"] = s.micro_batch_size;
  j["accum_steps"] = s.accum_steps;
  if (!tracker.options().annotations.empty()) j["annotations"] = tracker.options().annotations;
  j["summary"] = {
      {"parameters_bytes", s.parameters_bytes},
      {"gradients_bytes", s.gradients_bytes},
      {"optimizer_state_bytes", s.optimizer_state_bytes},
      {"workspace_bytes", s.workspace_bytes},
      {"data_bytes", s.data_bytes},
      {"activation_bytes_per_sample", s.activation_bytes_per_sample},
      {"peak_bytes", s.peak_bytes},
      {"reserved_peak_bytes", s.reserved_peak_bytes},
      {"peak_at_micro_batch_bytes", s.peak_at_micro_batch},
      {"peak_at_effective_batch_bytes", s.peak_at_effective_batch},
      {"effective_batch_peak", s.effective_batch_measured ? "measured" : "predicted"},
  };
  json mbs = json::array();
  for (const MicroBatchRecord& r : tracker.micro_batches()) {
    mbs.push_back({{"epoch", r.epoch},
                   {"index", r.index},
                   {"samples", r.samples},
                   {"activation_bytes", r.activation_bytes},
                   {"peak_bytes", r.peak_bytes},
                   {"peak_by_category", by_category_json(r.peak_by_category)},
                   {"reserved_bytes", r.reserved_bytes},
                   {"forward_ms", r.forward_ms},
                   {"backward_ms", r.backward_ms}});
  }
  j["micro_batches"] = std::move(mbs);
  j["micro_batches_total"] = tracker.micro_batches_seen();  // the list keeps the first max_records
  j["steps_total"] = tracker.steps_seen();
  json steps = json::array();
  for (const StepRecord& r : tracker.steps())
    steps.push_back({{"step", r.step}, {"ms", r.ms}, {"optimizer_state_bytes", r.optimizer_state_bytes},
                     {"peak_bytes", r.peak_bytes}});
  j["steps"] = std::move(steps);
  return j.dump(1) + "\n";
}

std::string memory_trace_json(MemoryTracker& tracker) {
  // Trace-event format: "C" counter events (one track per category, bytes), "X" complete events
  // for the phases. Timestamps in microseconds.
  json events = json::array();
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 1}, {"args", {{"name", "cumulus " + tracker.device().str()}}}});
  for (const TimelineSample& s : tracker.timeline()) {
    json args = json::object();
    for (std::size_t c = 0; c < kNumMemoryCategories; ++c)
      args[category_name(static_cast<MemoryCategory>(c))] = s.bytes[c];
    events.push_back({{"name", "memory (bytes)"}, {"ph", "C"}, {"pid", 1}, {"ts", s.ms * 1000.0}, {"args", args}});
  }
  for (const TimelineSlice& s : tracker.slices())
    events.push_back({{"name", s.name}, {"ph", "X"}, {"pid", 1}, {"tid", 1}, {"ts", s.start_ms * 1000.0},
                      {"dur", std::max(0.0, s.end_ms - s.start_ms) * 1000.0}});
  json j;
  j["traceEvents"] = std::move(events);
  j["displayTimeUnit"] = "ms";
  return j.dump() + "\n";
}

std::string memory_plot_svg(MemoryTracker& tracker) {
  // Stacked areas, one per category, over the timeline. Samples are thinned to at most kPoints
  // (keeping each bucket's maximum total, so peaks survive).
  constexpr int kWidth = 960, kHeight = 480, kLeft = 80, kRight = 200, kTop = 40, kBottom = 50;
  constexpr std::size_t kPoints = 1500;
  static const char* colors[kNumMemoryCategories] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                                     "#59a14f", "#edc948", "#b07aa1", "#9c755f"};
  const auto& all = tracker.timeline();
  std::vector<TimelineSample> pts;
  if (all.size() <= kPoints) {
    pts = all;
  } else {
    const double per = static_cast<double>(all.size()) / kPoints;
    for (std::size_t b = 0; b < kPoints; ++b) {
      const std::size_t lo = static_cast<std::size_t>(b * per), hi = std::min(all.size(), static_cast<std::size_t>((b + 1) * per));
      std::size_t best = lo;
      int64_t best_total = -1;
      for (std::size_t i = lo; i < hi; ++i) {
        int64_t t = 0;
        for (int64_t v : all[i].bytes) t += v;
        if (t > best_total) best_total = t, best = i;
      }
      pts.push_back(all[best]);
    }
  }
  double t_max = 1e-9, y_max = 1.0;
  for (const auto& p : pts) {
    int64_t total = 0;
    for (int64_t v : p.bytes) total += v;
    y_max = std::max(y_max, static_cast<double>(total));
    t_max = std::max(t_max, p.ms);
  }
  const double t_min = pts.empty() ? 0.0 : pts.front().ms;
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  auto X = [&](double t) { return kLeft + (t - t_min) / std::max(t_max - t_min, 1e-9) * plot_w; };
  auto Y = [&](double b) { return kTop + plot_h - b / y_max * plot_h; };

  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(1);
  os << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
     << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
     << "\" viewBox=\"0 0 " << kWidth << " " << kHeight << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
     << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
     << "<text x=\"" << kLeft << "\" y=\"22\" font-size=\"15\">cumulus memory by category, " << tracker.device().str()
     << ", micro-batch " << tracker.options().micro_batch_size << " x " << tracker.options().accum_steps
     << " steps (first " << tracker.steps().size() << " optimizer steps recorded)</text>\n";
  // Stacked areas from the bottom category up.
  for (int c = static_cast<int>(kNumMemoryCategories) - 1; c >= 0; --c) {
    if (pts.empty()) break;
    std::ostringstream path;
    path.setf(std::ios::fixed);
    path.precision(1);
    for (std::size_t i = 0; i < pts.size(); ++i) {
      double top = 0;
      for (int k = 0; k <= c; ++k) top += static_cast<double>(pts[i].bytes[static_cast<std::size_t>(k)]);
      path << (i ? " L" : "M") << X(pts[i].ms) << "," << Y(top);
    }
    path << " L" << X(pts.back().ms) << "," << Y(0) << " L" << X(pts.front().ms) << "," << Y(0) << " Z";
    os << "<path d=\"" << path.str() << "\" fill=\"" << colors[c] << "\" stroke=\"none\"/>\n";
  }
  // Axes, ticks and legend.
  os << "<line x1=\"" << kLeft << "\" y1=\"" << kTop + plot_h << "\" x2=\"" << kLeft + plot_w << "\" y2=\""
     << kTop + plot_h << "\" stroke=\"black\"/>\n"
     << "<line x1=\"" << kLeft << "\" y1=\"" << kTop << "\" x2=\"" << kLeft << "\" y2=\"" << kTop + plot_h
     << "\" stroke=\"black\"/>\n";
  for (int i = 0; i <= 4; ++i) {
    const double b = y_max * i / 4.0;
    os << "<text x=\"" << kLeft - 6 << "\" y=\"" << Y(b) + 4 << "\" text-anchor=\"end\">"
       << format_bytes(static_cast<int64_t>(b)) << "</text>\n";
    const double t = t_min + (t_max - t_min) * i / 4.0;
    os << "<text x=\"" << X(t) << "\" y=\"" << kTop + plot_h + 18 << "\" text-anchor=\"middle\">" << t << " ms</text>\n";
  }
  os << "<text x=\"" << kLeft + plot_w / 2 << "\" y=\"" << kHeight - 8 << "\" text-anchor=\"middle\">time (host clock)</text>\n";
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
    const double y = kTop + 10 + 20.0 * static_cast<double>(c);
    os << "<rect x=\"" << kLeft + plot_w + 16 << "\" y=\"" << y - 10 << "\" width=\"12\" height=\"12\" fill=\""
       << colors[c] << "\"/>\n<text x=\"" << kLeft + plot_w + 34 << "\" y=\"" << y << "\">"
       << category_name(static_cast<MemoryCategory>(c)) << "</text>\n";
  }
  os << "</svg>\n";
  return os.str();
}

}  // namespace cumulus
