#include "cumulus/runtime/tracker.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "cumulus/autograd/checkpoint.h"
#include "cumulus/core/error.h"

namespace cumulus {

namespace {
constexpr std::size_t kMaxTimelineSamples = 1u << 20;  // bounds the timeline's host memory
constexpr std::size_t kMaxPendingTimes = 256;          // resolve device times in batches

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}
}  // namespace

// Appends a sample of every category's bytes at each allocation and free, while enabled.
class MemoryTracker::Observer final : public AllocationObserver {
 public:
  Observer(std::vector<TimelineSample>& out, double origin) : out_(out), origin_(origin) {}
  void on_change(const MemoryStats& stats) override {
    if (enabled) record(stats);
  }
  void record(const MemoryStats& stats) {
    if (out_.size() >= kMaxTimelineSamples) return;
    TimelineSample s;
    s.ms = now_ms() - origin_;
    for (std::size_t c = 0; c < kNumMemoryCategories; ++c) s.bytes[c] = stats.by_category[c].current;
    out_.push_back(s);
  }
  bool enabled = false;

 private:
  std::vector<TimelineSample>& out_;
  double origin_;
};

MemoryTracker::MemoryTracker(Device device, Options options)
    : device_(device), options_(std::move(options)), allocator_(allocator_for(device)) {
  CUMULUS_CHECK(options_.accum_steps > 0 && options_.micro_batch_size >= 0 && options_.timeline_steps >= 0,
                InvalidArgument, "MemoryTracker: accum_steps must be > 0, sizes >= 0");
  origin_ms_ = now_ms();
  ooms_at_start_ = allocator_.stats().oom_count;
  observer_ = std::make_unique<Observer>(timeline_, origin_ms_);
  if (options_.timeline_steps > 0) allocator_.set_observer(observer_.get());
}

MemoryTracker::~MemoryTracker() { allocator_.set_observer(nullptr); }

double MemoryTracker::host_ms() const { return now_ms() - origin_ms_; }

bool MemoryTracker::in_timeline_window() const { return steps_taken_ < options_.timeline_steps; }

// A sample at each phase boundary (after the device caught up), so the plot's steps hold their
// level up to the boundary even where a phase allocates nothing.
void MemoryTracker::sample_timeline() {
  if (observer_->enabled) observer_->record(allocator_.stats());
}

// Note [Units] in engine/runtime/trainer.cpp: a tracker told micro-batches of 8 (sequences) and fed
// 512 (tokens) once printed "activations 0 B ... peak 0 B" without a word.
void MemoryTracker::check_units(int64_t units) {
  const int64_t told = options_.micro_batch_size;
  CUMULUS_CHECK(units > 0, InvalidArgument, "MemoryTracker: a micro-batch of ", units, " units");
  if (told > 0 && units > told && largest_fed_ <= told) {
    CUMULUS_CHECK(!options_.strict_units, InvalidArgument, "MemoryTracker: told micro-batches of ", told,
                  " units (Options::micro_batch_size) and fed one of ", units,
                  " units; count the same units on both sides (Batch::units: samples, or tokens)");
    std::fprintf(stderr,
                 "warning: MemoryTracker: told micro-batches of %lld units (Options::micro_batch_size) and fed one of "
                 "%lld units; its per-micro-batch figures are for %lld (count the same units on both sides)\n",
                 static_cast<long long>(told), static_cast<long long>(units), static_cast<long long>(told));
  }
  smallest_fed_ = smallest_fed_ == 0 ? units : std::min(smallest_fed_, units);
  largest_fed_ = std::max(largest_fed_, units);
}

void MemoryTracker::begin_micro_batch(int epoch, int64_t index, int64_t samples) {
  CUMULUS_CHECK(!in_micro_batch_ && !in_step_, InvalidArgument,
                "MemoryTracker::begin_micro_batch inside another micro-batch or step");
  check_units(samples);
  observer_->enabled = in_timeline_window();
  if (observer_->enabled) synchronize(device_);
  allocator_.reset_peak();
  current_ = MicroBatchRecord();
  current_.epoch = epoch;
  current_.index = index;
  current_.samples = samples;
  const MemoryStats st = allocator_.stats();
  activations_at_start_ = st[MemoryCategory::activations].current;
  ooms_at_phase_ = st.oom_count;
  forward_ended_ = false;
  take_recompute_log();  // what happened before this micro-batch is not its own
  t_start_ = TimePoint::now(device_);
  sample_timeline();
  if (observer_->enabled) slices_.push_back({"forward", host_ms(), 0.0, epoch, index});
  in_micro_batch_ = true;
}

void MemoryTracker::end_forward() {
  CUMULUS_CHECK(in_micro_batch_, InvalidArgument, "MemoryTracker::end_forward outside a micro-batch");
  t_forward_end_ = TimePoint::now(device_);
  forward_ended_ = true;
  current_.activation_bytes = allocator_.stats()[MemoryCategory::activations].current - activations_at_start_;
  if (observer_->enabled) {
    synchronize(device_);
    sample_timeline();
    slices_.back().end_ms = host_ms();
    slices_.push_back({"backward", host_ms(), 0.0, current_.epoch, current_.index});
  }
}

void MemoryTracker::end_backward() {
  CUMULUS_CHECK(in_micro_batch_, InvalidArgument, "MemoryTracker::end_backward outside a micro-batch");
  const TimePoint t_end = TimePoint::now(device_);
  const MemoryStats st = allocator_.stats();
  MicroBatchRecord& r = current_;
  r.peak_bytes = st.allocated_peak;
  r.peak_by_category = st.at_peak;
  r.reserved_bytes = st.reserved;
  RecomputeLog recompute = take_recompute_log();
  r.recompute_segments = recompute.segments_recomputed;
  r.recomputed_bytes = recompute.recomputed_bytes;
  r.recompute_avoided_bytes = recompute.avoided_bytes();
  r.recompute_ms = recompute.resolved_ms;  // CPU; CUDA spans are resolved with the other times
  const TimePoint times[3] = {t_start_, t_forward_end_, t_end};
  count_micro_batch(r, times, std::move(recompute.pending));
  if (observer_->enabled) {
    synchronize(device_);
    sample_timeline();
    slices_.back().end_ms = host_ms();
    for (const RecomputeLog::Interval& i : recompute.intervals)
      recompute_slices_.push_back(
          {"recompute", i.host_start_ms - origin_ms_, i.host_end_ms - origin_ms_, r.epoch, r.index, i.bytes});
  }
  in_micro_batch_ = false;
}

void MemoryTracker::add_graph_micro_batch(const MicroBatchRecord& captured) {
  CUMULUS_CHECK(!in_micro_batch_ && !in_step_, InvalidArgument, "MemoryTracker::add_graph_micro_batch inside a phase");
  check_units(captured.samples);
  current_ = captured;
  count_micro_batch(captured, nullptr);
}

void MemoryTracker::count_micro_batch(const MicroBatchRecord& r, const TimePoint* times,
                                      std::vector<std::pair<TimePoint, TimePoint>> recompute_times) {
  ++micro_batches_seen_;
  const double x = static_cast<double>(r.samples), y = static_cast<double>(r.activation_bytes);
  fit_n_ += 1;
  fit_sx_ += x;
  fit_sy_ += y;
  fit_sxx_ += x * x;
  fit_sxy_ += x * y;
  run_peak_ = std::max(run_peak_, r.peak_bytes);
  auto [it, inserted] = highest_peak_by_samples_.try_emplace(r.samples, r);
  if (!inserted && r.peak_bytes > it->second.peak_bytes) it->second = r;
  if (records_.size() < options_.max_records) {
    records_.push_back(r);
    if (times) {
      pending_.push_back({records_.size() - 1, false, times[0], times[1], times[2], std::move(recompute_times), {}});
      if (pending_.size() >= kMaxPendingTimes) resolve_times();
    }
  }
}

void MemoryTracker::begin_step() {
  CUMULUS_CHECK(!in_micro_batch_ && !in_step_, InvalidArgument, "MemoryTracker::begin_step inside a micro-batch");
  allocator_.reset_peak();
  ooms_at_phase_ = allocator_.stats().oom_count;
  t_step_start_ = TimePoint::now(device_);
  if (observer_->enabled) {
    synchronize(device_);
    sample_timeline();
    slices_.push_back({"step", host_ms(), 0.0, current_.epoch, steps_taken_ + 1});
  }
  in_step_ = true;
}

void MemoryTracker::end_step(int64_t step, int64_t optimizer_state_bytes, TimeSpans communication) {
  CUMULUS_CHECK(in_step_, InvalidArgument, "MemoryTracker::end_step without begin_step");
  const TimePoint t_end = TimePoint::now(device_);
  StepRecord s;
  s.step = step;
  s.epoch = current_.epoch;
  s.optimizer_state_bytes = optimizer_state_bytes;
  s.peak_bytes = allocator_.stats().allocated_peak;
  const TimePoint times[3] = {t_step_start_, TimePoint(), t_end};
  if (observer_->enabled) {
    // The device caught up, the reductions included (the step's stream waited for them).
    synchronize(device_);
    sample_timeline();
    slices_.back().end_ms = host_ms();
    slices_.back().index = step;
    slices_.back().communication_ms = total_ms(communication);
  }
  count_step(s, times, std::move(communication));
  in_step_ = false;
  if (!in_timeline_window()) observer_->enabled = false;
}

void MemoryTracker::add_graph_step(int64_t step, int64_t optimizer_state_bytes) {
  CUMULUS_CHECK(!in_micro_batch_ && !in_step_, InvalidArgument, "MemoryTracker::add_graph_step inside a phase");
  StepRecord s;
  s.step = step;
  s.epoch = current_.epoch;
  s.optimizer_state_bytes = optimizer_state_bytes;
  s.peak_bytes = allocator_.stats().allocated;  // a replay allocates nothing
  count_step(s, nullptr);
}

void MemoryTracker::count_step(const StepRecord& s, const TimePoint* times, TimeSpans communication) {
  ++steps_seen_;
  run_peak_ = std::max(run_peak_, s.peak_bytes);
  if (steps_.size() < options_.max_records) {
    steps_.push_back(s);
    if (times) {
      pending_.push_back({steps_.size() - 1, true, times[0], times[1], times[2], {}, std::move(communication)});
      if (pending_.size() >= kMaxPendingTimes) resolve_times();
    }
  }
  ++steps_taken_;
}

void MemoryTracker::resolve_times() {
  for (const PendingTimes& p : pending_) {
    if (p.is_step) {
      steps_[p.record].ms = p.end.ms_since(p.start);
      steps_[p.record].communication_ms = total_ms(p.communication);
    } else {
      records_[p.record].forward_ms = p.mid.ms_since(p.start);
      records_[p.record].backward_ms = p.end.ms_since(p.mid);
      for (const auto& [start, end] : p.recompute) records_[p.record].recompute_ms += end.ms_since(start);
    }
  }
  pending_.clear();
}

const std::vector<MicroBatchRecord>& MemoryTracker::micro_batches() {
  resolve_times();
  return records_;
}

const std::vector<StepRecord>& MemoryTracker::steps() {
  resolve_times();
  return steps_;
}

MemorySummary MemoryTracker::summary() {
  resolve_times();
  MemorySummary s;
  const MemoryStats st = allocator_.stats();
  s.parameters_bytes = st[MemoryCategory::parameters].current;
  s.gradients_bytes = st[MemoryCategory::gradients].current;
  s.optimizer_state_bytes = st[MemoryCategory::optimizer_state].current;
  s.workspace_bytes = st[MemoryCategory::workspace].current;
  s.data_bytes = st[MemoryCategory::data].current;
  s.reserved_peak_bytes = st.reserved_peak;
  s.micro_batch_size = options_.micro_batch_size;
  s.accum_steps = options_.accum_steps;

  // Activation bytes per sample: least-squares line over (samples, activation bytes); with one
  // micro-batch size only, the ratio through the origin.
  const double n = fit_n_, var = fit_n_ * fit_sxx_ - fit_sx_ * fit_sx_;
  if (n >= 2 && var > 1e-9 * n * fit_sxx_) s.activation_bytes_per_sample = (n * fit_sxy_ - fit_sx_ * fit_sy_) / var;
  else if (fit_sx_ > 0) s.activation_bytes_per_sample = fit_sy_ / fit_sx_;
  s.peak_bytes = run_peak_;
  // A run that failed: the peak reached before the failure counts, though no record completed.
  if (const auto oom = out_of_memory()) s.peak_bytes = std::max(s.peak_bytes, oom->failure.peak_bytes);

  // Peak at B and at B*N: measured where a micro-batch of that size ran; B*N otherwise predicted
  // by scaling the part of the peak above the fixed costs linearly in the batch size.
  const int64_t b = options_.micro_batch_size, bn = b * options_.accum_steps;
  if (auto it = highest_peak_by_samples_.find(bn); it != highest_peak_by_samples_.end()) {
    s.peak_at_effective_batch = it->second.peak_bytes;
    s.effective_batch_measured = true;
  }
  if (auto it = highest_peak_by_samples_.find(b); it != highest_peak_by_samples_.end()) {
    const MicroBatchRecord& r = it->second;
    s.peak_at_micro_batch = r.peak_bytes;
    if (!s.effective_batch_measured && b > 0) {
      int64_t fixed = 0;
      for (MemoryCategory c : {MemoryCategory::parameters, MemoryCategory::gradients, MemoryCategory::optimizer_state,
                               MemoryCategory::workspace, MemoryCategory::data})
        fixed += r.peak_by_category[static_cast<std::size_t>(c)];
      const double per_sample = static_cast<double>(r.peak_bytes - fixed) / static_cast<double>(b);
      s.peak_at_effective_batch = fixed + static_cast<int64_t>(per_sample * static_cast<double>(bn));
    }
  }
  if (b > 0 && micro_batches_seen_ > 0) {
    const std::string fed = smallest_fed_ == largest_fed_
                                ? std::to_string(largest_fed_)
                                : std::to_string(smallest_fed_) + " to " + std::to_string(largest_fed_);
    if (largest_fed_ > b)
      s.warning = "told micro-batches of " + std::to_string(b) + " units and fed micro-batches of " + fed + " units";
    else if (highest_peak_by_samples_.count(b) == 0)
      s.warning = "told micro-batches of " + std::to_string(b) + " units and fed none of that size (fed " + fed +
                  " units): the peak at the micro-batch is not measured";
  }
  return s;
}

std::optional<TrackedOutOfMemory> MemoryTracker::out_of_memory() const {
  std::optional<OutOfMemoryRecord> failure = allocator_.last_out_of_memory();
  if (!failure || failure->sequence <= ooms_at_start_) return std::nullopt;
  TrackedOutOfMemory t;
  // The failure happened in the open phase only if it came after the phase began (a phase left
  // open by the exception is never ended).
  if ((in_micro_batch_ || in_step_) && failure->sequence > ooms_at_phase_) {
    t.in_progress = true;
    t.phase = in_step_ ? "step" : forward_ended_ ? "backward" : "forward";
    t.epoch = current_.epoch;
    t.index = current_.index;
    t.samples = in_step_ ? 0 : current_.samples;
    t.step = in_step_ ? steps_taken_ + 1 : 0;
  }
  t.failure = std::move(*failure);
  return t;
}

void MemoryTracker::measure_plan(int epoch, double epoch_seconds, int64_t peak_bytes) {
  CUMULUS_CHECK(plan_check_.has_value(), InvalidArgument,
                "MemoryTracker::measure_plan without a plan check (set_plan_check gives the prediction first)");
  plan_check_->measured = true;
  plan_check_->epoch = epoch;
  plan_check_->measured_epoch_seconds = epoch_seconds;
  plan_check_->measured_peak_bytes = peak_bytes;
}

}  // namespace cumulus
