#include "cumulus/memory/tracker.h"

#include <algorithm>
#include <chrono>

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
    if (!enabled || out_.size() >= kMaxTimelineSamples) return;
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
  observer_ = std::make_unique<Observer>(timeline_, origin_ms_);
  if (options_.timeline_steps > 0) allocator_.set_observer(observer_.get());
}

MemoryTracker::~MemoryTracker() { allocator_.set_observer(nullptr); }

double MemoryTracker::host_ms() const { return now_ms() - origin_ms_; }

bool MemoryTracker::in_timeline_window() const { return steps_taken_ < options_.timeline_steps; }

void MemoryTracker::begin_micro_batch(int epoch, int64_t index, int64_t samples) {
  CUMULUS_CHECK(!in_micro_batch_ && !in_step_, InvalidArgument,
                "MemoryTracker::begin_micro_batch inside another micro-batch or step");
  observer_->enabled = in_timeline_window();
  if (observer_->enabled) synchronize(device_);
  allocator_.reset_peak();
  MicroBatchRecord r;
  r.epoch = epoch;
  r.index = index;
  r.samples = samples;
  records_.push_back(r);
  activations_at_start_ = allocator_.stats()[MemoryCategory::activations].current;
  t_start_ = TimePoint::now(device_);
  if (observer_->enabled) slices_.push_back({"forward", host_ms(), 0.0});
  in_micro_batch_ = true;
}

void MemoryTracker::end_forward() {
  CUMULUS_CHECK(in_micro_batch_, InvalidArgument, "MemoryTracker::end_forward outside a micro-batch");
  t_forward_end_ = TimePoint::now(device_);
  records_.back().activation_bytes = allocator_.stats()[MemoryCategory::activations].current - activations_at_start_;
  if (observer_->enabled) {
    synchronize(device_);
    slices_.back().end_ms = host_ms();
    slices_.push_back({"backward", host_ms(), 0.0});
  }
}

void MemoryTracker::end_backward() {
  CUMULUS_CHECK(in_micro_batch_, InvalidArgument, "MemoryTracker::end_backward outside a micro-batch");
  const TimePoint t_end = TimePoint::now(device_);
  const MemoryStats st = allocator_.stats();
  MicroBatchRecord& r = records_.back();
  r.peak_bytes = st.allocated_peak;
  r.peak_by_category = st.at_peak;
  r.reserved_bytes = st.reserved;
  pending_.push_back({records_.size() - 1, false, t_start_, t_forward_end_, t_end});
  if (pending_.size() >= kMaxPendingTimes) resolve_times();
  if (observer_->enabled) {
    synchronize(device_);
    slices_.back().end_ms = host_ms();
  }
  in_micro_batch_ = false;
}

void MemoryTracker::begin_step() {
  CUMULUS_CHECK(!in_micro_batch_ && !in_step_, InvalidArgument, "MemoryTracker::begin_step inside a micro-batch");
  allocator_.reset_peak();
  t_step_start_ = TimePoint::now(device_);
  if (observer_->enabled) slices_.push_back({"step", host_ms(), 0.0});
  in_step_ = true;
}

void MemoryTracker::end_step(int64_t step, int64_t optimizer_state_bytes) {
  CUMULUS_CHECK(in_step_, InvalidArgument, "MemoryTracker::end_step without begin_step");
  const TimePoint t_end = TimePoint::now(device_);
  StepRecord s;
  s.step = step;
  s.optimizer_state_bytes = optimizer_state_bytes;
  s.peak_bytes = allocator_.stats().allocated_peak;
  steps_.push_back(s);
  pending_.push_back({steps_.size() - 1, true, t_step_start_, TimePoint(), t_end});
  if (observer_->enabled) {
    synchronize(device_);
    slices_.back().end_ms = host_ms();
  }
  ++steps_taken_;
  in_step_ = false;
  if (!in_timeline_window()) observer_->enabled = false;
}

void MemoryTracker::resolve_times() {
  for (const PendingTimes& p : pending_) {
    if (p.is_step) {
      steps_[p.record].ms = p.end.ms_since(p.start);
    } else {
      records_[p.record].forward_ms = p.mid.ms_since(p.start);
      records_[p.record].backward_ms = p.end.ms_since(p.mid);
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
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const MicroBatchRecord& r : records_) {
    const double x = static_cast<double>(r.samples), y = static_cast<double>(r.activation_bytes);
    n += 1; sx += x; sy += y; sxx += x * x; sxy += x * y;
    s.peak_bytes = std::max(s.peak_bytes, r.peak_bytes);
  }
  for (const StepRecord& r : steps_) s.peak_bytes = std::max(s.peak_bytes, r.peak_bytes);
  const double var = n * sxx - sx * sx;
  if (n >= 2 && var > 1e-9 * n * sxx) s.activation_bytes_per_sample = (n * sxy - sx * sy) / var;
  else if (sx > 0) s.activation_bytes_per_sample = sy / sx;

  // Peak at B and at B*N: measured where a micro-batch of that size ran; B*N otherwise predicted
  // by scaling the part of the peak above the fixed costs linearly in the batch size.
  const int64_t b = options_.micro_batch_size, bn = b * options_.accum_steps;
  for (const MicroBatchRecord& r : records_) {
    if (r.samples == b) s.peak_at_micro_batch = std::max(s.peak_at_micro_batch, r.peak_bytes);
    if (r.samples == bn) {
      s.peak_at_effective_batch = std::max(s.peak_at_effective_batch, r.peak_bytes);
      s.effective_batch_measured = true;
    }
  }
  if (!s.effective_batch_measured && s.peak_at_micro_batch > 0 && b > 0) {
    int64_t fixed = 0;
    for (const MicroBatchRecord& r : records_)
      if (r.samples == b && r.peak_bytes == s.peak_at_micro_batch) {
        for (MemoryCategory c : {MemoryCategory::parameters, MemoryCategory::gradients,
                                 MemoryCategory::optimizer_state, MemoryCategory::workspace, MemoryCategory::data})
          fixed += r.peak_by_category[static_cast<std::size_t>(c)];
        break;
      }
    const double per_sample = static_cast<double>(s.peak_at_micro_batch - fixed) / static_cast<double>(b);
    s.peak_at_effective_batch = fixed + static_cast<int64_t>(per_sample * static_cast<double>(bn));
  }
  return s;
}

}  // namespace cumulus
