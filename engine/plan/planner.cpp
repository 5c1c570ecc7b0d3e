#include "cumulus/plan/planner.h"

// Note [Planning a micro-batch]
// plan_batch answers "which micro-batch, accumulated how many times, trains within this budget?"
// for a budget in reserved bytes, because that is what a device (or CachingAllocator's limit) runs
// out of. The first optimizer step allocates the optimizer's state (AdamW: two copies of the
// parameters) and every later micro-batch runs beside it, so a plan made before that step must
// hold it: a peak measured without it says a micro-batch fits that runs out of memory at step one.
//
// So the table predicts every divisor of the effective batch from the recorded allocation sequence
// (Note [Memory prediction]), replayed from the state at rest plus the optimizer's state. The
// optimizer says what that is (Optimizer::state_to_allocate()), so any optimizer is counted without
// the planner knowing it. The chosen row is verified by one real micro-batch under the budget, the
// state held as real blocks; a probe that runs out of memory moves the choice to the next best row,
// so a prediction that is off costs a probe, not the run. Without a budget there is nothing to
// verify against: every row fits and the fastest is taken unprobed.
//
// The request takes a function that runs one training micro-batch rather than a model, so any
// model, loss and data path plans the same way (the app's loader stages host-resident data, for
// instance); what that function allocates is what is predicted, plus the blocks the loop will hold
// that neither exist now nor come from it, which the caller names (PlanRequest::loop_state: the
// Trainer's learning-rate table). Each setting of the levers (Note [Plan levers]) is recorded and
// predicted on its own. Among the rows predicted to fit, the one predicted fastest wins (Note
// [Predicting time]); times within 2% are a tie (Note [Plan levers]). Probes are training
// forwards, so batch norm's running statistics are copied first and written back, also when an
// interrupt thrown from the micro-batch ends the call. The planner prints nothing: the caller shows
// plan.table and plan.reason, and on_table lets it show the table before the probes, which may take
// long. No choice is a plan with micro_batch 0 rather than an exception, so --plan-only can still
// show why. When the recordings do not match (an allocation pattern that changes with the size),
// the fallback is a line through two small probes' allocated peaks on top of the reserved bytes at
// rest and the state (each block in a segment of its own), with a 5% margin, verified the same way.

// Note [Predicting time]
// The recordings already run the micro-batch at every power of two up to 256 (and the midpoints
// that pin the memory's bends), so each call is timed too, all but the first (one-time work), and
// each size is run again until it has timing_repeats (3) timings, so that one slow call (another
// process on a shared machine, a page fault) cannot move a whole prediction. The median per size,
// then a line a + b * units by least squares on relative residuals, since the sizes span 1 to 256
// and plain residuals would let the largest set the fixed part; the same line through each size's
// fastest and slowest timing is the prediction's spread (PlanRow::batch_seconds_low/high),
// reported with it. Injected timings are not repeated.
//
// A line, so within one lever setting a larger micro-batch is never slower: the fixed part a call
// costs is what accumulation pays for, and recompute's extra forward is what its own line carries.
// One effective batch is accum_steps micro-batches plus one optimizer step, an epoch that times
// epoch_units / effective batch. The step is the same for every row, so it moves no choice, only
// the prediction: it is probed with the parameters, the state and the update count written back,
// and an optimizer without its state yet gets one for the probe and loses it after, so the plan
// counts the state as the first real step will allocate it (unless the caller gives step_seconds). Tests and callers
// that know their timings inject them (micro_batch_seconds): measured times of near-empty
// micro-batches are noise, and a choice made from noise would not be reproducible.
//
// The step is probed with the state where the row puts it (each state setting is a planning of its
// own, the optimizer placed first): a row with the state on the host times the update through the
// host, its copies included, and a ZeRO row the update of its rank's shard. What the probes cannot
// time is the ranks' communication, since they run in one process over a world whose collectives
// move nothing (Note [Plan levers]). So each row adds the collectives its setting makes in one
// effective batch (engine/plan/communication.cpp), from lines measured on the training
// communicator before planning (PlanRequest::collective_times, Note [Collective time model] in
// engine/dist/collective_times.cpp): stages 0 and 1 all-reduce every gradient bucket once a step
// (PlanRequest::bucket_bytes, cut as the Trainer cuts them), stage 2 reduce-scatters every bucket
// after each of the rank's accum_steps backwards (so there accumulation costs rounds, and a larger
// micro-batch saves them) and sums the shards' norms, stages 1 and 2 all-gather the weights after
// the update, and every stage sums the step's units and loss. Stage 2's local work (the buckets'
// buffers, adding a part into the shard) is in its probes already; only the transport is added.
// Every collective counts in full: overlap with the backward is not modelled, because what it
// saves depends on where the transfer runs. Stages 0 and 1 start their buckets during the last
// backward, and between CPU processes MPI moves and sums them inside its progress calls, on the
// cores that run the backward: the step then hardly waits, but the work is not free, so the full
// count is an upper bound there (and under NCCL, whose reductions run beside the backward). Stage
// 2's reduce-scatters block, so its rounds are paid as counted. Not counted: the step's norm and
// decision besides the update (the probe is Optimizer::step), a short last group's rounds of
// zeros, and ranks slower than the one planned for: a blocking collective waits for the slowest
// rank, and on a loaded machine that wait can exceed the transfer.

// Note [Probing what the job runs]
// Sizes are units (samples, or tokens with units_per_row T: Note [Units] in the Trainer), every
// size a whole number of rows; the predictor itself counts rows. The largest recording is the
// largest power of two of rows within the effective batch (max_probe asks for more), and every
// recording runs under the budget, so no plan rests on memory the job never has: a probe larger
// than the effective batch, or one run with the limit lifted, measures a job that will not run.
// A recording that runs out of memory halves the sizes, and when none fits the fallback's probes
// run under the budget too (out of memory there: no plan, with the reason). plan.probe_seconds and
// plan.largest_probe say what the probes cost.

// Note [Plan levers]
// Besides the micro-batch, a plan sets three levers, each a PlanSetting field the caller's apply()
// puts in place: which recompute segments run again in backward (any subset of those the model
// names), where the training set lives (the device, or the host with each batch staged), and the
// precision of the batches. The planner does not model what a lever does; it records and times
// the micro-batch with each setting in place, so a lever costs one recording and its memory and
// time are measured, not assumed (recompute's saving depends on where the peak is: Note [CNN
// recompute segments] in models/cnn.cpp). What is weighed: the request's own setting first, then
// for its precision and each precision the caller opted into, every subset of the segments.
// Host-resident data is weighed only when none of those fits: its cost is a copy of each batch
// over the bus, and a host plan chosen over a device plan within the noise of two timings would
// make every later step pay that copy for nothing. Precision changes the numbers, so it is never
// weighed without the opt-in. Last, the optimizer's state, each lever only when nothing fits
// without it, in this order: in 8 bits (Optimizer::set_state_bits: 26.6% of its bytes, other
// numbers, so an opt-in like precision), then on the host (Optimizer::place_state: none of its
// bytes on the device, the same numbers, for a copy of the weights and gradients over the bus at
// each step, which 8 bits on the device do not pay). The host at 8 bits is never weighed: on the
// device it holds what the host at 32 holds. Each is a planning of the same request with the state
// set so (the held blocks the rows are replayed over lose the state's bytes), whose rows join the
// earlier ones in one table; the micro-batch's recordings do not depend on it.
//
// Data parallel training over PlanRequest::world_size ranks is planned for one rank (the root
// plans for all: its shard is the largest): the effective batch is that rank's part, and its ZeRO
// stage is a state lever too, weighed before 8 bits and the host (opted in: stage 2 sums in another
// order), each stage only when nothing fits below it: 1 keeps the rank's shard of the optimizer
// state, 2 its shard of the gradients too, every probe's backward reducing its buckets as a
// Trainer's would (ZeroInPlace) over a world whose collectives move nothing
// (dist::Communicator::alone). So a row is that rank's memory, recorded in one process as for any
// other lever; its time adds the communication its stage makes, from the collectives' measured
// lines (Note [Predicting time]): stage 2 pays a round of reduce-scatters per micro-batch, so
// among its rows fewer, larger micro-batches gain.
//
// Times within 2% are a tie: measured fits are noisy (a loaded machine, an intercept near zero),
// and a tie broken by memory alone would slide to micro-batch 2 with recompute for a 1%
// difference, changing batch norm's statistics for nothing. Within a tie the first row in table
// order wins if it is in the tie (the largest micro-batch that fits, with the request's setting:
// recompute only if needed), else the one reserving the least; a tie in time keeps the request's
// precision, so a 16-bit plan wins only by being more than 2% faster or by being the only one that
// fits. The table lists every weighed setting for every divisor, largest first.

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <numeric>
#include <utility>

#include "cumulus/core/error.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/memory/category.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/module.h"
#include "cumulus/optim/optimizer.h"
#include "engine/plan/communication.h"
#include "engine/plan/fits.h"
#include "engine/plan/prediction.h"
#include "engine/plan/zero_in_place.h"

namespace cumulus::plan {

int64_t parse_byte_size(const std::string& text) {
  const char* s = text.c_str();
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(s, &end);
  const bool number_ok =
      end != s && errno == 0 && std::isfinite(value) && value >= 0 && !std::isspace(static_cast<unsigned char>(*s));
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
                "' (expected a number of bytes with an optional unit: B, KiB, MiB, GiB, TiB, KB, MB, GB, TB; e.g. "
                "64MiB, 1.5GiB)");
  CUMULUS_CHECK(mult > 1 || std::floor(value) == value, InvalidArgument, "invalid size '", text,
                "': a byte count must be a whole number");
  return static_cast<int64_t>(std::llround(bytes));
}

MemoryCost memory_cost_from_probes(int64_t small, int64_t small_peak, int64_t large, int64_t large_peak) {
  CUMULUS_CHECK(0 < small && small < large, InvalidArgument, "memory_cost_from_probes: need 0 < small < large, got ",
                small, " and ", large);
  MemoryCost c;
  c.peak_bytes_per_unit =
      std::max(0.0, static_cast<double>(large_peak - small_peak) / static_cast<double>(large - small));
  c.fixed_bytes =
      std::max<int64_t>(0, small_peak - static_cast<int64_t>(c.peak_bytes_per_unit * static_cast<double>(small)));
  return c;
}

TimeFit fit_time(const std::vector<std::pair<int64_t, double>>& timings) {
  std::map<int64_t, std::vector<double>> by_size;
  for (const auto& [units, seconds] : timings) by_size[units].push_back(seconds);
  std::vector<std::pair<double, double>> points;  // (units, median seconds)
  for (auto& [units, secs] : by_size) {
    std::sort(secs.begin(), secs.end());
    const std::size_t n = secs.size();
    const double median = n % 2 == 1 ? secs[n / 2] : 0.5 * (secs[n / 2 - 1] + secs[n / 2]);
    points.emplace_back(static_cast<double>(units), median);
  }
  TimeFit fit;
  fit.probes = static_cast<int>(points.size());
  if (points.empty()) return fit;
  if (points.size() == 1) {
    fit.seconds_per_unit = std::max(0.0, points[0].second / points[0].first);
    return fit;
  }
  // Weighted by 1/seconds^2 (relative residuals): the probes span 1 to 256 units, and plain
  // least squares would let the large ones' noise set the fixed part the small ones measure.
  double sw = 0, sx = 0, sy = 0;
  for (const auto& [x, y] : points) {
    const double w = y > 0 ? 1.0 / (y * y) : 1.0;
    sw += w, sx += w * x, sy += w * y;
  }
  const double mx = sx / sw, my = sy / sw;
  double sxx = 0, sxy = 0;
  for (const auto& [x, y] : points) {
    const double w = y > 0 ? 1.0 / (y * y) : 1.0;
    sxx += w * (x - mx) * (x - mx), sxy += w * (x - mx) * (y - my);
  }
  fit.seconds_per_unit = std::max(0.0, sxy / sxx);
  fit.fixed_seconds = my - fit.seconds_per_unit * mx;
  if (fit.fixed_seconds < 0) {  // a line that would make small micro-batches take negative time
    fit.fixed_seconds = 0;
    double sxy0 = 0, sxx0 = 0;
    for (const auto& [x, y] : points) {
      const double w = y > 0 ? 1.0 / (y * y) : 1.0;
      sxy0 += w * x * y, sxx0 += w * x * x;
    }
    fit.seconds_per_unit = std::max(0.0, sxy0 / sxx0);
  }
  return fit;
}

namespace {

constexpr double kLineMargin = 0.05;              // the probe line's room for what it misses (rounding, segments)
constexpr double kTimeTie = 0.02;                 // predicted times this close are a tie (Note [Plan levers])
constexpr std::size_t kMaxRecomputeSegments = 4;  // 16 settings a precision, each recorded

int64_t round_up(int64_t bytes, int64_t unit) { return (bytes + unit - 1) / unit * unit; }

// Divisors of n, largest first (found up to its square root: n may be 2^31).
std::vector<int64_t> divisors_largest_first(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d * d <= n; ++d)
    if (n % d == 0) {
      out.push_back(d);
      if (d * d != n) out.push_back(n / d);
    }
  std::sort(out.rbegin(), out.rend());
  return out;
}

// Copies of a module's buffers, written back on destruction: probes are training forwards and
// move batch norm's running statistics.
class BufferRestore {
 public:
  explicit BufferRestore(nn::Module* model) : model_(model) {
    if (model_ == nullptr) return;
    for (const auto& [name, t] : model_->named_buffers()) saved_.push_back(t.clone());
  }
  ~BufferRestore() {
    if (model_ == nullptr) return;
    std::size_t i = 0;
    for (const auto& [name, t] : model_->named_buffers()) {
      Tensor target = t;
      target.copy_from(saved_[i++]);
    }
  }
  BufferRestore(const BufferRestore&) = delete;
  BufferRestore& operator=(const BufferRestore&) = delete;

 private:
  nn::Module* model_;
  std::vector<Tensor> saved_;
};

// What a row needs: reserved bytes, or the peak where the fallback predicts no reserved bytes.
int64_t row_memory(const PlanRow& r) { return r.reserved_bytes >= 0 ? r.reserved_bytes : r.peak_bytes; }

// The steps of one plan_batch call and what they share.
class Planner {
 public:
  Planner(const PlanRequest& request, CachingAllocator& alloc);
  Plan run();

 private:
  void put_in_place(const PlanSetting& setting);
  void restore_request_setting();
  std::vector<PlanSetting> settings_with(DataPlacement data) const;
  MemoryPredictor record(const PlanSetting& setting);
  bool weigh(const PlanSetting& setting);
  bool any_fits() const;
  void time_step();
  void set_times(PlanRow& row) const;
  std::vector<PlanRow> rows_from(const MemoryPredictor& predictor, const PlanSetting& setting) const;
  bool probe(const PlanRow& row, MemoryStats& measured);
  int64_t line_probe(int64_t micro_batch);
  // Every micro-batch the planner runs goes through here (units): its time is the probes' time.
  double run_micro_batch(int64_t units);
  bool probing() const { return req_.verify && req_.budget > 0; }
  std::size_t best(const std::vector<bool>& excluded) const;
  std::size_t pick(MemoryStats& measured);
  void choose_from_recording();
  MemoryCost line_cost();
  void fill_line_table(const MemoryCost& cost, int64_t usable);
  void explain_line_pick(std::size_t i, const MemoryCost& cost, int64_t usable);
  void plan_with_line(const std::string& why_not_recorded);
  std::string setting_text(const PlanSetting& setting) const;
  std::string steps_text(const PlanRow& row) const;
  std::string time_text(const PlanRow& row) const;
  std::string why_text(std::size_t chosen) const;
  std::string budget_text() const;

  const PlanRequest& req_;
  CachingAllocator& alloc_;
  std::vector<int64_t> state_;     // the optimizer state's blocks, requested bytes
  std::vector<FixedBlock> held_;   // those and the loop's (PlanRequest::loop_state): in every row
  std::vector<int64_t> divisors_;  // units, whole rows
  int64_t g_ = 1;                  // units per row: recordings and probes are whole rows
  int64_t large_ = 0;              // recordings at large_ and large_ / 2 rows
  std::string record_failure_;     // why the request's setting could not be recorded, if so
  int64_t epoch_units_ = 0;
  PlanSetting in_place_;                                  // what apply last put in place
  ReductionLayout reductions_;                            // what the ranks' collectives move
  std::vector<std::pair<int64_t, double>> line_timings_;  // the fallback's probes
  Plan plan_;
};

Planner::Planner(const PlanRequest& request, CachingAllocator& alloc)
    : req_(request),
      alloc_(alloc),
      state_(request.optimizer->state_to_allocate()),
      g_(request.units_per_row),
      epoch_units_(request.epoch_units > 0 ? request.epoch_units : request.unit_limit),
      in_place_(request.setting) {
  for (int64_t rows : divisors_largest_first(req_.effective_batch / g_)) divisors_.push_back(rows * g_);
  // 128 and 256 rows make each size's fit exact (Note [Memory prediction]); smaller when the rows
  // are few, and never above what the job runs: the effective batch, unless max_probe asks for more.
  const int64_t cap = std::max(req_.effective_batch, req_.max_probe) / g_;
  large_ = 256;
  while (large_ > cap || (req_.unit_limit > 0 && large_ > req_.unit_limit / g_)) large_ /= 2;
  plan_.timing_repeats = req_.micro_batch_seconds ? 1 : req_.timing_repeats;
  for (int64_t b : state_) {
    plan_.optimizer_state_bytes += round_up(b, CachingAllocator::kRounding);
    held_.push_back(FixedBlock{MemoryCategory::optimizer_state, b});
  }
  for (int64_t b : req_.loop_state) held_.push_back(FixedBlock{MemoryCategory::other, b});
  plan_.recompute_segments = req_.recompute_segments;
  plan_.setting = req_.setting;
  plan_.collective_times = req_.collective_times;
  if (req_.collective_times.world_size > 1)
    reductions_ = reduction_layout(req_.optimizer->parameters(), req_.bucket_bytes);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void Planner::put_in_place(const PlanSetting& setting) {
  if (!req_.apply || setting == in_place_) return;
  req_.apply(setting);
  in_place_ = setting;
}

// The request's setting back when no plan is chosen or an exception leaves, without the budget's
// limit: that setting held its memory before the budget applied (the splits on the device with
// --data-on auto, which the budget may not leave room for).
void Planner::restore_request_setting() {
  const MemoryLimitScope unlimited(alloc_, 0);
  put_in_place(req_.setting);
}

// The settings to weigh with the training set at `data`, the request's first: its precision, then
// the precisions opted in; within each, every subset of the recompute segments (or those of
// recompute_masks).
std::vector<PlanSetting> Planner::settings_with(DataPlacement data) const {
  std::vector<Precision> precisions{req_.setting.precision};
  for (Precision p : req_.precisions)
    if (std::find(precisions.begin(), precisions.end(), p) == precisions.end()) precisions.push_back(p);
  std::vector<uint32_t> masks = req_.recompute_masks;
  if (masks.empty() && req_.apply && !req_.recompute_segments.empty())
    for (uint32_t mask = 0; mask < uint32_t{1} << req_.recompute_segments.size(); ++mask) masks.push_back(mask);
  if (masks.empty()) masks.push_back(req_.setting.recompute);
  std::vector<PlanSetting> out;
  for (Precision p : precisions)
    for (uint32_t mask : masks) {
      PlanSetting s = req_.setting;
      s.recompute = mask;
      s.data = data;
      s.precision = p;
      out.push_back(s);
    }
  // The request's own setting first (with segments given and some on, it is not mask 0).
  const auto own = std::find(out.begin(), out.end(), req_.setting);
  if (own != out.end()) std::rotate(out.begin(), own, own + 1);
  return out;
}

// A line through each size's fastest (low) or slowest (high) timing: the prediction's spread.
TimeFit fit_time_extreme(const std::vector<std::pair<int64_t, double>>& timings, bool high) {
  std::map<int64_t, double> by_size;
  for (const auto& [units, seconds] : timings) {
    auto [it, inserted] = by_size.try_emplace(units, seconds);
    if (!inserted) it->second = high ? std::max(it->second, seconds) : std::min(it->second, seconds);
  }
  return fit_time(std::vector<std::pair<int64_t, double>>(by_size.begin(), by_size.end()));
}

double Planner::run_micro_batch(int64_t units) {
  plan_.largest_probe = std::max(plan_.largest_probe, units);
  const auto start = std::chrono::steady_clock::now();
  struct Count {  // counted when an OutOfMemory leaves too
    Plan& plan;
    std::chrono::steady_clock::time_point start;
    ~Count() { plan.probe_seconds += seconds_since(start); }
  } count{plan_, start};
  req_.micro_batch(units);
  return seconds_since(start);
}

// Records the micro-batch's allocations with `setting` in place, under the budget (a recording that
// runs out of memory halves the sizes), and fits its time over the same calls but the first, each
// size timed timing_repeats times in all (Note [Predicting time]).
MemoryPredictor Planner::record(const PlanSetting& setting) {
  put_in_place(setting);
  for (int64_t large = large_; large >= 2; large /= 2) {
    std::vector<std::pair<int64_t, double>> timings;
    bool warm = false;
    auto timed = [&](int64_t rows) {
      const int64_t units = rows * g_;
      const double seconds = run_micro_batch(units);
      if (warm)
        timings.emplace_back(units, req_.micro_batch_seconds ? req_.micro_batch_seconds(units, setting) : seconds);
      warm = true;
    };
    MemoryPredictor p;
    try {
      p = record_micro_batch(alloc_, timed, large / 2, large, held_, /*lift_limit=*/false);
    } catch (const OutOfMemory&) {
      req_.optimizer->zero_grad();  // a backward cut short may have written some
      alloc_.empty_cache();
      record_failure_ =
          "a recording of " + std::to_string(large * g_) + " units ran out of memory under " + budget_text();
      continue;
    }
    if (!p.ok()) return p;
    // The repeats: every size timed once more per repeat, so one slow call (another process, a
    // page fault) moves the median nothing and shows in the spread.
    if (!req_.micro_batch_seconds) {
      std::vector<int64_t> sizes;
      for (const auto& t : timings)
        if (std::find(sizes.begin(), sizes.end(), t.first) == sizes.end()) sizes.push_back(t.first);
      for (int r = 1; r < req_.timing_repeats; ++r)
        for (int64_t units : sizes) timings.emplace_back(units, run_micro_batch(units));
      alloc_.empty_cache();
    }
    if (large != large_) large_ = large;  // the other settings start where this one fitted
    plan_.weighed.push_back(Plan::Weighed{setting, fit_time(timings), p.rest_reserved(), 0,
                                          fit_time_extreme(timings, false), fit_time_extreme(timings, true)});
    return p;
  }
  return {};
}

// Records and predicts every divisor with a setting other than the first; false when its
// recordings did not match (the prediction says so, and it is left out).
bool Planner::weigh(const PlanSetting& setting) {
  const MemoryPredictor predictor = record(setting);
  if (!predictor.ok()) {
    plan_.prediction += "; " + setting_text(setting) + " not predicted: " + predictor.reason();
    return false;
  }
  for (PlanRow& r : rows_from(predictor, setting)) plan_.table.push_back(r);
  return true;
}

bool Planner::any_fits() const {
  return std::any_of(plan_.table.begin(), plan_.table.end(), [](const PlanRow& r) { return r.fits; });
}

// One optimizer step's time: given, or one step probed on the discarded gradients (counted as
// zero) with the parameters, the state and the update count written back. An optimizer without
// its state yet takes two steps, the first allocating the state (page faults and zeroing the
// steady state never pays), the second timed, and is left without it (Optimizer::discard_state).
void Planner::time_step() {
  if (req_.step_seconds >= 0) {
    plan_.step_seconds = req_.step_seconds;
    plan_.step_timed = true;
    return;
  }
  optim::Optimizer& opt = *req_.optimizer;
  const bool fresh = opt.next_update_allocates();
  Tensor values;
  std::vector<std::pair<std::string, Tensor>> state;
  const int64_t updates = opt.updates();
  try {
    values = opt.parameters().values().clone();
    for (const auto& [name, t] : opt.state()) state.emplace_back(name, t.clone());
    if (fresh) opt.step();
    const auto start = std::chrono::steady_clock::now();
    opt.step();
    opt.updates();  // waits for the queued update
    plan_.step_seconds = seconds_since(start);
    plan_.step_timed = true;
  } catch (const OutOfMemory&) {
    // No room under the budget for the copies or the state: not probed.
  }
  if (values.defined()) {
    Tensor target = opt.parameters().values();
    target.copy_from(values);
  }
  if (fresh) opt.discard_state();
  else opt.load_state(state, updates);
}

void Planner::set_times(PlanRow& r) const {
  const Plan::Weighed* weighed = nullptr;
  for (const Plan::Weighed& w : plan_.weighed)
    if (w.setting == r.setting) weighed = &w;
  r.communication_seconds =
      communication_seconds(req_.collective_times, reductions_, r.setting.zero_stage, r.accum_steps);
  const auto batch = [&](const TimeFit& fit) {
    return static_cast<double>(r.accum_steps) * fit.predict(r.micro_batch) + plan_.step_seconds +
           r.communication_seconds;
  };
  const TimeFit fit = weighed ? weighed->time : TimeFit();
  r.micro_batch_seconds = fit.predict(r.micro_batch);
  r.batch_seconds = batch(fit);
  r.batch_seconds_low =
      weighed && weighed->time_low.probes > 0 ? std::min(batch(weighed->time_low), r.batch_seconds) : r.batch_seconds;
  r.batch_seconds_high =
      weighed && weighed->time_high.probes > 0 ? std::max(batch(weighed->time_high), r.batch_seconds) : r.batch_seconds;
  r.epoch_seconds = r.batch_seconds * static_cast<double>(epoch_units_) / static_cast<double>(req_.effective_batch);
}

std::vector<PlanRow> Planner::rows_from(const MemoryPredictor& predictor, const PlanSetting& setting) const {
  std::vector<PlanRow> rows;
  for (int64_t b : divisors_) {
    const PredictedMemory m = predictor.predict(b / g_);  // the predictor counts rows
    PlanRow r;
    r.micro_batch = b;
    r.accum_steps = req_.effective_batch / b;
    r.peak_bytes = m.peak_bytes;
    r.reserved_bytes = m.reserved_bytes;
    r.peak_by_category = m.peak_by_category;
    r.fits = req_.budget <= 0 || m.reserved_bytes <= req_.budget;
    r.setting = setting;
    set_times(r);
    rows.push_back(r);
  }
  return rows;
}

// One micro-batch of a row under the budget beside the optimizer state, its setting in place;
// false if it ran out of memory.
bool Planner::probe(const PlanRow& row, MemoryStats& measured) {
  bool fits = true;
  try {
    put_in_place(row.setting);
    std::vector<Allocation> held;
    for (const FixedBlock& b : held_) held.push_back(alloc_.allocate(static_cast<std::size_t>(b.bytes), b.category));
    alloc_.reset_peak();
    run_micro_batch(row.micro_batch);
  } catch (const OutOfMemory&) {
    fits = false;
    req_.optimizer->zero_grad();  // a backward cut short may have written some
  }
  measured = alloc_.stats();
  alloc_.empty_cache();
  return fits;
}

// The allocated peak of one micro-batch (the fallback's line), and its time.
int64_t Planner::line_probe(int64_t micro_batch) {
  alloc_.reset_peak();
  double seconds = 0;
  try {
    seconds = run_micro_batch(micro_batch);
  } catch (const OutOfMemory&) {
    req_.optimizer->zero_grad();
    throw;
  }
  line_timings_.emplace_back(micro_batch,
                             req_.micro_batch_seconds ? req_.micro_batch_seconds(micro_batch, req_.setting) : seconds);
  return alloc_.stats().allocated_peak;
}

// The row the choice takes among those predicted to fit and not excluded (table.size() when
// none), by the rule of Note [Plan levers]: the smallest predicted time; within kTimeTie of it,
// rows with the request's precision when there are any, of those the first in table order (the
// largest micro-batch, the request's setting first) when it is in the tie, else the least memory
// (reserved bytes, or the peak where the fallback predicts no reserved bytes), then the larger
// micro-batch.
std::size_t Planner::best(const std::vector<bool>& excluded) const {
  const std::vector<PlanRow>& t = plan_.table;
  const std::size_t none = t.size();
  double fastest = 0;
  for (std::size_t i = 0; i < t.size(); ++i)
    if (t[i].fits && !excluded[i] && (fastest == 0 || t[i].batch_seconds < fastest)) fastest = t[i].batch_seconds;
  const auto tied = [&](std::size_t i) {
    return t[i].fits && !excluded[i] && t[i].batch_seconds <= fastest * (1.0 + kTimeTie);
  };
  const bool own_precision_ties = [&] {
    for (std::size_t i = 0; i < t.size(); ++i)
      if (tied(i) && t[i].setting.precision == req_.setting.precision) return true;
    return false;
  }();
  const auto candidate = [&](std::size_t i) {
    return t[i].fits && !excluded[i] && (!own_precision_ties || t[i].setting.precision == req_.setting.precision);
  };
  std::size_t first = none;
  for (std::size_t i = 0; i < t.size() && first == none; ++i)
    if (candidate(i)) first = i;
  if (first == none || tied(first)) return first;
  std::size_t chosen = none;
  for (std::size_t i = 0; i < t.size(); ++i)
    if (candidate(i) && tied(i) && (chosen == none || row_memory(t[i]) < row_memory(t[chosen]))) chosen = i;
  return chosen;
}

// The best row that also fits its probe (none is run without a budget or with verify off);
// table.size() when none does. The chosen row's setting is left in place (the request's without
// a choice).
std::size_t Planner::pick(MemoryStats& measured) {
  std::vector<bool> excluded(plan_.table.size(), false);
  for (std::size_t i = best(excluded); i < plan_.table.size(); i = best(excluded)) {
    PlanRow& r = plan_.table[i];
    if (probing() && !probe(r, measured)) {
      plan_.rejected_by_probe.push_back(r.micro_batch);
      excluded[i] = true;
      continue;
    }
    put_in_place(r.setting);
    r.chosen = true;
    plan_.micro_batch = r.micro_batch;
    plan_.accum_steps = r.accum_steps;
    plan_.setting = r.setting;
    plan_.verified = probing();
    if (plan_.verified) {
      plan_.verified_peak_bytes = measured.allocated_peak;
      plan_.verified_reserved_bytes = measured.reserved_peak;
    }
    return i;
  }
  restore_request_setting();
  return plan_.table.size();
}

// The levers where `setting` differs from the request's, for messages: " with recompute
// conv1+bn1, data on host, bf16"; empty when it does not.
std::string Planner::setting_text(const PlanSetting& setting) const {
  std::string text;
  auto add = [&](const std::string& part) { text += (text.empty() ? " with " : ", ") + part; };
  if (setting.recompute != req_.setting.recompute)
    add("recompute " + recompute_text(setting.recompute, req_.recompute_segments));
  if (setting.data != req_.setting.data) add(std::string("data on ") + data_placement_name(setting.data));
  if (setting.precision != req_.setting.precision) add(precision_name(setting.precision));
  return text;
}

std::string Planner::steps_text(const PlanRow& row) const {
  return "micro-batch " + std::to_string(row.micro_batch) + " x " + std::to_string(row.accum_steps) +
         " steps = effective batch " + std::to_string(req_.effective_batch) + setting_text(row.setting);
}

std::string format_seconds(double seconds) {
  char text[32];
  if (seconds < 1.0) std::snprintf(text, sizeof text, "%.3g ms", seconds * 1e3);
  else std::snprintf(text, sizeof text, "%.3g s", seconds);
  return text;
}

std::string Planner::time_text(const PlanRow& row) const {
  std::string text = "predicted " + format_seconds(row.batch_seconds) + " an effective batch";
  if (plan_.timing_repeats > 1)
    text += " (" + format_seconds(row.batch_seconds_low) + " to " + format_seconds(row.batch_seconds_high) + " over " +
            std::to_string(plan_.timing_repeats) + " timings a size)";
  if (row.communication_seconds > 0) text += ", " + format_seconds(row.communication_seconds) + " of it collectives";
  if (epoch_units_ > 0) text += ", " + format_seconds(row.epoch_seconds) + " an epoch";
  if (!plan_.step_timed) text += " (optimizer step not timed)";
  if (req_.world_size > 1 && req_.collective_times.world_size == 1) text += " (communication not measured)";
  return text;
}

// What the probes cost: run with the plan's reason, after the verifying probe.
std::string probes_text(const Plan& plan) {
  return "; probes took " + format_seconds(plan.probe_seconds) + ", the largest " + std::to_string(plan.largest_probe) +
         " units";
}

// Why the chosen row won: the fastest, or within kTimeTie of the fastest with less memory; the
// training set on the host because nothing fits with it on the device; which probes ran out of
// memory; and the next larger micro-batch with the same setting, when it does not fit.
std::string Planner::why_text(std::size_t chosen) const {
  const std::vector<PlanRow>& t = plan_.table;
  std::size_t fastest = chosen;
  int fitting = 0;
  for (std::size_t i = 0; i < t.size(); ++i)
    if (t[i].fits) {
      ++fitting;
      if (t[i].batch_seconds < t[fastest].batch_seconds) fastest = i;
    }
  std::string text = fitting == 1 ? "the only candidate that fits"
                                  : "the fastest of " + std::to_string(fitting) + " candidates that fit";
  if (fastest != chosen) {  // a tie (Note [Plan levers]): say which rule kept it
    text = "within " + std::to_string(static_cast<int>(kTimeTie * 100)) + "% of the fastest, " +
           steps_text(t[fastest]) + " at " + format_seconds(t[fastest].batch_seconds);
    text += t[fastest].setting.precision != t[chosen].setting.precision ? ", which would change the precision"
            : row_memory(t[chosen]) < row_memory(t[fastest])            ? ", with less memory"
                                                                        : ", as the larger micro-batch with fewer "
                                                                          "levers changed";
  }
  if (t[chosen].setting.data != req_.setting.data)
    text += "; no plan with the training set on the " + std::string(data_placement_name(req_.setting.data)) + " fits";
  for (int64_t b : plan_.rejected_by_probe)
    text += "; micro-batch " + std::to_string(b) + " ran out of memory in its probe";
  std::size_t i = t.size();  // the smallest larger micro-batch that does not fit, with the chosen setting
  for (std::size_t j = 0; j < t.size() && t[j].micro_batch > t[chosen].micro_batch; ++j)
    if (!t[j].fits && t[j].setting == t[chosen].setting) i = j;
  if (i == t.size()) return text;
  const std::string larger = std::to_string(t[i].micro_batch);
  if (plan_.method == PlanMethod::probe_line)
    return text + "; the larger micro-batch " + larger + " would need " + format_bytes(t[i].peak_bytes);
  return text + "; micro-batch " + larger + " would reserve " + format_bytes(t[i].reserved_bytes);
}

// "parameters 48 MiB, gradients 48 MiB, optimizer_state 96 MiB": what a peak holds, largest first.
std::string categories_text(const std::array<int64_t, kNumMemoryCategories>& bytes) {
  std::vector<std::size_t> order;
  for (std::size_t c = 0; c < bytes.size(); ++c)
    if (bytes[c] > 0) order.push_back(c);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return bytes[a] > bytes[b]; });
  std::string text;
  for (std::size_t c : order)
    text += (text.empty() ? "" : ", ") + std::string(category_name(static_cast<MemoryCategory>(c))) + " " +
            format_bytes(bytes[c]);
  return text.empty() ? "nothing recorded" : text;
}

std::string Planner::budget_text() const {
  return req_.budget_name.empty() ? "the budget " + format_bytes(req_.budget) : req_.budget_name;
}

void Planner::choose_from_recording() {
  MemoryStats measured;
  const std::size_t i = pick(measured);
  if (i == plan_.table.size()) {
    const PlanRow* least = &plan_.table.back();
    for (const PlanRow& r : plan_.table)
      if (r.reserved_bytes < least->reserved_bytes) least = &r;
    plan_.reason = "no micro-batch dividing " + std::to_string(req_.effective_batch) + " fits " + budget_text() +
                   " (the least any candidate is predicted to reserve is " + format_bytes(least->reserved_bytes) +
                   ", a micro-batch of " + std::to_string(least->micro_batch) + " whose peak holds " +
                   categories_text(least->peak_by_category) + "; reserved at rest " +
                   format_bytes(plan_.reserved_at_rest) + ")";
    return;
  }
  const PlanRow& r = plan_.table[i];
  plan_.reason = steps_text(r) + ": predicted peak " + format_bytes(r.peak_bytes) + ", reserved " +
                 format_bytes(r.reserved_bytes) + "; " + time_text(r);
  if (req_.budget <= 0) {
    plan_.reason += " (no budget; " + why_text(i) + ")" + probes_text(plan_);
    return;
  }
  plan_.reason += "; within the budget " + format_bytes(req_.budget) + " (" + why_text(i) + ")";
  plan_.reason += plan_.verified ? "; verified by a probe micro-batch under the limit: peak " +
                                       format_bytes(plan_.verified_peak_bytes) + ", reserved " +
                                       format_bytes(plan_.verified_reserved_bytes)
                                 : "; not verified by a probe";
  plan_.reason += probes_text(plan_);
}

// The fallback's cost: reserved at rest plus the state, each block in a segment of its own (over
// for small blocks, which share segments), plus a line through two small probes' allocated peaks.
MemoryCost Planner::line_cost() {
  const int64_t rows = (req_.unit_limit > 0 ? req_.unit_limit : req_.effective_batch) / g_;
  const int64_t large = std::min<int64_t>({req_.effective_batch / g_, 8, rows}) * g_;  // whole rows
  const int64_t small = std::max<int64_t>(1, large / g_ / 2) * g_;
  const int64_t small_peak = line_probe(small);
  const int64_t large_peak = large > small ? line_probe(large) : small_peak;
  MemoryCost cost =
      large > small ? memory_cost_from_probes(small, small_peak, large, large_peak) : MemoryCost{small_peak, 0.0};
  alloc_.empty_cache();
  cost.fixed_bytes = plan_.reserved_at_rest;
  for (const FixedBlock& b : held_) cost.fixed_bytes += round_up(b.bytes, CachingAllocator::kLargeSegmentRounding);
  return cost;
}

// The fallback weighs the request's setting alone: the other settings' recordings would not
// match either.
void Planner::plan_with_line(const std::string& why_not_recorded) {
  plan_.method = PlanMethod::probe_line;
  plan_.prediction = why_not_recorded;
  alloc_.empty_cache();
  plan_.reserved_at_rest = alloc_.stats().reserved;
  const std::array<int64_t, kNumMemoryCategories> at_rest = alloc_.stats().current_by_category();
  MemoryCost cost;
  try {
    cost = line_cost();  // under the budget: its probes may run out of memory
  } catch (const OutOfMemory&) {
    alloc_.empty_cache();
    restore_request_setting();
    plan_.reason = "even a micro-batch of " + std::to_string(std::min<int64_t>(g_, req_.effective_batch)) +
                   " needs more than " + budget_text() + ": the probes ran out of memory under it (reserved at rest " +
                   format_bytes(plan_.reserved_at_rest) + ", holding " + categories_text(at_rest) +
                   (plan_.optimizer_state_bytes > 0
                        ? "; the first step adds optimizer state " + format_bytes(plan_.optimizer_state_bytes)
                        : "") +
                   ")" + probes_text(plan_);
    return;
  }
  plan_.weighed.push_back(Plan::Weighed{req_.setting, fit_time(line_timings_), plan_.reserved_at_rest, 0,
                                        fit_time_extreme(line_timings_, false), fit_time_extreme(line_timings_, true)});
  time_step();
  const int64_t usable = static_cast<int64_t>(static_cast<double>(req_.budget) * (1.0 - kLineMargin));
  fill_line_table(cost, usable);
  if (req_.on_table) req_.on_table(plan_);
  MemoryStats measured;
  explain_line_pick(pick(measured), cost, usable);
}

// Every split of the effective batch, its peak from the line, fitting within the usable budget.
void Planner::fill_line_table(const MemoryCost& cost, int64_t usable) {
  for (int64_t b : divisors_) {
    PlanRow r;
    r.micro_batch = b;
    r.accum_steps = req_.effective_batch / b;
    r.peak_bytes = cost.predicted_peak(b);
    r.reserved_bytes = -1;
    r.fits = req_.budget <= 0 || r.peak_bytes <= usable;
    r.setting = req_.setting;
    set_times(r);
    plan_.table.push_back(r);
    if (r.fits && plan_.weighed[0].largest_fitting == 0) plan_.weighed[0].largest_fitting = b;
  }
}

// The plan's reason for row i (the table's size: none fits).
void Planner::explain_line_pick(std::size_t i, const MemoryCost& cost, int64_t usable) {
  if (i == plan_.table.size()) {
    plan_.reason = plan_.rejected_by_probe.empty()
                       ? "even a micro-batch of 1 needs " + format_bytes(cost.predicted_peak(1)) + " (fixed costs " +
                             format_bytes(cost.fixed_bytes) + "), more than the usable " + format_bytes(usable) +
                             " of the budget " + format_bytes(req_.budget)
                       : "a micro-batch of 1 does not fit " + budget_text() + " (reserved at rest " +
                             format_bytes(plan_.reserved_at_rest) + ")";
    return;
  }
  const PlanRow& r = plan_.table[i];
  plan_.reason = steps_text(r) + ": predicted peak " + format_bytes(r.peak_bytes) + " (fixed " +
                 format_bytes(cost.fixed_bytes) + " + " + format_bytes(static_cast<int64_t>(cost.peak_bytes_per_unit)) +
                 "/sample); " + time_text(r);
  if (req_.budget <= 0) {
    plan_.reason += " (no budget; " + why_text(i) + ")" + probes_text(plan_);
    return;
  }
  plan_.reason += " within " + format_bytes(usable) + " (budget " + format_bytes(req_.budget) + " less " +
                  std::to_string(static_cast<int>(kLineMargin * 100)) + "% margin; " + why_text(i) + ")";
  plan_.reason += plan_.verified ? "; verified by a probe micro-batch under the limit" : "; not verified by a probe";
  plan_.reason += probes_text(plan_);
}

// The request's setting is recorded first; the others with the training set where the request has
// it follow, then, only when none of those fits, the same on the host (Note [Plan levers]).
Plan Planner::run() {
  try {
    const MemoryPredictor predictor = record(req_.setting);
    if (!predictor.ok()) {
      plan_with_line(!predictor.reason().empty() ? predictor.reason()
                     : !record_failure_.empty()  ? record_failure_
                                                 : "the training set is too small to record");
      return std::move(plan_);
    }
    plan_.method = PlanMethod::recorded_sequence;
    plan_.prediction = predictor.reason();
    plan_.reserved_at_rest = predictor.rest_reserved();
    time_step();
    plan_.table = rows_from(predictor, req_.setting);
    for (const PlanSetting& s : settings_with(req_.setting.data))
      if (s != req_.setting) weigh(s);
    if (req_.weigh_placement && req_.setting.data == DataPlacement::device && !any_fits())
      for (const PlanSetting& s : settings_with(DataPlacement::host)) weigh(s);
    std::stable_sort(plan_.table.begin(), plan_.table.end(),
                     [](const PlanRow& a, const PlanRow& b) { return a.micro_batch > b.micro_batch; });
    for (Plan::Weighed& w : plan_.weighed)
      for (const PlanRow& r : plan_.table)
        if (r.fits && r.setting == w.setting && w.largest_fitting == 0) w.largest_fitting = r.micro_batch;
    if (req_.on_table) req_.on_table(plan_);
    choose_from_recording();
  } catch (...) {
    restore_request_setting();
    throw;
  }
  return std::move(plan_);
}

// The model state's settings to plan with, in order (Note [Plan levers]): the optimizer's own,
// then, each only when nothing before fits, the ZeRO stages above the request's (opted in; stage 2
// weighed on CPU devices only: on CUDA it has not run on a GPU, so it runs only where asked for),
// and at the highest of them 8 bits where the state is (opted in) and the host.
std::vector<PlanSetting> state_settings(const PlanRequest& request, const optim::Optimizer& optimizer) {
  PlanSetting own = request.setting;
  own.optimizer_state = optimizer.state_placement();
  own.optimizer_bits = optimizer.state_bits();
  std::vector<PlanSetting> out = {own};
  const int highest = request.device.is_cpu() ? 2 : 1;
  if (request.weigh_zero)
    for (int stage = own.zero_stage + 1; stage <= highest; ++stage) out.push_back(own), out.back().zero_stage = stage;
  const PlanSetting sharded = out.back();
  if (request.weigh_state_bits && own.optimizer_bits == 32) out.push_back(sharded), out.back().optimizer_bits = 8;
  if (request.weigh_state_placement && own.optimizer_state == optim::StatePlacement::device)
    out.push_back(sharded), out.back().optimizer_state = optim::StatePlacement::host;
  return out;
}

// "the optimizer state on the device in 32 bits" (", ZeRO stage 2"), for the plan's reason.
std::string state_text(const PlanSetting& setting) {
  return std::string("the optimizer state on the ") + optim::state_placement_name(setting.optimizer_state) + " in " +
         std::to_string(setting.optimizer_bits) + " bits" +
         (setting.zero_stage > 0 ? ", ZeRO stage " + std::to_string(setting.zero_stage) : "");
}

// Changes only what differs: an optimizer that holds its state plans with it as it is.
void put_state_in_place(optim::Optimizer& optimizer, const PlanSetting& setting) {
  if (optimizer.state_placement() != setting.optimizer_state) optimizer.place_state(setting.optimizer_state);
  if (optimizer.state_bits() != setting.optimizer_bits) optimizer.set_state_bits(setting.optimizer_bits);
}

// `earlier`'s rows joined to `plan`'s (a planning with another state setting), in one table.
void join_earlier(Plan& plan, const Plan& earlier) {
  plan.table.insert(plan.table.begin(), earlier.table.begin(), earlier.table.end());
  std::stable_sort(plan.table.begin(), plan.table.end(),
                   [](const PlanRow& a, const PlanRow& b) { return a.micro_batch > b.micro_batch; });
  plan.weighed.insert(plan.weighed.begin(), earlier.weighed.begin(), earlier.weighed.end());
  plan.probe_seconds += earlier.probe_seconds;
  plan.largest_probe = std::max(plan.largest_probe, earlier.largest_probe);
}

// One planning per state setting until one fits (Note [Plan levers]), the tables joined. The
// optimizer keeps the setting of the plan taken, or its own when none fits.
Plan plan_over_state_settings(const PlanRequest& request, CachingAllocator& alloc, ZeroInPlace& zero) {
  optim::Optimizer& optimizer = *request.optimizer;
  const std::vector<PlanSetting> settings = state_settings(request, optimizer);
  Plan plan;
  std::string reasons;
  int64_t own_state_bytes = 0;
  for (const PlanSetting& setting : settings) {
    PlanRequest r = request;
    r.setting = setting;
    r.require_fit = false;
    put_state_in_place(optimizer, setting);
    zero.set(setting.zero_stage);
    Plan next = Planner(r, alloc).run();
    if (&setting == &settings.front()) own_state_bytes = next.optimizer_state_bytes;
    else join_earlier(next, plan);
    reasons += (reasons.empty() ? "" : "; with " + state_text(setting) + ": ") + next.reason;
    plan = std::move(next);
    if (plan.micro_batch > 0) break;
  }
  if (plan.micro_batch == 0) {
    put_state_in_place(optimizer, settings.front());
    plan.setting = settings.front();
    plan.optimizer_state_bytes = own_state_bytes;
    plan.reason = reasons;
  } else if (&settings.front() != &settings.back() && plan.setting != settings.front()) {
    plan.reason += " (nothing fit with " + state_text(settings.front()) + ")";
  }
  return plan;
}

}  // namespace

const char* data_placement_name(DataPlacement placement) {
  return placement == DataPlacement::host ? "host" : "device";
}

std::string recompute_text(uint32_t mask, const std::vector<std::string>& segment_names) {
  const uint32_t all = segment_names.empty() ? 0 : (uint32_t{1} << segment_names.size()) - 1;
  if (mask == 0) return "off";
  if (mask == all || segment_names.empty()) return "all";
  std::string text;
  for (std::size_t i = 0; i < segment_names.size(); ++i)
    if (mask & (uint32_t{1} << i)) text += (text.empty() ? "" : "+") + segment_names[i];
  return text;
}

std::string plan_setting_text(const PlanSetting& setting, const std::vector<std::string>& segment_names) {
  const bool state_on_host = setting.optimizer_state == optim::StatePlacement::host;
  return "recompute " + recompute_text(setting.recompute, segment_names) + ", data on " +
         data_placement_name(setting.data) + ", " + precision_name(setting.precision) +
         (state_on_host ? ", optimizer state on host" : "") +
         (setting.optimizer_bits == 8 ? ", 8-bit optimizer state" : "") +
         (setting.zero_stage > 0 ? ", ZeRO stage " + std::to_string(setting.zero_stage) : "");
}

Plan plan_batch(const PlanRequest& request) {
  CUMULUS_CHECK(request.effective_batch > 0, InvalidArgument, "plan_batch: the effective batch must be > 0, got ",
                request.effective_batch);
  CUMULUS_CHECK(request.budget >= 0 && request.unit_limit >= 0, InvalidArgument,
                "plan_batch: the budget and the sample limit must be >= 0");
  CUMULUS_CHECK(static_cast<bool>(request.micro_batch), InvalidArgument, "plan_batch: no micro-batch function");
  CUMULUS_CHECK(request.units_per_row >= 1 && request.effective_batch % request.units_per_row == 0, InvalidArgument,
                "plan_batch: the effective batch (", request.effective_batch,
                " units) must be a whole number of rows of ", request.units_per_row, " units (units_per_row >= 1)");
  CUMULUS_CHECK(request.timing_repeats >= 1 && request.max_probe >= 0, InvalidArgument,
                "plan_batch: timing_repeats must be >= 1 and max_probe >= 0, got ", request.timing_repeats, " and ",
                request.max_probe);
  CUMULUS_CHECK(request.optimizer != nullptr, InvalidArgument,
                "plan_batch: no optimizer (its first step's state is part of every micro-batch's memory)");
  CUMULUS_CHECK(request.optimizer->parameters().device() == request.device, InvalidArgument,
                "plan_batch: the optimizer's parameters are on ", request.optimizer->parameters().device().str(),
                ", the request is for ", request.device.str());
  CUMULUS_CHECK(!request.recompute_masks.empty() || request.recompute_segments.size() <= kMaxRecomputeSegments,
                InvalidArgument, "plan_batch: ", request.recompute_segments.size(), " recompute segments; at most ",
                kMaxRecomputeSegments, " when every subset is weighed (give recompute_masks to weigh some)");
  CUMULUS_CHECK(request.recompute_segments.size() <= 32, InvalidArgument,
                "plan_batch: ", request.recompute_segments.size(), " recompute segments; at most 32");
  for (uint32_t mask : request.recompute_masks)
    CUMULUS_CHECK((static_cast<uint64_t>(mask) >> request.recompute_segments.size()) == 0, InvalidArgument,
                  "plan_batch: recompute mask ", mask, " names a segment past the ", request.recompute_segments.size(),
                  " given");
  const bool levers = !request.recompute_segments.empty() || request.weigh_placement || !request.precisions.empty();
  CUMULUS_CHECK(!levers || static_cast<bool>(request.apply), InvalidArgument,
                "plan_batch: levers to weigh (recompute segments, placement or precisions) but no apply function to "
                "put a setting in place");
  check_zero_request(request);
  CUMULUS_CHECK(request.collective_times.world_size == 1 || request.collective_times.world_size == request.world_size,
                InvalidArgument, "plan_batch: collective times measured over ", request.collective_times.world_size,
                " ranks, the request plans for ", request.world_size);
  CUMULUS_CHECK(state_settings(request, *request.optimizer).size() == 1 || request.optimizer->state().empty(),
                InvalidArgument,
                "plan_batch: the optimizer's state is weighed (weigh_state_placement, weigh_state_bits "
                "or weigh_zero) but exists already (it cannot change)");
  CachingAllocator& alloc = allocator_for(request.device);
  ZeroInPlace zero(request);  // finished outside the limit: the flat gradient it gives back is not the plan's
  Plan plan;
  {
    const MemoryLimitScope limit(alloc, request.budget > 0 ? request.budget : alloc.memory_limit());
    const BufferRestore buffers(request.model);
    plan = plan_over_state_settings(request, alloc, zero);
  }
  zero.finish(plan.micro_batch > 0 && plan.setting.zero_stage == 2);
  CUMULUS_CHECK(plan.micro_batch > 0 || !request.require_fit, OutOfMemory, "plan_batch: ", plan.reason);
  return plan;
}

}  // namespace cumulus::plan
