// The memory timeline as an SVG plot of memory by category (memory_plot_svg; Note [Memory plot]).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cumulus/memory/report.h"

namespace cumulus::memory {

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

constexpr std::array<MemoryCategory, kNumMemoryCategories> kStackOrder = {MemoryCategory::parameters,
                                                                          MemoryCategory::gradients,
                                                                          MemoryCategory::workspace,
                                                                          MemoryCategory::data,
                                                                          MemoryCategory::optimizer_state,
                                                                          MemoryCategory::parameter_copies,
                                                                          MemoryCategory::activations,
                                                                          MemoryCategory::backward_temporaries,
                                                                          MemoryCategory::other};

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

// The plot's layout: the two panels and, right of them, the legend.
constexpr double kWidth = 1040, kLeft = 90, kRight = 270;
constexpr double kTopY = 84, kTopH = 150, kBotY = 334, kBotH = 240;
constexpr double kPlotW = kWidth - kLeft - kRight;

// What the window holds, for the title: micro-batches (epoch, index), steps, epochs.
std::string describe_window(const std::vector<const TimelineSlice*>& forwards,
                            const std::vector<const TimelineSlice*>& steps) {
  if (forwards.empty()) return "no micro-batch recorded";
  std::string what;
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
  else what += ", optimizer steps " + std::to_string(steps.front()->index) + "-" + std::to_string(steps.back()->index);
  return what;
}

// Levels per category over the window, and which categories the lower panel draws (Note
// [Memory plot]): each whose level moves, by its part above its lowest level in the window. A
// category that only grows (allocated once and kept: AdamW state at step 1, the cuBLAS workspace
// at the first GEMM) is left out when its growth would dwarf the sawtooth, and named instead.
struct Levels {
  std::array<int64_t, kNumMemoryCategories> lo{}, hi{};
  std::array<double, kNumMemoryCategories> grew_at{};  // when each first grew in the window; -1: never
  int64_t top_max = 1;                                 // the largest total
  std::vector<MemoryCategory> changing;                // the lower panel's stack, bottom up: growth, then the sawtooth
  std::vector<MemoryCategory> left_out;                // grew once, by more than the sawtooth's amplitude
  int64_t bottom_max = 1;                              // the lower panel's largest total
  int64_t fixed_bytes = 0;                             // what the lower panel leaves out

  int64_t above_low(const TimelineSample& s, const std::vector<MemoryCategory>& cats) const {
    int64_t t = 0;
    for (MemoryCategory c : cats) t += s.bytes[static_cast<std::size_t>(c)] - lo[static_cast<std::size_t>(c)];
    return t;
  }
  int64_t bottom_total(const TimelineSample& s) const { return above_low(s, changing); }
  bool is_changing(MemoryCategory c) const { return std::find(changing.begin(), changing.end(), c) != changing.end(); }
};

Levels measure_levels(const std::vector<TimelineSample>& samples) {
  Levels lv;
  std::array<bool, kNumMemoryCategories> decreases{};
  lv.lo.fill(INT64_MAX);
  lv.grew_at.fill(-1.0);
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const TimelineSample& s = samples[i];
    int64_t total = 0;
    for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
      lv.lo[c] = std::min(lv.lo[c], s.bytes[c]);
      lv.hi[c] = std::max(lv.hi[c], s.bytes[c]);
      total += s.bytes[c];
      if (i > 0 && s.bytes[c] < samples[i - 1].bytes[c]) decreases[c] = true;
      if (i > 0 && s.bytes[c] > samples[i - 1].bytes[c] && lv.grew_at[c] < 0) lv.grew_at[c] = s.ms;
    }
    lv.top_max = std::max(lv.top_max, total);
  }
  std::vector<MemoryCategory> sawtooth, growing;
  for (MemoryCategory c : kStackOrder) {
    const auto i = static_cast<std::size_t>(c);
    if (lv.hi[i] > lv.lo[i]) (decreases[i] ? sawtooth : growing).push_back(c);
  }
  int64_t amplitude = 0;
  for (const TimelineSample& s : samples) amplitude = std::max(amplitude, lv.above_low(s, sawtooth));
  for (MemoryCategory c : growing) {
    const auto i = static_cast<std::size_t>(c);
    (amplitude > 0 && lv.hi[i] - lv.lo[i] > amplitude ? lv.left_out : lv.changing).push_back(c);
  }
  lv.changing.insert(lv.changing.end(), sawtooth.begin(), sawtooth.end());
  for (const TimelineSample& s : samples) lv.bottom_max = std::max(lv.bottom_max, lv.bottom_total(s));
  for (MemoryCategory c : lv.changing) lv.fixed_bytes += lv.lo[static_cast<std::size_t>(c)];
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c)
    if (!lv.is_changing(static_cast<MemoryCategory>(c))) lv.fixed_bytes += lv.hi[c];
  return lv;
}

// The plot, drawn top-down into one stream: header, top panel, bottom panel, time axis,
// footnotes, legend.
class SvgPlot {
 public:
  explicit SvgPlot(MemoryTracker& tracker)
      : tracker_(tracker), o_(tracker.options()), samples_(tracker.timeline()), slices_(tracker.slices()) {
    os_.setf(std::ios::fixed);
    os_.precision(1);
    for (const TimelineSlice& s : slices_) {
      if (s.name == "forward") forwards_.push_back(&s);
      if (s.name == "step") steps_.push_back(&s);
    }
  }

  std::string render() {
    header();
    if (samples_.empty() || slices_.empty()) {
      text(kLeft, kTopY + 40, "no timeline was recorded (timeline_steps = " + std::to_string(o_.timeline_steps) + ")");
      os_ << "</svg>\n";
      return os_.str();
    }
    build_axis();
    lv_ = measure_levels(samples_);
    top_panel();
    bottom_panel();
    footnotes(time_axis());
    legend();
    os_ << "</svg>\n";
    return os_.str();
  }

 private:
  const TimeAxis& axis() const { return *axis_; }

  void text(double x, double y, const std::string& s, const char* extra = "") {
    os_ << "<text x=\"" << x << "\" y=\"" << y << "\"" << extra << ">" << xml_escape(s) << "</text>\n";
  }

  void header() {
    const std::string title = "memory by category, " + describe_window(forwards_, steps_);
    const std::string subtitle = o_.model + ", micro-batch " + std::to_string(o_.micro_batch_size) + " x " +
                                 std::to_string(o_.accum_steps) + " accumulation steps, on " +
                                 tracker_.device().describe() + "; bytes allocated, by the host clock";
    const double height = kBotY + kBotH + 118;
    os_ << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
        << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << height
        << "\" viewBox=\"0 0 " << kWidth << " " << height << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
        << "<title>" << xml_escape(title) << "</title>\n"
        << "<defs><pattern id=\"shortened\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
           "patternTransform=\"rotate(45)\"><line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#777\" "
           "stroke-width=\"1.5\"/></pattern></defs>\n"
        << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    text(kLeft, 24, title, " font-size=\"16\" font-weight=\"bold\"");
    text(kLeft, 42, subtitle, " fill=\"#444\"");
  }

  // The window and its intervals; an unfinished last phase (an error inside it) ends at the last sample.
  void build_axis() {
    w0_ = std::min(samples_.front().ms, slices_.front().start_ms);
    w1_ = samples_.back().ms;
    for (const TimelineSlice& s : slices_) w1_ = std::max(w1_, std::max(s.start_ms, s.end_ms));
    std::vector<Interval> parts;
    double cursor = w0_;
    for (const TimelineSlice& s : slices_) {
      const double start = std::max(cursor, s.start_ms), end = s.end_ms >= s.start_ms ? s.end_ms : w1_;
      if (start > cursor) parts.push_back({cursor, start, "gap"});
      if (end > start) parts.push_back({start, end, s.name, &s});
      cursor = std::max(cursor, end);
    }
    if (w1_ > cursor) parts.push_back({cursor, w1_, "gap"});
    axis_.emplace(std::move(parts), kLeft, kPlotW);
  }

  // The phase a time falls in, for the caption.
  std::string phase_at(double t) const {
    for (const TimelineSlice& sl : slices_)
      if (t >= sl.start_ms && t <= sl.end_ms)
        return sl.name == "step" ? "in optimizer step " + std::to_string(sl.index)
                                 : "in the " + sl.name + " of micro-batch " + std::to_string(sl.index + 1);
    return "between phases";
  }

  // Step bands, micro-batch lines and shortened intervals: drawn under the areas in both panels.
  void markers(double y, double h, bool labels) {
    for (const TimelineSlice* s : steps_) {
      const double a = axis().x(s->start_ms), b = std::max(axis().x(s->end_ms), a + 1.5);
      os_ << "<rect x=\"" << a << "\" y=\"" << y << "\" width=\"" << b - a << "\" height=\"" << h
          << "\" fill=\"#fde6c8\"/>\n";
    }
    for (const TimelineSlice* f : forwards_) {
      const double x = axis().x(f->start_ms);
      os_ << "<line x1=\"" << x << "\" y1=\"" << y << "\" x2=\"" << x << "\" y2=\"" << y + h << "\" stroke=\""
          << (labels ? "#888" : "#bbb") << "\" stroke-width=\"0.7\" stroke-dasharray=\"2,3\"/>\n";
    }
    for (const Interval& p : axis().parts())
      if (p.shortened) {
        const double a = axis().x(p.t0), b = axis().x(p.t1);
        os_ << "<rect x=\"" << a << "\" y=\"" << y << "\" width=\"" << std::max(b - a, 1.0) << "\" height=\"" << h
            << "\" fill=\"url(#shortened)\" opacity=\"0.5\"/>\n";
      }
    if (labels) marker_labels(y, h);
  }

  void marker_labels(double y, double h) {
    // Step labels above the panel, thinned so they never overlap.
    double last = -1e9;
    for (const TimelineSlice* s : steps_) {
      const double x = (axis().x(s->start_ms) + axis().x(s->end_ms)) / 2;
      const std::string label = (steps_.size() <= 12 ? "step " : "") + std::to_string(s->index);
      const double half = 3.5 * static_cast<double>(label.size());
      if (x - half < last + 6) continue;
      text(x, y - 5, label, " text-anchor=\"middle\" fill=\"#b35c00\"");
      last = x + half;
    }
    // Micro-batch numbers under the panel, thinned likewise; epochs marked where they change.
    last = -1e9;
    int epoch = forwards_.empty() ? 0 : forwards_.front()->epoch;
    for (const TimelineSlice* f : forwards_) {
      const double x = axis().x(f->start_ms);
      if (f->epoch != epoch) {
        epoch = f->epoch;
        os_ << "<line x1=\"" << x << "\" y1=\"" << y << "\" x2=\"" << x << "\" y2=\"" << y + h
            << "\" stroke=\"#333\" stroke-width=\"1.2\"/>\n";
        text(x + 3, y + 12, "epoch " + std::to_string(epoch + 1), " fill=\"#333\"");
      }
      const std::string label = std::to_string(f->index + 1);
      if (x < last + 4) continue;
      text(x, y + h + 14, label, " text-anchor=\"middle\" fill=\"#666\" font-size=\"10\"");
      last = x + 6.0 * static_cast<double>(label.size());
    }
  }

  // One stacked band per category: the top edge along its upper level, back along its lower one,
  // held flat between samples (memory changes only at allocations and frees).
  // `base`: each category's level that counts as zero (the lower panel's window lows).
  void band(const char* element, const std::vector<const TimelineSample*>& pts,
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
    const double x_end = axis().x(w1_);
    std::vector<std::pair<double, double>> upper, lower;
    for (std::size_t i = 0; i < pts.size(); ++i) {
      const double xa = axis().x(pts[i]->ms), xb = i + 1 < pts.size() ? axis().x(pts[i + 1]->ms) : x_end;
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
    os_ << "<" << element << (is_path ? " d=\"" : " points=\"") << pth.str() << "\" fill=\"" << category_color(order[k])
        << "\" stroke=\"none\"><title>" << label_of(order[k]) << "</title></" << element << ">\n";
  }

  void byte_ticks(const ByteAxis& a, double y0, double h) {
    for (double b = 0; b <= a.max * (1 + 1e-9); b += a.step) {
      const double y = y0 + h - b / a.max * h;
      os_ << "<line x1=\"" << kLeft << "\" y1=\"" << y << "\" x2=\"" << kLeft + kPlotW << "\" y2=\"" << y
          << "\" stroke=\"#000\" stroke-opacity=\"0.08\"/>\n";
      text(kLeft - 6, y + 4, byte_tick(a, b), " text-anchor=\"end\"");
    }
    os_ << "<rect x=\"" << kLeft << "\" y=\"" << y0 << "\" width=\"" << kPlotW << "\" height=\"" << h
        << "\" fill=\"none\" stroke=\"#000\"/>\n";
  }

  // Top panel: everything, fixed costs at the bottom of the stack.
  void top_panel() {
    const std::vector<MemoryCategory> top_order(kStackOrder.begin(), kStackOrder.end());
    const ByteAxis top_axis = byte_axis(static_cast<double>(lv_.top_max));
    text(kLeft, kTopY - 8, "all allocated memory, stacked by category", " font-weight=\"bold\"");
    markers(kTopY, kTopH, false);
    const auto top_pts = thin(samples_, axis(), [](const TimelineSample& s) {
      int64_t t = 0;
      for (int64_t v : s.bytes) t += v;
      return t;
    });
    for (std::size_t k = 0; k < top_order.size(); ++k)
      band("path", top_pts, top_order, std::array<int64_t, kNumMemoryCategories>{}, k, kTopY, kTopH, top_axis.max);
    byte_ticks(top_axis, kTopY, kTopH);
  }

  // Bottom panel: the changing part alone.
  void bottom_panel() {
    const ByteAxis bot_axis = byte_axis(static_cast<double>(lv_.bottom_max));
    text(kLeft, kBotY - 46, "what changes: the accumulation sawtooth", " font-weight=\"bold\"");
    text(kLeft, kBotY - 31,
         "each category above its lowest level in this window (all else, " + format_bytes(lv_.fixed_bytes) +
             ", is fixed here), on its own scale",
         " fill=\"#444\"");
    std::string not_drawn;
    for (MemoryCategory c : lv_.left_out) {
      const auto i = static_cast<std::size_t>(c);
      not_drawn += std::string(not_drawn.empty() ? "not drawn (see the top panel): " : "; ") + label_of(c) + ", " +
                   format_bytes(lv_.hi[i] - lv_.lo[i]) + " allocated once " + phase_at(lv_.grew_at[i]);
    }
    if (!not_drawn.empty()) text(kLeft, kBotY - 17, not_drawn, " fill=\"#444\"");
    markers(kBotY, kBotH, true);
    const Levels& lv = lv_;
    const auto bot_pts = thin(samples_, axis(), [&lv](const TimelineSample& s) { return lv.bottom_total(s); });
    for (std::size_t k = 0; k < lv_.changing.size(); ++k)
      band("polygon", bot_pts, lv_.changing, lv_.lo, k, kBotY, kBotH, bot_axis.max);
    byte_ticks(bot_axis, kBotY, kBotH);
    text(kLeft - 6, kBotY + kBotH + 14, "micro-batch", " text-anchor=\"end\" fill=\"#666\" font-size=\"10\"");
  }

  // Time axis: real milliseconds since the window's start, ticks skipped inside shortened
  // intervals. Returns the baseline of its tick labels.
  double time_axis() {
    const double axis_y = kBotY + kBotH + 32;
    const double raw = axis().drawn_ms() / 10.0;
    const double mag = std::pow(10.0, std::floor(std::log10(std::max(raw, 1e-6))));
    double step = 10 * mag;
    for (double m : {1.0, 2.0, 5.0})
      if (m * mag >= raw) {
        step = m * mag;
        break;
      }
    double last = -1e9;
    for (double t = 0; w0_ + t <= w1_ + 1e-9; t += step) {
      if (axis().inside_shortened(w0_ + t)) continue;
      const double x = axis().x(w0_ + t);
      if (x < last + 55) continue;
      os_ << "<line x1=\"" << x << "\" y1=\"" << kBotY + kBotH << "\" x2=\"" << x << "\" y2=\"" << kBotY + kBotH + 4
          << "\" stroke=\"#000\"/>\n";
      text(x, axis_y, fmt(step < 0.1 ? "%.2f" : step < 1 ? "%.1f" : "%.0f", t) + " ms", " text-anchor=\"middle\"");
      last = x;
    }
    // Break marks where the axis is shortened.
    for (const Interval& p : axis().parts())
      if (p.shortened) {
        const double x = (axis().x(p.t0) + axis().x(p.t1)) / 2;
        for (double dx : {-2.5, 2.5})
          os_ << "<line x1=\"" << x + dx - 3 << "\" y1=\"" << kBotY + kBotH + 5 << "\" x2=\"" << x + dx + 3
              << "\" y2=\"" << kBotY + kBotH - 5 << "\" stroke=\"#000\" stroke-width=\"1.5\"/>\n";
      }
    text(kLeft + kPlotW / 2, axis_y + 18, "time since the first micro-batch shown began (host clock)",
         " text-anchor=\"middle\"");
    return axis_y;
  }

  // Footnotes: the shortened intervals with their true durations; the marker legend.
  void footnotes(double axis_y) {
    double foot_y = axis_y + 40;
    std::string shortened;
    int n_short = 0;
    for (const Interval& p : axis().parts())
      if (p.shortened) {
        if (n_short < 4)
          shortened += std::string(n_short ? "; " : "") + describe_interval(p) + " " + fmt_ms(p.t1 - p.t0);
        ++n_short;
      }
    if (n_short > 4) shortened += "; and " + std::to_string(n_short - 4) + " more";
    if (n_short > 0) {
      os_ << "<rect x=\"" << kLeft << "\" y=\"" << foot_y - 10
          << "\" width=\"14\" height=\"12\" fill=\"url(#shortened)\" stroke=\"#777\"/>\n";
      text(kLeft + 20, foot_y, "drawn shortened on the time axis: " + shortened);
      foot_y += 18;
    }
    os_ << "<rect x=\"" << kLeft << "\" y=\"" << foot_y - 10 << "\" width=\"14\" height=\"12\" fill=\"#fde6c8\"/>\n";
    text(kLeft + 20, foot_y, "optimizer step", "");
    os_ << "<line x1=\"" << kLeft + 130 << "\" y1=\"" << foot_y - 10 << "\" x2=\"" << kLeft + 130 << "\" y2=\""
        << foot_y + 2 << "\" stroke=\"#999\" stroke-dasharray=\"2,3\"/>\n";
    text(kLeft + 138, foot_y, "start of a micro-batch (forward, then backward)", "");
  }

  // Legend: per category its range in the window, the lower panel's categories first.
  void legend() {
    double ly = kTopY + 6;
    const double lx = kLeft + kPlotW + 18;
    text(lx, ly, "in this window", " font-weight=\"bold\"");
    ly += 8;
    for (bool want_changing : {true, false}) {
      ly += 16;
      text(lx, ly, want_changing ? "changing (both panels)" : "top panel only", " fill=\"#444\"");
      for (auto it = kStackOrder.rbegin(); it != kStackOrder.rend(); ++it) {
        const MemoryCategory c = *it;
        const auto i = static_cast<std::size_t>(c);
        if (lv_.is_changing(c) != want_changing) continue;
        ly += 18;
        os_ << "<rect x=\"" << lx << "\" y=\"" << ly - 10 << "\" width=\"12\" height=\"12\" fill=\""
            << category_color(c) << "\"/>\n";
        std::string range = format_bytes(lv_.hi[i]);
        if (lv_.lo[i] != lv_.hi[i])
          range =
              (lv_.lo[i] == 0 ? "" : format_bytes(lv_.lo[i]) + " + ") + "up to " + format_bytes(lv_.hi[i] - lv_.lo[i]);
        text(lx + 18, ly, label_of(c) + "  " + range);
      }
    }
    // Optimizer state placed on the host is in no device category: said beside them, not stacked.
    if (const int64_t host = tracker_.summary().host_optimizer_state_bytes; host > 0)
      text(lx, ly + 28, "optimizer state on the host  " + format_bytes(host) + " (not drawn: not device memory)",
           " fill=\"#444\"");
  }

  MemoryTracker& tracker_;
  const MemoryTracker::Options& o_;
  const std::vector<TimelineSample>& samples_;
  const std::vector<TimelineSlice>& slices_;
  std::vector<const TimelineSlice*> forwards_, steps_;  // the window's forward and step phases
  std::ostringstream os_;
  double w0_ = 0, w1_ = 0;  // the window, host-clock ms
  std::optional<TimeAxis> axis_;
  Levels lv_;
};

}  // namespace

std::string memory_plot_svg(MemoryTracker& tracker) { return SvgPlot(tracker).render(); }

}  // namespace cumulus::memory
