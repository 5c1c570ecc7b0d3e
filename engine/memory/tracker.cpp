#include "cumulus/memory/tracker.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "cumulus/autograd/checkpoint.h"
#include "cumulus/core/error.h"
#include "tracker_access.h"

#if CUMULUS_WITH_CUDA
#include "engine/core/cuda_context.h"
#include "engine/core/opt_in.h"
#endif

namespace cumulus::memory {

namespace {
constexpr std::size_t kMaxTimelineSamples = 1u << 20;  // bounds the timeline's host memory
constexpr std::size_t kMaxPendingTimes = 256;          // resolve device times in batches

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

// Appends a sample of every category's bytes at each allocation and free, while enabled.
class TimelineObserver final : public AllocationObserver {
 public:
  TimelineObserver(std::vector<TimelineSample>& out, double origin) : out_(out), origin_(origin) {}
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
}  // namespace

// Everything the tracker keeps, behind the installed header.
struct MemoryTracker::State {
  State(Device device, Options options)
      : device_(device), options_(std::move(options)), allocator_(allocator_for(device)) {}

  Device device_;
  Options options_;
  CachingAllocator& allocator_;
  std::unique_ptr<TimelineObserver> observer_;
  double origin_ms_ = 0.0;  // host clock origin of the timeline
  MicroBatchRecord current_;
  std::vector<MicroBatchRecord> records_;
  std::vector<StepRecord> steps_;
  // Summary aggregates over every micro-batch and step, kept or not.
  int64_t micro_batches_seen_ = 0, steps_seen_ = 0;
  int64_t smallest_fed_ = 0, largest_fed_ = 0;  // units of the micro-batches seen
  double fit_n_ = 0, fit_sx_ = 0, fit_sy_ = 0, fit_sxx_ = 0, fit_sxy_ = 0;
  int64_t run_peak_ = 0;
  std::map<int64_t, MicroBatchRecord> highest_peak_by_units_;
  std::vector<TimelineSample> timeline_;
  std::vector<TimelineSlice> slices_;
  std::vector<TimelineSlice> recompute_slices_;
  // Device time points waiting to be read (reading waits for the device: done lazily).
  struct PendingTimes {
    std::size_t record;
    bool is_step;
    TimePoint start, mid, end;
    std::vector<std::pair<TimePoint, TimePoint>> recompute;  // device spans of recomputations
    TimeSpans communication;                                 // a step's reductions
  };
  std::vector<PendingTimes> pending_;
  TimePoint t_start_, t_forward_end_, t_step_start_;
  int64_t activations_at_start_ = 0;
  int64_t steps_taken_ = 0;
  bool in_micro_batch_ = false, in_step_ = false;
  bool forward_ended_ = false;
  // Allocator out-of-memory counts: at creation, and when the open phase began.
  int64_t ooms_at_start_ = 0, ooms_at_phase_ = 0;
  std::optional<plan::PlanCheck> plan_check_;

  double host_ms() const { return now_ms() - origin_ms_; }
  bool in_timeline_window() const { return steps_taken_ < options_.timeline_steps; }
  void sample_timeline();
  void check_units(int64_t units);
  void count_micro_batch(const MicroBatchRecord& r, const TimePoint* times,
                         std::vector<std::pair<TimePoint, TimePoint>> recompute_times = {});
  void count_step(const StepRecord& s, const TimePoint* times, TimeSpans communication = {});
  void resolve_times();
};

MemoryTracker::MemoryTracker(Device device, Options options) : s_(std::make_unique<State>(device, std::move(options))) {
  CUMULUS_CHECK(s_->options_.accum_steps > 0 && s_->options_.micro_batch_size >= 0 && s_->options_.timeline_steps >= 0,
                InvalidArgument, "MemoryTracker: accum_steps must be > 0, sizes >= 0");
  s_->origin_ms_ = now_ms();
  s_->ooms_at_start_ = s_->allocator_.stats().oom_count;
  s_->observer_ = std::make_unique<TimelineObserver>(s_->timeline_, s_->origin_ms_);
  if (s_->options_.timeline_steps > 0) s_->allocator_.set_observer(s_->observer_.get());
}

MemoryTracker::~MemoryTracker() { s_->allocator_.set_observer(nullptr); }

const Device& MemoryTracker::device() const { return s_->device_; }
const MemoryTracker::Options& MemoryTracker::options() const { return s_->options_; }
const MicroBatchRecord& MemoryTracker::last_micro_batch() const { return s_->current_; }
int64_t MemoryTracker::micro_batches_seen() const { return s_->micro_batches_seen_; }
int64_t MemoryTracker::steps_seen() const { return s_->steps_seen_; }
const std::vector<TimelineSample>& MemoryTracker::timeline() const { return s_->timeline_; }
const std::vector<TimelineSlice>& MemoryTracker::slices() const { return s_->slices_; }
const std::vector<TimelineSlice>& MemoryTracker::recompute_slices() const { return s_->recompute_slices_; }
void MemoryTracker::set_plan_check(plan::PlanCheck check) { s_->plan_check_ = std::move(check); }
const std::optional<plan::PlanCheck>& MemoryTracker::plan_check() const { return s_->plan_check_; }


namespace {
// What micro-batch `r` made of category `c` by its peak (negative where it freed more).
int64_t grown(const MicroBatchRecord& r, MemoryCategory c) {
  const auto i = static_cast<std::size_t>(c);
  return r.peak_by_category[i] - r.start_by_category[i];
}

// Note [One batch's peak]
// The peak of one batch of B x N units, where none ran, is predicted from the micro-batch of B
// units with the highest peak, r. Fixed: whatever was live when r began (parameters, gradients,
// optimizer state, datasets, the Trainer's state, a caller's tables, whatever their category), and
// what r made that does not grow with its units (workspace, the 16-bit weight copies). Growing
// linearly in the units: what r made of activations, backward temporaries, data (its batch) and
// other. That is the planner's account too (Note [Memory prediction] in engine/plan/prediction.cpp:
// the state at rest, then the micro-batch's allocations at the new size), so the two agree up to
// the allocator's rounding and the bends a line misses. Counting by category at the peak instead,
// as this did once, took every block of "other" for growth, so whatever a caller made outside any
// scope before the micro-batch was multiplied by N (issue 59: 267.0 MiB predicted for one batch
// where the planner said 151.9 MiB).
int64_t predicted_peak(const MicroBatchRecord& r, int64_t units) {
  int64_t growth = 0;
  for (MemoryCategory c :
       {MemoryCategory::activations, MemoryCategory::backward_temporaries, MemoryCategory::data, MemoryCategory::other})
    growth += std::max<int64_t>(0, grown(r, c));
  const double per_unit = static_cast<double>(growth) / static_cast<double>(r.units);
  return r.peak_bytes - growth + static_cast<int64_t>(per_unit * static_cast<double>(units));
}
}  // namespace


bool MemoryTrackerAccess::timeline_active(const MemoryTracker& tracker) {
  return tracker.s_->in_timeline_window();
}

// A sample at each phase boundary (after the device caught up), so the plot's steps hold their
// level up to the boundary even where a phase allocates nothing.
void MemoryTracker::State::sample_timeline() {
  if (observer_->enabled) observer_->record(allocator_.stats());
}

// Note [Units] (the Trainer's): a tracker told micro-batches of 8 (sequences) and fed 512 (tokens)
// would report "activations 0 B ... peak 0 B" without a word, so the counts are checked.
void MemoryTracker::State::check_units(int64_t units) {
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

void MemoryTracker::begin_micro_batch(int epoch, int64_t index, int64_t units) {
  CUMULUS_CHECK(!s_->in_micro_batch_ && !s_->in_step_, InvalidArgument,
                "MemoryTracker::begin_micro_batch inside another micro-batch or step");
  s_->check_units(units);
  s_->observer_->enabled = s_->in_timeline_window();
  if (s_->observer_->enabled) synchronize(s_->device_);
  s_->allocator_.reset_peak();
  s_->current_ = MicroBatchRecord();
  s_->current_.epoch = epoch;
  s_->current_.index = index;
  s_->current_.units = units;
  const MemoryStats st = s_->allocator_.stats();
  s_->activations_at_start_ = st[MemoryCategory::activations].current;
  s_->current_.start_by_category = st.current_by_category();
  s_->ooms_at_phase_ = st.oom_count;
  s_->forward_ended_ = false;
  take_recompute_log();  // what happened before this micro-batch is not its own
  s_->t_start_ = TimePoint::now(s_->device_);
  s_->sample_timeline();
  if (s_->observer_->enabled) s_->slices_.push_back({"forward", s_->host_ms(), 0.0, epoch, index});
  s_->in_micro_batch_ = true;
}

void MemoryTracker::end_forward() {
  CUMULUS_CHECK(s_->in_micro_batch_, InvalidArgument, "MemoryTracker::end_forward outside a micro-batch");
  s_->t_forward_end_ = TimePoint::now(s_->device_);
  s_->forward_ended_ = true;
  s_->current_.activation_bytes =
      s_->allocator_.stats()[MemoryCategory::activations].current - s_->activations_at_start_;
  if (s_->observer_->enabled) {
    synchronize(s_->device_);
    s_->sample_timeline();
    s_->slices_.back().end_ms = s_->host_ms();
    s_->slices_.push_back({"backward", s_->host_ms(), 0.0, s_->current_.epoch, s_->current_.index});
  }
}

void MemoryTracker::end_backward() {
  CUMULUS_CHECK(s_->in_micro_batch_, InvalidArgument, "MemoryTracker::end_backward outside a micro-batch");
  const TimePoint t_end = TimePoint::now(s_->device_);
  const MemoryStats st = s_->allocator_.stats();
  MicroBatchRecord& r = s_->current_;
  r.peak_bytes = st.allocated_peak;
  r.peak_by_category = st.at_peak;
  r.reserved_bytes = st.reserved;
  RecomputeLog recompute = take_recompute_log();
  r.recompute_segments = recompute.segments_recomputed;
  r.recomputed_bytes = recompute.recomputed_bytes;
  r.recompute_avoided_bytes = recompute.avoided_bytes();
  r.recompute_ms = recompute.resolved_ms;  // CPU; CUDA spans are resolved with the other times
  const TimePoint times[3] = {s_->t_start_, s_->t_forward_end_, t_end};
  s_->count_micro_batch(r, times, std::move(recompute.pending));
  if (s_->observer_->enabled) {
    synchronize(s_->device_);
    s_->sample_timeline();
    s_->slices_.back().end_ms = s_->host_ms();
    for (const RecomputeLog::Interval& i : recompute.intervals)
      s_->recompute_slices_.push_back(
          {"recompute", i.host_start_ms - s_->origin_ms_, i.host_end_ms - s_->origin_ms_, r.epoch, r.index, i.bytes});
  }
  s_->in_micro_batch_ = false;
}

void MemoryTrackerAccess::add_graph_micro_batch(MemoryTracker& tracker, const MicroBatchRecord& captured) {
  MemoryTracker::State& state = *tracker.s_;
  CUMULUS_CHECK(!state.in_micro_batch_ && !state.in_step_, InvalidArgument,
                "MemoryTracker::add_graph_micro_batch inside a phase");
  state.check_units(captured.units);
  state.current_ = captured;
  state.count_micro_batch(captured, nullptr);
}

void MemoryTracker::State::count_micro_batch(const MicroBatchRecord& r, const TimePoint* times,
                                             std::vector<std::pair<TimePoint, TimePoint>> recompute_times) {
  ++micro_batches_seen_;
  const double x = static_cast<double>(r.units), y = static_cast<double>(r.activation_bytes);
  fit_n_ += 1;
  fit_sx_ += x;
  fit_sy_ += y;
  fit_sxx_ += x * x;
  fit_sxy_ += x * y;
  run_peak_ = std::max(run_peak_, r.peak_bytes);
  auto [it, inserted] = highest_peak_by_units_.try_emplace(r.units, r);
  if (!inserted && r.peak_bytes > it->second.peak_bytes) it->second = r;
  if (records_.size() < options_.max_records) {
    records_.push_back(r);
    if (times) {
      pending_.push_back(
          {records_.size() - 1, false, times[0], times[1], times[2], std::move(recompute_times), {}});
      if (pending_.size() >= kMaxPendingTimes) resolve_times();
    }
  }
}

void MemoryTracker::begin_step() {
  CUMULUS_CHECK(!s_->in_micro_batch_ && !s_->in_step_, InvalidArgument,
                "MemoryTracker::begin_step inside a micro-batch");
  s_->allocator_.reset_peak();
  s_->ooms_at_phase_ = s_->allocator_.stats().oom_count;
  s_->t_step_start_ = TimePoint::now(s_->device_);
  if (s_->observer_->enabled) {
    synchronize(s_->device_);
    s_->sample_timeline();
    s_->slices_.push_back({"step", s_->host_ms(), 0.0, s_->current_.epoch, s_->steps_taken_ + 1});
  }
  s_->in_step_ = true;
}

void MemoryTracker::end_step(int64_t step, int64_t optimizer_state_bytes, TimeSpans communication) {
  CUMULUS_CHECK(s_->in_step_, InvalidArgument, "MemoryTracker::end_step without begin_step");
  const TimePoint t_end = TimePoint::now(s_->device_);
  StepRecord s;
  s.step = step;
  s.epoch = s_->current_.epoch;
  s.optimizer_state_bytes = optimizer_state_bytes;
  s.peak_bytes = s_->allocator_.stats().allocated_peak;
  const TimePoint times[3] = {s_->t_step_start_, TimePoint(), t_end};
  if (s_->observer_->enabled) {
    // The device caught up, the reductions included (the step's stream waited for them).
    synchronize(s_->device_);
    s_->sample_timeline();
    s_->slices_.back().end_ms = s_->host_ms();
    s_->slices_.back().index = step;
    s_->slices_.back().communication_ms = total_ms(communication);
  }
  s_->count_step(s, times, std::move(communication));
  s_->in_step_ = false;
  if (!s_->in_timeline_window()) s_->observer_->enabled = false;
}

void MemoryTrackerAccess::add_graph_step(MemoryTracker& tracker, int64_t step, int64_t optimizer_state_bytes) {
  MemoryTracker::State& state = *tracker.s_;
  CUMULUS_CHECK(!state.in_micro_batch_ && !state.in_step_, InvalidArgument,
                "MemoryTracker::add_graph_step inside a phase");
  StepRecord s;
  s.step = step;
  s.epoch = state.current_.epoch;
  s.optimizer_state_bytes = optimizer_state_bytes;
  s.peak_bytes = state.allocator_.stats().allocated;  // a replay allocates nothing
  state.count_step(s, nullptr);
}

void MemoryTracker::State::count_step(const StepRecord& s, const TimePoint* times, TimeSpans communication) {
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

void MemoryTracker::State::resolve_times() {
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
  s_->resolve_times();
  return s_->records_;
}

const std::vector<StepRecord>& MemoryTracker::steps() {
  s_->resolve_times();
  return s_->steps_;
}

MemorySummary MemoryTracker::summary() {
  s_->resolve_times();
  MemorySummary s;
  const MemoryStats st = s_->allocator_.stats();
  s.parameters_bytes = st[MemoryCategory::parameters].current;
  s.gradients_bytes = st[MemoryCategory::gradients].current;
  s.optimizer_state_bytes = st[MemoryCategory::optimizer_state].current;
  s.host_optimizer_state_bytes = host_state_allocator().stats()[MemoryCategory::optimizer_state].current;
  s.workspace_bytes = st[MemoryCategory::workspace].current;
#if CUMULUS_WITH_CUDA
  // Read unless CUMULUS_CUDA_MEMORY_OUTSIDE=0 (Note [Memory outside the allocator]).
  static const bool asked =
      cumulus::detail::environment_choice("CUMULUS_CUDA_MEMORY_OUTSIDE", {"0", "1"}) != 0;
  if (const Device& device = s_->allocator_.device(); device.is_cuda() && asked) {
    const cuda::MemoryOutsideAllocator outside = cuda::memory_outside_allocator(device.index(), st.reserved);
    s.outside_allocator_bytes = outside.bytes;
    s.context_local_memory_bytes = outside.local_memory_bytes;
  }
#endif
  s.data_bytes = st[MemoryCategory::data].current;
  s.reserved_peak_bytes = st.reserved_peak;
  s.micro_batch_size = s_->options_.micro_batch_size;
  s.accum_steps = s_->options_.accum_steps;

  // Activation bytes per sample: least-squares line over (samples, activation bytes); with one
  // micro-batch size only, the ratio through the origin.
  const double n = s_->fit_n_, var = s_->fit_n_ * s_->fit_sxx_ - s_->fit_sx_ * s_->fit_sx_;
  if (n >= 2 && var > 1e-9 * n * s_->fit_sxx_)
    s.activation_bytes_per_unit = (n * s_->fit_sxy_ - s_->fit_sx_ * s_->fit_sy_) / var;
  else if (s_->fit_sx_ > 0) s.activation_bytes_per_unit = s_->fit_sy_ / s_->fit_sx_;
  s.peak_bytes = s_->run_peak_;
  // A run that failed: the peak reached before the failure counts, though no record completed.
  if (const auto oom = out_of_memory()) s.peak_bytes = std::max(s.peak_bytes, oom->failure.peak_bytes);

  // Peak at B and at B*N: measured where a micro-batch of that size ran; B*N otherwise predicted
  // (Note [One batch's peak]).
  const int64_t b = s_->options_.micro_batch_size, bn = b * s_->options_.accum_steps;
  if (auto it = s_->highest_peak_by_units_.find(bn); it != s_->highest_peak_by_units_.end()) {
    s.peak_at_effective_batch = it->second.peak_bytes;
    s.effective_batch_measured = true;
  }
  if (auto it = s_->highest_peak_by_units_.find(b); it != s_->highest_peak_by_units_.end()) {
    const MicroBatchRecord& r = it->second;
    s.peak_at_micro_batch = r.peak_bytes;
    s.batch_data_bytes = std::max<int64_t>(0, grown(r, MemoryCategory::data));
    if (!s.effective_batch_measured && b > 0) s.peak_at_effective_batch = predicted_peak(r, bn);
  }
  if (b > 0 && s_->micro_batches_seen_ > 0) {
    const std::string fed = s_->smallest_fed_ == s_->largest_fed_
                                ? std::to_string(s_->largest_fed_)
                                : std::to_string(s_->smallest_fed_) + " to " + std::to_string(s_->largest_fed_);
    if (s_->largest_fed_ > b)
      s.warning = "told micro-batches of " + std::to_string(b) + " units and fed micro-batches of " + fed + " units";
    else if (s_->highest_peak_by_units_.count(b) == 0)
      s.warning = "told micro-batches of " + std::to_string(b) + " units and fed none of that size (fed " + fed +
                  " units): the peak at the micro-batch is not measured";
  }
  return s;
}

std::optional<TrackedOutOfMemory> MemoryTracker::out_of_memory() const {
  std::optional<OutOfMemoryRecord> failure = s_->allocator_.last_out_of_memory();
  if (!failure || failure->sequence <= s_->ooms_at_start_) return std::nullopt;
  TrackedOutOfMemory t;
  // The failure happened in the open phase only if it came after the phase began (a phase left
  // open by the exception is never ended).
  if ((s_->in_micro_batch_ || s_->in_step_) && failure->sequence > s_->ooms_at_phase_) {
    t.in_progress = true;
    t.phase = s_->in_step_ ? "step" : s_->forward_ended_ ? "backward" : "forward";
    t.epoch = s_->current_.epoch;
    t.index = s_->current_.index;
    t.units = s_->in_step_ ? 0 : s_->current_.units;
    t.step = s_->in_step_ ? s_->steps_taken_ + 1 : 0;
  }
  t.failure = std::move(*failure);
  return t;
}

void MemoryTracker::measure_plan(int epoch, double epoch_seconds, int64_t peak_bytes) {
  CUMULUS_CHECK(s_->plan_check_.has_value(), InvalidArgument,
                "MemoryTracker::measure_plan without a plan check (set_plan_check gives the prediction first)");
  s_->plan_check_->measured = true;
  s_->plan_check_->epoch = epoch;
  s_->plan_check_->measured_epoch_seconds = epoch_seconds;
  s_->plan_check_->measured_peak_bytes = peak_bytes;
}

}  // namespace cumulus::memory
