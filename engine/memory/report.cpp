// The memory reports: a terminal table, JSON (the schema in the README), a Chrome trace-event
// timeline (opens in Perfetto or chrome://tracing) and an SVG plot of memory by category.
#include <cblas.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include "cumulus/memory/tracker.h"
#include "cumulus/version.h"

#if CUMULUS_WITH_CUDA
#include <cublas_api.h>
#include <cuda_runtime.h>
#endif
#if CUMULUS_WITH_CUDNN
#include <cudnn.h>
#endif

namespace cumulus {

namespace {

// Ordered: the report reads top-down (summary before the long record lists), so keys keep the
// order they are written in.
using ojson = nlohmann::ordered_json;

ojson by_category_json(const std::array<int64_t, kNumMemoryCategories>& bytes) {
  ojson j = ojson::object();
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) j[category_name(static_cast<MemoryCategory>(c))] = bytes[c];
  return j;
}

// The out-of-memory object of the report (README "Memory reports").
ojson out_of_memory_json(const TrackedOutOfMemory& t) {
  const OutOfMemoryRecord& f = t.failure;
  ojson j;
  j["op"] = f.op;
  j["category"] = category_name(f.category);
  j["requested_bytes"] = f.requested_bytes;
  j["rounded_bytes"] = f.rounded_bytes;
  j["segment_bytes"] = f.segment_bytes;
  j["limit_bytes"] = f.limit;
  j["reserved_bytes"] = f.reserved;
  j["allocated_bytes"] = f.allocated;
  j["peak_bytes"] = f.peak_bytes;
  j["live_by_category"] = by_category_json(f.live_by_category);
  ojson ops = ojson::object();
  for (const auto& [op, bytes] : f.live_by_op) ops[op] = bytes;
  j["live_by_op"] = std::move(ops);
  if (t.in_progress) {
    ojson m;
    m["phase"] = t.phase;
    m["epoch"] = t.epoch + 1;
    if (std::string(t.phase) == "step") {
      m["step"] = t.step;
    } else {
      m["index"] = t.index;
      m["samples"] = t.samples;
    }
    j["micro_batch"] = std::move(m);
  } else {
    j["micro_batch"] = nullptr;  // outside the training phases (e.g. the test pass)
  }
  return j;
}

std::string trimmed(std::string s) {
  const std::size_t a = s.find_first_not_of(' ');
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(' ') - a + 1);
}

#if CUMULUS_WITH_CUDA
// CUDA encodes versions as 1000 * major + 10 * minor.
std::string cuda_version_string(int v) {
  return v <= 0 ? std::string("none") : std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}
#endif

// The libraries as linked (run-time queries where the library has one, so a report names what
// actually ran).
ojson versions_json() {
  ojson v;
  v["cumulus"] = CUMULUS_VERSION;
#if defined(__clang__)
  v["compiler"] = "clang " __clang_version__;
#elif defined(__GNUC__)
  v["compiler"] = "gcc " + std::to_string(__GNUC__) + "." + std::to_string(__GNUC_MINOR__) + "." +
                  std::to_string(__GNUC_PATCHLEVEL__);
#endif
  v["openblas"] = trimmed(openblas_get_config());
  v["zlib"] = zlibVersion();
  v["nlohmann_json"] = std::to_string(NLOHMANN_JSON_VERSION_MAJOR) + "." + std::to_string(NLOHMANN_JSON_VERSION_MINOR) +
                       "." + std::to_string(NLOHMANN_JSON_VERSION_PATCH);
#if CUMULUS_WITH_CUDA
  int runtime = 0, driver = 0;
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
  (void)cudaGetLastError();
  v["cuda_runtime"] = cuda_version_string(runtime);
  v["cuda_driver"] = cuda_version_string(driver);
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS)
    v["cublas"] = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
#endif
#if CUMULUS_WITH_CUDNN
  int dmajor = 0, dminor = 0, dpatch = 0;
  if (cudnnGetProperty(MAJOR_VERSION, &dmajor) == CUDNN_STATUS_SUCCESS &&
      cudnnGetProperty(MINOR_VERSION, &dminor) == CUDNN_STATUS_SUCCESS &&
      cudnnGetProperty(PATCH_LEVEL, &dpatch) == CUDNN_STATUS_SUCCESS)
    v["cudnn"] = std::to_string(dmajor) + "." + std::to_string(dminor) + "." + std::to_string(dpatch);
#endif
  return v;
}

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

RecomputeSummary summarize_recompute(MemoryTracker& tracker, int64_t micro_batch_size) {
  RecomputeSummary rs;
  for (const MicroBatchRecord& r : tracker.micro_batches()) {
    if (r.recompute_segments == 0) continue;
    rs.micro_batches += 1;
    rs.segments = std::max(rs.segments, r.recompute_segments);
    rs.recompute_ms += r.recompute_ms;
    rs.backward_ms += r.backward_ms;
    if (r.samples == micro_batch_size && r.activation_bytes >= rs.activation_bytes) {
      rs.activation_bytes = r.activation_bytes;
      rs.stored_activation_bytes = r.activation_bytes + r.recompute_avoided_bytes;
      rs.recomputed_bytes = r.recomputed_bytes;
    }
  }
  return rs;
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
  if (const RecomputeSummary rs = summarize_recompute(tracker, s.micro_batch_size); rs.micro_batches > 0) {
    const double share = rs.backward_ms > 0 ? 100.0 * rs.recompute_ms / rs.backward_ms : 0.0;
    std::fprintf(out,
                 "  recompute on: %lld segments per micro-batch; activations %s kept vs %s without recompute; "
                 "recomputing took %.1f%% of backward (%.2f ms per micro-batch)\n",
                 static_cast<long long>(rs.segments), format_bytes(rs.activation_bytes).c_str(),
                 format_bytes(rs.stored_activation_bytes).c_str(), share,
                 rs.recompute_ms / static_cast<double>(rs.micro_batches));
  }
  // Which kernels trained (the app's "kernels" setting): the fused MLP op keeps a different set of
  // activations than the generic ops (Note [Fused MLP] in engine/ops/fused_mlp.cpp).
  for (const auto& [key, value] : tracker.options().settings)
    if (key == "kernels") std::fprintf(out, "  kernels: %s\n", value.c_str());
  // Mixed precision (Note [Mixed precision] in engine/ops/linear.cpp): the 16-bit weight copies live
  // from a forward to its backward, so they are part of each micro-batch's peak, not of the step's.
  int64_t copies = 0;
  for (const auto& r : tracker.micro_batches())
    copies = std::max(copies, r.peak_by_category[static_cast<std::size_t>(MemoryCategory::parameter_copies)]);
  if (copies > 0)
    std::fprintf(out, "  16-bit weight copies (mixed precision): %s at a micro-batch's peak\n",
                 format_bytes(copies).c_str());
  if (const auto oom = tracker.out_of_memory()) {
    const OutOfMemoryRecord& f = oom->failure;
    std::string where;
    if (oom->in_progress)
      where = std::string(" in the ") + oom->phase + " of epoch " + std::to_string(oom->epoch + 1) +
              (std::string(oom->phase) == "step" ? ", step " + std::to_string(oom->step)
                                                 : ", micro-batch " + std::to_string(oom->index));
    std::string top;
    for (std::size_t i = 0; i < f.live_by_op.size() && i < 3; ++i)
      top += (i ? ", " : "") + f.live_by_op[i].first + " " + format_bytes(f.live_by_op[i].second);
    std::fprintf(out, "  out of memory%s: %s asked for %s (%s) with %s reserved of %s; live by op: %s\n",
                 where.c_str(), f.op.c_str(), format_bytes(f.requested_bytes).c_str(), category_name(f.category),
                 format_bytes(f.reserved).c_str(), f.limit > 0 ? format_bytes(f.limit).c_str() : "no limit",
                 top.empty() ? "none" : top.c_str());
  }
}

std::string memory_report_json(MemoryTracker& tracker) {
  const MemorySummary s = tracker.summary();
  const MemoryTracker::Options& o = tracker.options();
  ojson j;
  j["schema_version"] = kMemoryReportSchemaVersion;
  ojson settings = ojson::object();
  for (const auto& [key, value] : o.settings) settings[key] = value;
  j["settings"] = std::move(settings);
  j["device"] = tracker.device().str();
  j["device_name"] = tracker.device().hardware_name();
  j["versions"] = versions_json();
  j["model"] = o.model;
  j["micro_batch_size"] = s.micro_batch_size;
  j["accum_steps"] = s.accum_steps;
  if (!o.annotations.empty()) {
    ojson a = ojson::object();
    for (const auto& [key, value] : o.annotations) a[key] = value;
    j["annotations"] = std::move(a);
  }
  ojson summary;
  summary["parameters_bytes"] = s.parameters_bytes;
  summary["gradients_bytes"] = s.gradients_bytes;
  summary["optimizer_state_bytes"] = s.optimizer_state_bytes;
  summary["workspace_bytes"] = s.workspace_bytes;
  summary["data_bytes"] = s.data_bytes;
  summary["activation_bytes_per_sample"] = s.activation_bytes_per_sample;
  summary["peak_bytes"] = s.peak_bytes;
  summary["reserved_peak_bytes"] = s.reserved_peak_bytes;
  summary["peak_at_micro_batch_bytes"] = s.peak_at_micro_batch;
  summary["peak_at_effective_batch_bytes"] = s.peak_at_effective_batch;
  summary["effective_batch_peak"] = s.effective_batch_measured ? "measured" : "predicted";
  // Additive to schema 2: "recompute" is present only when some kept micro-batch recomputed
  // checkpointed segments (Note [Recompute] in engine/autograd/checkpoint.cpp). At the
  // micro-batch size: the activation footprint kept with recompute, the one a stored run keeps,
  // what the recomputations held; over the micro-batches that recomputed: the time.
  if (const RecomputeSummary rs = summarize_recompute(tracker, s.micro_batch_size); rs.micro_batches > 0) {
    ojson r;
    r["segments_per_micro_batch"] = rs.segments;
    r["activation_bytes"] = rs.activation_bytes;
    r["activation_bytes_without_recompute"] = rs.stored_activation_bytes;
    r["saved_bytes"] = rs.stored_activation_bytes - rs.activation_bytes;
    r["recomputed_bytes"] = rs.recomputed_bytes;
    r["recompute_ms_per_micro_batch"] = rs.recompute_ms / static_cast<double>(rs.micro_batches);
    r["recompute_share_of_backward"] = rs.backward_ms > 0 ? rs.recompute_ms / rs.backward_ms : 0.0;
    summary["recompute"] = std::move(r);
  }
  j["summary"] = std::move(summary);
  if (const auto oom = tracker.out_of_memory()) j["out_of_memory"] = out_of_memory_json(*oom);
  j["micro_batches_total"] = tracker.micro_batches_seen();  // the lists keep the first max_records
  j["steps_total"] = tracker.steps_seen();
  ojson mbs = ojson::array();
  for (const MicroBatchRecord& r : tracker.micro_batches()) {
    ojson m;
    m["epoch"] = r.epoch + 1;
    m["index"] = r.index;
    m["samples"] = r.samples;
    m["activation_bytes"] = r.activation_bytes;
    m["peak_bytes"] = r.peak_bytes;
    m["peak_by_category"] = by_category_json(r.peak_by_category);
    m["reserved_bytes"] = r.reserved_bytes;
    m["forward_ms"] = r.forward_ms;
    m["backward_ms"] = r.backward_ms;
    if (r.recompute_segments > 0) {  // additive to schema 2: only on micro-batches that recomputed
      m["recompute_segments"] = r.recompute_segments;
      m["recomputed_bytes"] = r.recomputed_bytes;
      m["recompute_avoided_bytes"] = r.recompute_avoided_bytes;
      m["recompute_ms"] = r.recompute_ms;
    }
    mbs.push_back(std::move(m));
  }
  j["micro_batches"] = std::move(mbs);
  ojson steps = ojson::array();
  for (const StepRecord& r : tracker.steps()) {
    ojson st;
    st["step"] = r.step;
    st["epoch"] = r.epoch + 1;
    st["ms"] = r.ms;
    st["optimizer_state_bytes"] = r.optimizer_state_bytes;
    st["peak_bytes"] = r.peak_bytes;
    if (r.communication_ms > 0.0) st["communication_ms"] = r.communication_ms;  // data parallel only
    steps.push_back(std::move(st));
  }
  j["steps"] = std::move(steps);
  return j.dump(1) + "\n";
}

std::string memory_trace_json(MemoryTracker& tracker) {
  // Trace-event format: "C" counter events (one track per category, bytes), "X" complete events
  // for the phases. Timestamps in microseconds.
  ojson events = ojson::array();
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 1},
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
    events.push_back({{"name", s.name}, {"ph", "X"}, {"pid", 1}, {"tid", 1}, {"ts", s.start_ms * 1000.0},
                      {"dur", std::max(0.0, s.end_ms - s.start_ms) * 1000.0}, {"args", args}});
  }
  // Recomputations of checkpointed segments, nested inside their backward slice.
  for (const TimelineSlice& s : tracker.recompute_slices()) {
    ojson args = ojson::object();
    args["epoch"] = s.epoch + 1;
    args["index"] = s.index;
    args["recomputed_bytes"] = s.bytes;
    events.push_back({{"name", s.name}, {"ph", "X"}, {"pid", 1}, {"tid", 1}, {"ts", s.start_ms * 1000.0},
                      {"dur", std::max(0.0, s.end_ms - s.start_ms) * 1000.0}, {"args", args}});
  }
  ojson j;
  j["traceEvents"] = std::move(events);
  j["displayTimeUnit"] = "ms";
  return j.dump() + "\n";
}

// ---- the SVG plot ------------------------------------------------------------------------------

namespace {

// Note [Memory plot]
// Two panels over the timeline window (the first `timeline_steps` optimizer steps), one time axis:
// on top all allocated memory stacked by category; below, on its own scale, what changes: each
// category whose level moves in the window, by its part above its lowest level there
// (activations and backward temporaries; optimizer state appearing at the first step; on the CPU
// the convolution's im2col workspace). For the seed MLP the fixed costs (dataset, parameters,
// cuBLAS workspace) are ~1000x its 65 KiB sawtooth, which no shared scale can show. A category
// that grows once and stays (AdamW state, the cuBLAS workspace at the first GEMM) is left out of
// the lower panel when its growth exceeds the sawtooth, and named above it. Steps are bands,
// micro-batches dashed lines, numbered from 1 like epochs.
//
// The time axis is the host clock, but a phase or gap far longer than its kind's median (the
// first CUDA forward: library initialization, lazy module loading; an evaluation inside the
// window) is drawn shortened and hatched, its true duration in the footnote. Cutting the warm-up
// off instead would hide the first allocation of activations and of optimizer state, which the
// plot is there to show; shortening only outliers leaves a plot without them (the CPU's, usually)
// linear.

constexpr std::array<MemoryCategory, kNumMemoryCategories> kStackOrder = {
    MemoryCategory::parameters,      MemoryCategory::gradients,   MemoryCategory::workspace,
    MemoryCategory::data,            MemoryCategory::optimizer_state, MemoryCategory::parameter_copies,
    MemoryCategory::activations,     MemoryCategory::backward_temporaries, MemoryCategory::other};

const char* category_color(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::parameters: return "#4e79a7";
    case MemoryCategory::gradients: return "#a0cbe8";
    case MemoryCategory::optimizer_state: return "#f28e2b";
    case MemoryCategory::activations: return "#e15759";
    case MemoryCategory::backward_temporaries: return "#76b7b2";
    case MemoryCategory::workspace: return "#bab0ac";
    case MemoryCategory::data: return "#59a14f";
    case MemoryCategory::other: return "#b07aa1";
    case MemoryCategory::parameter_copies: return "#edc948";
  }
  return "#000000";
}

std::string label_of(MemoryCategory c) {
  std::string s = category_name(c);
  std::replace(s.begin(), s.end(), '_', ' ');
  return s;
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += ch;
    }
  }
  return out;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string fmt_ms(double ms) {
  if (ms >= 100) return fmt("%.0f ms", ms);
  if (ms >= 10) return fmt("%.1f ms", ms);
  return fmt("%.2f ms", ms);
}

// Ticks for a byte axis: binary units, 1-2-2.5-5 steps, about four of them.
struct ByteAxis {
  double max = 1, step = 1, unit = 1;
  const char* unit_name = "B";
};

ByteAxis byte_axis(double max_bytes) {
  ByteAxis a;
  const char* names[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (u < 3 && max_bytes >= 1024.0 * std::pow(1024.0, u)) ++u;
  a.unit = std::pow(1024.0, u);
  a.unit_name = names[u];
  const double v = std::max(max_bytes / a.unit, 1e-9), raw = v / 4.0;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * mag;
  for (double m : {1.0, 2.0, 2.5, 5.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  if (u == 0) step = std::max(1.0, std::round(step));
  a.step = step * a.unit;
  a.max = std::ceil(v / step - 1e-9) * step * a.unit;
  if (a.max <= 0) a.max = a.step;
  return a;
}

std::string byte_tick(const ByteAxis& a, double bytes) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%g %s", bytes / a.unit, a.unit_name);
  return buf;
}

// The window cut into phases and the gaps between them, each drawn at its true length or, when
// an outlier, shortened (Note [Memory plot]).
struct Interval {
  double t0, t1;
  std::string kind;  // forward, backward, step, or gap
  const TimelineSlice* slice = nullptr;
  double drawn = 0;
  bool shortened = false;
};

class TimeAxis {
 public:
  TimeAxis(std::vector<Interval> parts, double x0, double width) : parts_(std::move(parts)), x0_(x0), w_(width) {
    shorten_outliers();
    for (const Interval& p : parts_) total_ += p.drawn;
    if (total_ <= 0) total_ = 1e-9;
  }
  double x(double t) const {
    if (parts_.empty()) return x0_;
    if (t <= parts_.front().t0) return x0_;
    double acc = 0;
    for (const Interval& p : parts_) {
      if (t <= p.t1) {
        const double len = p.t1 - p.t0;
        const double frac = len > 0 ? (t - p.t0) / len : 1.0;
        return x0_ + (acc + frac * p.drawn) / total_ * w_;
      }
      acc += p.drawn;
    }
    return x0_ + w_;
  }
  const std::vector<Interval>& parts() const { return parts_; }
  bool inside_shortened(double t) const {
    for (const Interval& p : parts_)
      if (p.shortened && t > p.t0 && t < p.t1) return true;
    return false;
  }
  // The drawn length of the window in ms of the linear scale.
  double drawn_ms() const { return total_; }

 private:
  void shorten_outliers() {
    std::map<std::string, std::vector<double>> by_kind;
    for (const Interval& p : parts_) by_kind[p.kind].push_back(p.t1 - p.t0);
    std::map<std::string, double> cap;
    for (auto& [kind, v] : by_kind) {
      std::sort(v.begin(), v.end());
      cap[kind] = 3.0 * v[v.size() / 2];
    }
    for (Interval& p : parts_) p.drawn = p.t1 - p.t0;
    // Repeated because shortening the largest outlier can make the next one dominate.
    for (int round = 0; round < 6; ++round) {
      double total = 0, linear = 0;
      for (const Interval& p : parts_) {
        total += p.drawn;
        if (!p.shortened) linear += p.drawn;
      }
      bool changed = false;
      for (Interval& p : parts_) {
        const double len = p.t1 - p.t0;
        if (!p.shortened && len > cap[p.kind] && len > 0.04 * total) p.shortened = changed = true;
      }
      for (Interval& p : parts_)
        if (p.shortened) p.drawn = std::min(p.t1 - p.t0, std::max(cap[p.kind], 0.02 * linear));
      if (!changed) break;
    }
  }

  std::vector<Interval> parts_;
  double x0_, w_, total_ = 0;
};

std::string describe_interval(const Interval& p) {
  if (p.slice == nullptr) return "time between phases";
  if (p.kind == "step") return "optimizer step " + std::to_string(p.slice->index);
  return p.kind + " of micro-batch " + std::to_string(p.slice->index + 1) + " (epoch " +
         std::to_string(p.slice->epoch + 1) + ")";
}

// Samples reduced to at most two per pixel column: the column's highest (by `key`), then its last,
// so peaks survive and the level after the column is right.
std::vector<const TimelineSample*> thin(const std::vector<TimelineSample>& all, const TimeAxis& axis,
                                        const std::function<int64_t(const TimelineSample&)>& key) {
  std::vector<const TimelineSample*> out;
  std::size_t i = 0;
  while (i < all.size()) {
    const long col = std::lround(axis.x(all[i].ms));
    std::size_t j = i, best = i;
    while (j < all.size() && std::lround(axis.x(all[j].ms)) == col) {
      if (key(all[j]) > key(all[best])) best = j;
      ++j;
    }
    out.push_back(&all[best]);
    if (j - 1 != best) out.push_back(&all[j - 1]);
    i = j;
  }
  return out;
}

}  // namespace

std::string memory_plot_svg(MemoryTracker& tracker) {
  constexpr double kWidth = 1040, kLeft = 90, kRight = 270;
  constexpr double kTopY = 84, kTopH = 150, kBotY = 334, kBotH = 240;
  const double plot_w = kWidth - kLeft - kRight;
  const MemoryTracker::Options& o = tracker.options();
  const std::vector<TimelineSample>& samples = tracker.timeline();
  const std::vector<TimelineSlice>& slices = tracker.slices();

  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(1);
  auto text = [&](double x, double y, const std::string& s, const char* extra = "") {
    os << "<text x=\"" << x << "\" y=\"" << y << "\"" << extra << ">" << xml_escape(s) << "</text>\n";
  };

  // What the window holds: micro-batches (epoch, index), steps, epochs.
  std::vector<const TimelineSlice*> forwards, steps;
  for (const TimelineSlice& s : slices) {
    if (s.name == "forward") forwards.push_back(&s);
    if (s.name == "step") steps.push_back(&s);
  }
  std::string what;
  if (forwards.empty()) {
    what = "no micro-batch recorded";
  } else {
    const TimelineSlice &a = *forwards.front(), &b = *forwards.back();
    if (a.epoch == b.epoch)
      what = (forwards.size() == 1 ? "micro-batch " + std::to_string(a.index + 1)
                                   : "micro-batches " + std::to_string(a.index + 1) + "-" + std::to_string(b.index + 1)) +
             " of epoch " + std::to_string(a.epoch + 1);
    else
      what = "epoch " + std::to_string(a.epoch + 1) + " micro-batch " + std::to_string(a.index + 1) + " to epoch " +
             std::to_string(b.epoch + 1) + " micro-batch " + std::to_string(b.index + 1) + " (" +
             std::to_string(forwards.size()) + " micro-batches)";
    if (steps.empty()) what += ", no optimizer step";
    else if (steps.size() == 1) what += ", optimizer step " + std::to_string(steps.front()->index);
    else
      what += ", optimizer steps " + std::to_string(steps.front()->index) + "-" + std::to_string(steps.back()->index);
  }
  const std::string title = "memory by category, " + what;
  const std::string subtitle = o.model + ", micro-batch " + std::to_string(o.micro_batch_size) + " x " +
                               std::to_string(o.accum_steps) + " accumulation steps, on " +
                               tracker.device().describe() + "; bytes allocated, by the host clock";

  const double height = kBotY + kBotH + 118;
  os << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
     << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << height << "\" viewBox=\"0 0 "
     << kWidth << " " << height << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
     << "<title>" << xml_escape(title) << "</title>\n"
     << "<defs><pattern id=\"shortened\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
        "patternTransform=\"rotate(45)\"><line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#777\" "
        "stroke-width=\"1.5\"/></pattern></defs>\n"
     << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  text(kLeft, 24, title, " font-size=\"16\" font-weight=\"bold\"");
  text(kLeft, 42, subtitle, " fill=\"#444\"");

  if (samples.empty() || slices.empty()) {
    text(kLeft, kTopY + 40,
         "no timeline was recorded (timeline_steps = " + std::to_string(o.timeline_steps) + ")");
    os << "</svg>\n";
    return os.str();
  }

  // The window and its intervals; an unfinished last phase (an error inside it) ends at the last sample.
  const double w0 = std::min(samples.front().ms, slices.front().start_ms);
  double w1 = samples.back().ms;
  for (const TimelineSlice& s : slices) w1 = std::max(w1, std::max(s.start_ms, s.end_ms));
  std::vector<Interval> parts;
  double cursor = w0;
  for (const TimelineSlice& s : slices) {
    const double start = std::max(cursor, s.start_ms), end = s.end_ms >= s.start_ms ? s.end_ms : w1;
    if (start > cursor) parts.push_back({cursor, start, "gap"});
    if (end > start) parts.push_back({start, end, s.name, &s});
    cursor = std::max(cursor, end);
  }
  if (w1 > cursor) parts.push_back({cursor, w1, "gap"});
  const TimeAxis axis(std::move(parts), kLeft, plot_w);

  // Levels per category over the window, and which categories the lower panel draws (Note
  // [Memory plot]): each whose level moves, by its part above its lowest level in the window. A
  // category that only grows (allocated once and kept: AdamW state at step 1, the cuBLAS workspace
  // at the first GEMM) is left out when its growth would dwarf the sawtooth, and named instead.
  std::array<int64_t, kNumMemoryCategories> lo{}, hi{};
  std::array<bool, kNumMemoryCategories> decreases{};
  std::array<double, kNumMemoryCategories> grew_at{};
  lo.fill(INT64_MAX);
  grew_at.fill(-1.0);
  int64_t top_max = 1;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const TimelineSample& s = samples[i];
    int64_t total = 0;
    for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
      lo[c] = std::min(lo[c], s.bytes[c]);
      hi[c] = std::max(hi[c], s.bytes[c]);
      total += s.bytes[c];
      if (i > 0 && s.bytes[c] < samples[i - 1].bytes[c]) decreases[c] = true;
      if (i > 0 && s.bytes[c] > samples[i - 1].bytes[c] && grew_at[c] < 0) grew_at[c] = s.ms;
    }
    top_max = std::max(top_max, total);
  }
  auto above_low = [&](const TimelineSample& s, const std::vector<MemoryCategory>& cats) {
    int64_t t = 0;
    for (MemoryCategory c : cats) t += s.bytes[static_cast<std::size_t>(c)] - lo[static_cast<std::size_t>(c)];
    return t;
  };
  std::vector<MemoryCategory> sawtooth, growing, left_out;
  for (MemoryCategory c : kStackOrder) {
    const auto i = static_cast<std::size_t>(c);
    if (hi[i] > lo[i]) (decreases[i] ? sawtooth : growing).push_back(c);
  }
  int64_t amplitude = 0;
  for (const TimelineSample& s : samples) amplitude = std::max(amplitude, above_low(s, sawtooth));
  std::vector<MemoryCategory> changing;  // the lower panel's stack, bottom up: growth, then the sawtooth
  for (MemoryCategory c : growing) {
    const auto i = static_cast<std::size_t>(c);
    (amplitude > 0 && hi[i] - lo[i] > amplitude ? left_out : changing).push_back(c);
  }
  changing.insert(changing.end(), sawtooth.begin(), sawtooth.end());
  auto is_changing = [&](MemoryCategory c) { return std::find(changing.begin(), changing.end(), c) != changing.end(); };
  auto bottom_total = [&](const TimelineSample& s) { return above_low(s, changing); };
  int64_t bottom_max = 1, fixed_bytes = 0;
  for (const TimelineSample& s : samples) bottom_max = std::max(bottom_max, bottom_total(s));
  for (MemoryCategory c : changing) fixed_bytes += lo[static_cast<std::size_t>(c)];
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c)
    if (!is_changing(static_cast<MemoryCategory>(c))) fixed_bytes += hi[c];
  // The phase a time falls in, for the caption.
  auto phase_at = [&](double t) -> std::string {
    for (const TimelineSlice& sl : slices)
      if (t >= sl.start_ms && t <= sl.end_ms)
        return sl.name == "step" ? "in optimizer step " + std::to_string(sl.index)
                                 : "in the " + sl.name + " of micro-batch " + std::to_string(sl.index + 1);
    return "between phases";
  };

  // Step bands, micro-batch lines and shortened intervals: drawn under the areas in both panels.
  auto markers = [&](double y, double h, bool labels) {
    for (const TimelineSlice* s : steps) {
      const double a = axis.x(s->start_ms), b = std::max(axis.x(s->end_ms), a + 1.5);
      os << "<rect x=\"" << a << "\" y=\"" << y << "\" width=\"" << b - a << "\" height=\"" << h
         << "\" fill=\"#fde6c8\"/>\n";
    }
    for (const TimelineSlice* f : forwards) {
      const double x = axis.x(f->start_ms);
      os << "<line x1=\"" << x << "\" y1=\"" << y << "\" x2=\"" << x << "\" y2=\"" << y + h << "\" stroke=\""
         << (labels ? "#888" : "#bbb") << "\" stroke-width=\"0.7\" stroke-dasharray=\"2,3\"/>\n";
    }
    for (const Interval& p : axis.parts())
      if (p.shortened) {
        const double a = axis.x(p.t0), b = axis.x(p.t1);
        os << "<rect x=\"" << a << "\" y=\"" << y << "\" width=\"" << std::max(b - a, 1.0) << "\" height=\"" << h
           << "\" fill=\"url(#shortened)\" opacity=\"0.5\"/>\n";
      }
    if (!labels) return;
    // Step labels above the panel, thinned so they never overlap.
    double last = -1e9;
    for (const TimelineSlice* s : steps) {
      const double x = (axis.x(s->start_ms) + axis.x(s->end_ms)) / 2;
      const std::string label = (steps.size() <= 12 ? "step " : "") + std::to_string(s->index);
      const double half = 3.5 * static_cast<double>(label.size());
      if (x - half < last + 6) continue;
      text(x, y - 5, label, " text-anchor=\"middle\" fill=\"#b35c00\"");
      last = x + half;
    }
    // Micro-batch numbers under the panel, thinned likewise; epochs marked where they change.
    last = -1e9;
    int epoch = forwards.empty() ? 0 : forwards.front()->epoch;
    for (const TimelineSlice* f : forwards) {
      const double x = axis.x(f->start_ms);
      if (f->epoch != epoch) {
        epoch = f->epoch;
        os << "<line x1=\"" << x << "\" y1=\"" << y << "\" x2=\"" << x << "\" y2=\"" << y + h
           << "\" stroke=\"#333\" stroke-width=\"1.2\"/>\n";
        text(x + 3, y + 12, "epoch " + std::to_string(epoch + 1), " fill=\"#333\"");
      }
      const std::string label = std::to_string(f->index + 1);
      if (x < last + 4) continue;
      text(x, y + h + 14, label, " text-anchor=\"middle\" fill=\"#666\" font-size=\"10\"");
      last = x + 6.0 * static_cast<double>(label.size());
    }
  };

  // One stacked band per category: the top edge along its upper level, back along its lower one,
  // held flat between samples (memory changes only at allocations and frees).
  // `base`: each category's level that counts as zero (the lower panel's window lows).
  auto band = [&](const char* element, const std::vector<const TimelineSample*>& pts,
                  const std::vector<MemoryCategory>& order, const std::array<int64_t, kNumMemoryCategories>& base,
                  std::size_t k, double y0, double h, double ymax) {
    auto level = [&](const TimelineSample& s, std::size_t upto) {
      int64_t v = 0;
      for (std::size_t i = 0; i < upto; ++i) {
        const auto c = static_cast<std::size_t>(order[i]);
        v += s.bytes[c] - base[c];
      }
      return y0 + h - static_cast<double>(v) / ymax * h;
    };
    std::ostringstream pth;
    pth.setf(std::ios::fixed);
    pth.precision(1);
    const double x_end = axis.x(w1);
    std::vector<std::pair<double, double>> upper, lower;
    for (std::size_t i = 0; i < pts.size(); ++i) {
      const double xa = axis.x(pts[i]->ms), xb = i + 1 < pts.size() ? axis.x(pts[i + 1]->ms) : x_end;
      upper.push_back({xa, level(*pts[i], k + 1)});
      upper.push_back({xb, level(*pts[i], k + 1)});
      lower.push_back({xa, level(*pts[i], k)});
      lower.push_back({xb, level(*pts[i], k)});
    }
    std::reverse(lower.begin(), lower.end());
    const bool is_path = std::string(element) == "path";
    bool first = true;
    for (const auto* side : {&upper, &lower})
      for (const auto& [x, y] : *side) {
        if (is_path) pth << (first ? "M" : " L");
        else if (!first) pth << " ";
        pth << x << "," << y;
        first = false;
      }
    if (is_path) pth << " Z";
    os << "<" << element << (is_path ? " d=\"" : " points=\"") << pth.str() << "\" fill=\""
       << category_color(order[k]) << "\" stroke=\"none\"><title>" << label_of(order[k]) << "</title></" << element
       << ">\n";
  };

  auto byte_ticks = [&](const ByteAxis& a, double y0, double h) {
    for (double b = 0; b <= a.max * (1 + 1e-9); b += a.step) {
      const double y = y0 + h - b / a.max * h;
      os << "<line x1=\"" << kLeft << "\" y1=\"" << y << "\" x2=\"" << kLeft + plot_w << "\" y2=\"" << y
         << "\" stroke=\"#000\" stroke-opacity=\"0.08\"/>\n";
      text(kLeft - 6, y + 4, byte_tick(a, b), " text-anchor=\"end\"");
    }
    os << "<rect x=\"" << kLeft << "\" y=\"" << y0 << "\" width=\"" << plot_w << "\" height=\"" << h
       << "\" fill=\"none\" stroke=\"#000\"/>\n";
  };

  // Top panel: everything, fixed costs at the bottom of the stack.
  const std::vector<MemoryCategory> top_order(kStackOrder.begin(), kStackOrder.end());
  const ByteAxis top_axis = byte_axis(static_cast<double>(top_max));
  text(kLeft, kTopY - 8, "all allocated memory, stacked by category", " font-weight=\"bold\"");
  markers(kTopY, kTopH, false);
  const auto top_pts = thin(samples, axis, [](const TimelineSample& s) {
    int64_t t = 0;
    for (int64_t v : s.bytes) t += v;
    return t;
  });
  for (std::size_t k = 0; k < top_order.size(); ++k)
    band("path", top_pts, top_order, std::array<int64_t, kNumMemoryCategories>{}, k, kTopY, kTopH, top_axis.max);
  byte_ticks(top_axis, kTopY, kTopH);

  // Bottom panel: the changing part alone.
  const ByteAxis bot_axis = byte_axis(static_cast<double>(bottom_max));
  text(kLeft, kBotY - 46, "what changes: the accumulation sawtooth", " font-weight=\"bold\"");
  text(kLeft, kBotY - 31,
       "each category above its lowest level in this window (all else, " + format_bytes(fixed_bytes) +
           ", is fixed here), on its own scale",
       " fill=\"#444\"");
  std::string not_drawn;
  for (MemoryCategory c : left_out) {
    const auto i = static_cast<std::size_t>(c);
    not_drawn += std::string(not_drawn.empty() ? "not drawn (see the top panel): " : "; ") + label_of(c) + ", " +
                 format_bytes(hi[i] - lo[i]) + " allocated once " + phase_at(grew_at[i]);
  }
  if (!not_drawn.empty()) text(kLeft, kBotY - 17, not_drawn, " fill=\"#444\"");
  markers(kBotY, kBotH, true);
  const auto bot_pts = thin(samples, axis, bottom_total);
  for (std::size_t k = 0; k < changing.size(); ++k) band("polygon", bot_pts, changing, lo, k, kBotY, kBotH, bot_axis.max);
  byte_ticks(bot_axis, kBotY, kBotH);
  text(kLeft - 6, kBotY + kBotH + 14, "micro-batch", " text-anchor=\"end\" fill=\"#666\" font-size=\"10\"");

  // Time axis: real milliseconds since the window's start, ticks skipped inside shortened intervals.
  const double axis_y = kBotY + kBotH + 32;
  {
    const double raw = axis.drawn_ms() / 10.0;
    const double mag = std::pow(10.0, std::floor(std::log10(std::max(raw, 1e-6))));
    double step = 10 * mag;
    for (double m : {1.0, 2.0, 5.0})
      if (m * mag >= raw) {
        step = m * mag;
        break;
      }
    double last = -1e9;
    for (double t = 0; w0 + t <= w1 + 1e-9; t += step) {
      if (axis.inside_shortened(w0 + t)) continue;
      const double x = axis.x(w0 + t);
      if (x < last + 55) continue;
      os << "<line x1=\"" << x << "\" y1=\"" << kBotY + kBotH << "\" x2=\"" << x << "\" y2=\"" << kBotY + kBotH + 4
         << "\" stroke=\"#000\"/>\n";
      text(x, axis_y, fmt(step < 0.1 ? "%.2f" : step < 1 ? "%.1f" : "%.0f", t) + " ms", " text-anchor=\"middle\"");
      last = x;
    }
    // Break marks where the axis is shortened.
    for (const Interval& p : axis.parts())
      if (p.shortened) {
        const double x = (axis.x(p.t0) + axis.x(p.t1)) / 2;
        for (double dx : {-2.5, 2.5})
          os << "<line x1=\"" << x + dx - 3 << "\" y1=\"" << kBotY + kBotH + 5 << "\" x2=\"" << x + dx + 3 << "\" y2=\""
             << kBotY + kBotH - 5 << "\" stroke=\"#000\" stroke-width=\"1.5\"/>\n";
      }
  }
  text(kLeft + plot_w / 2, axis_y + 18, "time since the first micro-batch shown began (host clock)",
       " text-anchor=\"middle\"");

  // Footnotes: the shortened intervals with their true durations; the marker legend.
  double foot_y = axis_y + 40;
  std::string shortened;
  int n_short = 0;
  for (const Interval& p : axis.parts())
    if (p.shortened) {
      if (n_short < 4) shortened += std::string(n_short ? "; " : "") + describe_interval(p) + " " + fmt_ms(p.t1 - p.t0);
      ++n_short;
    }
  if (n_short > 4) shortened += "; and " + std::to_string(n_short - 4) + " more";
  if (n_short > 0) {
    os << "<rect x=\"" << kLeft << "\" y=\"" << foot_y - 10 << "\" width=\"14\" height=\"12\" fill=\"url(#shortened)\" "
       << "stroke=\"#777\"/>\n";
    text(kLeft + 20, foot_y, "drawn shortened on the time axis: " + shortened);
    foot_y += 18;
  }
  os << "<rect x=\"" << kLeft << "\" y=\"" << foot_y - 10 << "\" width=\"14\" height=\"12\" fill=\"#fde6c8\"/>\n";
  text(kLeft + 20, foot_y, "optimizer step", "");
  os << "<line x1=\"" << kLeft + 130 << "\" y1=\"" << foot_y - 10 << "\" x2=\"" << kLeft + 130 << "\" y2=\"" << foot_y + 2
     << "\" stroke=\"#999\" stroke-dasharray=\"2,3\"/>\n";
  text(kLeft + 138, foot_y, "start of a micro-batch (forward, then backward)", "");

  // Legend: per category its range in the window, the lower panel's categories first.
  double ly = kTopY + 6;
  const double lx = kLeft + plot_w + 18;
  text(lx, ly, "in this window", " font-weight=\"bold\"");
  ly += 8;
  for (bool want_changing : {true, false}) {
    ly += 16;
    text(lx, ly, want_changing ? "changing (both panels)" : "top panel only", " fill=\"#444\"");
    for (auto it = kStackOrder.rbegin(); it != kStackOrder.rend(); ++it) {
      const MemoryCategory c = *it;
      const auto i = static_cast<std::size_t>(c);
      if (is_changing(c) != want_changing) continue;
      ly += 18;
      os << "<rect x=\"" << lx << "\" y=\"" << ly - 10 << "\" width=\"12\" height=\"12\" fill=\"" << category_color(c)
         << "\"/>\n";
      std::string range = format_bytes(hi[i]);
      if (lo[i] != hi[i])
        range = (lo[i] == 0 ? "" : format_bytes(lo[i]) + " + ") + "up to " + format_bytes(hi[i] - lo[i]);
      text(lx + 18, ly, label_of(c) + "  " + range);
    }
  }
  os << "</svg>\n";
  return os.str();
}

}  // namespace cumulus
