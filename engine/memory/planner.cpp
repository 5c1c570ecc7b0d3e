#include "cumulus/memory/planner.h"

// Note [Planning a micro-batch]
// plan_batch answers "which micro-batch, accumulated how many times, trains within this budget?"
// for a budget in reserved bytes, because that is what a device (or CachingAllocator's limit) runs
// out of. The rule it replaced, plan_micro_batch, held a line through two probes' allocated peaks
// against such a budget and never saw the optimizer state; it said micro-batch 1024 fits, and 1024
// ran out of memory once the first step had allocated AdamW's two copies of the parameters.
//
// So the table predicts every divisor of the effective batch from the recorded allocation sequence
// (Note [Memory prediction]), replayed from the state at rest plus the optimizer's state: the first
// step allocates it and every later micro-batch runs beside it, so a plan made before that step
// must hold it. The optimizer says what that is (Optimizer::state_to_allocate()), so an optimizer
// added later is counted without the planner knowing it. The largest divisor predicted to fit is
// verified by one real micro-batch under the budget, the state held as real blocks; a probe that
// runs out of memory moves the choice to the next smaller divisor, so a prediction that is off
// costs a probe, not the run. Without a budget there is nothing to verify against: every divisor
// fits and the whole effective batch is taken unprobed.
//
// The request takes a function that runs one training micro-batch rather than a model, so any
// model, loss and data path plans the same way (the app's loader stages host-resident data, for
// instance); what that function allocates is what is predicted, and blocks the loop will hold that
// neither exist now nor come from it (an Accumulator's learning-rate table and loss seed) are not
// seen. With a recompute lever, recompute is recorded and predicted too and turned on only when it
// lets a larger micro-batch fit, since it costs time. Probes are training forwards, so batch norm's
// running statistics are copied first and written back, also when an interrupt thrown from the
// micro-batch ends the call. The planner prints nothing: the caller shows plan.table and
// plan.reason, and on_table lets it show the table before the probes, which may take long. No
// choice is a plan with micro_batch 0 rather than an exception, so --plan-only can still show why.
// When the recordings do not match (an allocation pattern that changes with the size), the
// fallback is a line through two small probes' allocated peaks on top of the reserved bytes at rest
// and the state (each block in a segment of its own), with a 5% margin, verified the same way.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "cumulus/core/error.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/memory/category.h"
#include "cumulus/memory/prediction.h"
#include "cumulus/nn/module.h"
#include "cumulus/optim/optimizer.h"

namespace cumulus {

int64_t parse_byte_size(const std::string& text) {
  const char* s = text.c_str();
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(s, &end);
  const bool number_ok = end != s && errno == 0 && std::isfinite(value) && value >= 0 && !std::isspace(static_cast<unsigned char>(*s));
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
                "' (expected a number of bytes with an optional unit: B, KiB, MiB, GiB, TiB, KB, MB, GB, TB; e.g. 64MiB, 1.5GiB)");
  CUMULUS_CHECK(mult > 1 || std::floor(value) == value, InvalidArgument, "invalid size '", text,
                "': a byte count must be a whole number");
  return static_cast<int64_t>(std::llround(bytes));
}

MemoryCost memory_cost_from_probes(int64_t small, int64_t small_peak, int64_t large, int64_t large_peak) {
  CUMULUS_CHECK(0 < small && small < large, InvalidArgument, "memory_cost_from_probes: need 0 < small < large, got ",
                small, " and ", large);
  MemoryCost c;
  c.peak_bytes_per_sample = std::max(0.0, static_cast<double>(large_peak - small_peak) / static_cast<double>(large - small));
  c.fixed_bytes = std::max<int64_t>(0, small_peak - static_cast<int64_t>(c.peak_bytes_per_sample * static_cast<double>(small)));
  return c;
}

namespace {

constexpr double kLineMargin = 0.05;  // the probe line's room for what it misses (rounding, segments)

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

// The allocator's limit for a scope (the budget), the caller's restored after.
class LimitScope {
 public:
  LimitScope(CachingAllocator& alloc, int64_t limit) : alloc_(alloc), before_(alloc.memory_limit()) {
    alloc_.set_memory_limit(limit);
  }
  ~LimitScope() { alloc_.set_memory_limit(before_); }
  LimitScope(const LimitScope&) = delete;
  LimitScope& operator=(const LimitScope&) = delete;

 private:
  CachingAllocator& alloc_;
  int64_t before_;
};

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

// The steps of one plan_batch call and what they share.
class Planner {
 public:
  Planner(const PlanRequest& request, CachingAllocator& alloc);
  Plan run();

 private:
  MemoryPredictor record() const;
  std::vector<PlanRow> rows_from(const MemoryPredictor& predictor) const;
  int64_t largest_fitting(const std::vector<PlanRow>& rows) const;
  void weigh_recompute();
  bool probe(int64_t micro_batch, MemoryStats& measured);
  int64_t line_probe(int64_t micro_batch);
  bool probing() const { return req_.verify && req_.budget > 0; }
  std::size_t pick(MemoryStats& measured);
  void choose_from_recording();
  MemoryCost line_cost();
  void plan_with_line(const std::string& why_not_recorded);
  std::string steps_text(const PlanRow& row) const;
  std::string larger_text(std::size_t row) const;
  std::string budget_text() const;

  const PlanRequest& req_;
  CachingAllocator& alloc_;
  std::vector<int64_t> state_;  // the optimizer state's blocks, requested bytes
  std::vector<int64_t> divisors_;
  int64_t large_ = 0;  // recordings at large_ and large_ / 2
  Plan plan_;
};

Planner::Planner(const PlanRequest& request, CachingAllocator& alloc)
    : req_(request),
      alloc_(alloc),
      state_(request.optimizer->state_to_allocate()),
      divisors_(divisors_largest_first(request.effective_batch)) {
  // 128 and 256 make each size's fit exact (Note [Memory prediction]); smaller when samples are few.
  large_ = 256;
  while (req_.sample_limit > 0 && large_ > req_.sample_limit) large_ /= 2;
  for (int64_t b : state_) plan_.optimizer_state_bytes += round_up(b, CachingAllocator::kRounding);
}

MemoryPredictor Planner::record() const {
  if (large_ < 2) return {};
  std::vector<FixedBlock> fixed;
  for (int64_t b : state_) fixed.push_back(FixedBlock{MemoryCategory::optimizer_state, b});
  return record_micro_batch(alloc_, req_.micro_batch, large_ / 2, large_, std::move(fixed));
}

std::vector<PlanRow> Planner::rows_from(const MemoryPredictor& predictor) const {
  std::vector<PlanRow> rows;
  for (int64_t b : divisors_) {
    const PredictedMemory m = predictor.predict(b);
    PlanRow r;
    r.micro_batch = b;
    r.accum_steps = req_.effective_batch / b;
    r.peak_bytes = m.peak_bytes;
    r.reserved_bytes = m.reserved_bytes;
    r.peak_by_category = m.peak_by_category;
    r.fits = req_.budget <= 0 || m.reserved_bytes <= req_.budget;
    rows.push_back(r);
  }
  return rows;
}

int64_t Planner::largest_fitting(const std::vector<PlanRow>& rows) const {
  for (const PlanRow& r : rows)
    if (r.fits) return r.micro_batch;
  return 0;
}

// Recompute costs time: recorded and taken only when a larger micro-batch fits with it.
void Planner::weigh_recompute() {
  plan_.recompute_weighed = true;
  const int64_t without = largest_fitting(plan_.table);
  plan_.largest_without_recompute = without;
  if (without == req_.effective_batch) return;
  req_.set_recompute(true);
  try {
    const MemoryPredictor with = record();
    if (with.ok()) {
      std::vector<PlanRow> rows = rows_from(with);
      plan_.largest_with_recompute = largest_fitting(rows);
      if (plan_.largest_with_recompute > without) {
        plan_.table = std::move(rows);
        plan_.recompute = true;
      }
    }
  } catch (...) {
    req_.set_recompute(false);
    throw;
  }
  if (!plan_.recompute) req_.set_recompute(false);
}

// One micro-batch under the budget beside the optimizer state; false if it ran out of memory.
bool Planner::probe(int64_t micro_batch, MemoryStats& measured) {
  bool fits = true;
  try {
    std::vector<Allocation> state;
    for (int64_t b : state_)
      state.push_back(alloc_.allocate(static_cast<std::size_t>(b), MemoryCategory::optimizer_state));
    alloc_.reset_peak();
    req_.micro_batch(micro_batch);
  } catch (const OutOfMemory&) {
    fits = false;
    req_.optimizer->zero_grad();  // a backward cut short may have written some
  }
  measured = alloc_.stats();
  alloc_.empty_cache();
  return fits;
}

// The allocated peak of one micro-batch (the fallback's line).
int64_t Planner::line_probe(int64_t micro_batch) {
  alloc_.reset_peak();
  try {
    req_.micro_batch(micro_batch);
  } catch (const OutOfMemory&) {
    req_.optimizer->zero_grad();
    throw;
  }
  return alloc_.stats().allocated_peak;
}

// The first row predicted to fit that also fits its probe (none is run without a budget or with
// verify off); table.size() when none does.
std::size_t Planner::pick(MemoryStats& measured) {
  for (std::size_t i = 0; i < plan_.table.size(); ++i) {
    const PlanRow& r = plan_.table[i];
    if (!r.fits) continue;
    if (probing() && !probe(r.micro_batch, measured)) {
      plan_.rejected_by_probe.push_back(r.micro_batch);
      continue;
    }
    plan_.micro_batch = r.micro_batch;
    plan_.accum_steps = r.accum_steps;
    plan_.verified = probing();
    if (plan_.verified) {
      plan_.verified_peak_bytes = measured.allocated_peak;
      plan_.verified_reserved_bytes = measured.reserved_peak;
    }
    return i;
  }
  return plan_.table.size();
}

std::string Planner::steps_text(const PlanRow& row) const {
  return "micro-batch " + std::to_string(row.micro_batch) + " x " + std::to_string(row.accum_steps) +
         " steps = effective batch " + std::to_string(req_.effective_batch);
}

// Why the row above `row` was not chosen.
std::string Planner::larger_text(std::size_t row) const {
  const PlanRow& r = plan_.table[row];
  const std::vector<int64_t>& rejected = plan_.rejected_by_probe;
  if (std::find(rejected.begin(), rejected.end(), r.micro_batch) != rejected.end())
    return "micro-batch " + std::to_string(r.micro_batch) + " ran out of memory in its probe";
  if (plan_.method == PlanMethod::probe_line)
    return "the next larger divisor, " + std::to_string(r.micro_batch) + ", would need " + format_bytes(r.peak_bytes);
  return "micro-batch " + std::to_string(r.micro_batch) + " would reserve " + format_bytes(r.reserved_bytes);
}

std::string Planner::budget_text() const {
  return req_.budget_name.empty() ? "the budget " + format_bytes(req_.budget) : req_.budget_name;
}

void Planner::choose_from_recording() {
  MemoryStats measured;
  const std::size_t i = pick(measured);
  if (i == plan_.table.size()) {
    plan_.reason = "no micro-batch dividing " + std::to_string(req_.effective_batch) + " fits " + budget_text() +
                   " (a micro-batch of 1 is predicted to reserve " + format_bytes(plan_.table.back().reserved_bytes) +
                   ", reserved at rest " + format_bytes(plan_.reserved_at_rest) + ")";
    return;
  }
  const PlanRow& r = plan_.table[i];
  plan_.reason =
      steps_text(r) + ": predicted peak " + format_bytes(r.peak_bytes) + ", reserved " + format_bytes(r.reserved_bytes);
  if (req_.budget <= 0) {
    plan_.reason += " (no budget)";
    return;
  }
  plan_.reason += " within the budget " + format_bytes(req_.budget) + " (" +
                  (i == 0 ? "the whole effective batch fits" : larger_text(i - 1)) + ")";
  plan_.reason += plan_.verified ? "; verified by a probe micro-batch under the limit: peak " +
                                       format_bytes(plan_.verified_peak_bytes) + ", reserved " +
                                       format_bytes(plan_.verified_reserved_bytes)
                                 : "; not verified by a probe";
}

// The fallback's cost: reserved at rest plus the state, each block in a segment of its own (over
// for small blocks, which share segments), plus a line through two small probes' allocated peaks.
MemoryCost Planner::line_cost() {
  const int64_t samples = req_.sample_limit > 0 ? req_.sample_limit : req_.effective_batch;
  const int64_t large = std::min<int64_t>({req_.effective_batch, 8, samples});
  const int64_t small = std::max<int64_t>(1, large / 2);
  const int64_t small_peak = line_probe(small);
  const int64_t large_peak = large > small ? line_probe(large) : small_peak;
  MemoryCost cost =
      large > small ? memory_cost_from_probes(small, small_peak, large, large_peak) : MemoryCost{small_peak, 0.0};
  alloc_.empty_cache();
  cost.fixed_bytes = plan_.reserved_at_rest;
  for (int64_t b : state_) cost.fixed_bytes += round_up(b, CachingAllocator::kLargeSegmentRounding);
  return cost;
}

void Planner::plan_with_line(const std::string& why_not_recorded) {
  plan_.method = PlanMethod::probe_line;
  plan_.prediction = why_not_recorded;
  alloc_.empty_cache();
  plan_.reserved_at_rest = alloc_.stats().reserved;
  const MemoryCost cost = line_cost();
  const int64_t usable = static_cast<int64_t>(static_cast<double>(req_.budget) * (1.0 - kLineMargin));
  for (int64_t b : divisors_) {
    PlanRow r;
    r.micro_batch = b;
    r.accum_steps = req_.effective_batch / b;
    r.peak_bytes = cost.predicted_peak(b);
    r.reserved_bytes = -1;
    r.fits = req_.budget <= 0 || r.peak_bytes <= usable;
    plan_.table.push_back(r);
  }
  if (req_.on_table) req_.on_table(plan_);
  MemoryStats measured;
  const std::size_t i = pick(measured);
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
                 format_bytes(cost.fixed_bytes) + " + " +
                 format_bytes(static_cast<int64_t>(cost.peak_bytes_per_sample)) + "/sample)";
  if (req_.budget <= 0) {
    plan_.reason += " (no budget)";
    return;
  }
  plan_.reason += " within " + format_bytes(usable) + " (budget " + format_bytes(req_.budget) + " less " +
                  std::to_string(static_cast<int>(kLineMargin * 100)) + "% margin)";
  if (i > 0) plan_.reason += "; " + larger_text(i - 1);
  plan_.reason += plan_.verified ? "; verified by a probe micro-batch under the limit" : "; not verified by a probe";
}

Plan Planner::run() {
  const MemoryPredictor predictor = record();
  if (!predictor.ok()) {
    plan_with_line(predictor.reason().empty() ? "the training set is too small to record" : predictor.reason());
    return std::move(plan_);
  }
  plan_.method = PlanMethod::recorded_sequence;
  plan_.prediction = predictor.reason();
  plan_.reserved_at_rest = predictor.rest_reserved();
  plan_.table = rows_from(predictor);
  if (req_.set_recompute) weigh_recompute();
  if (req_.on_table) req_.on_table(plan_);
  choose_from_recording();
  return std::move(plan_);
}

}  // namespace

Plan plan_batch(const PlanRequest& request) {
  CUMULUS_CHECK(request.effective_batch > 0, InvalidArgument, "plan_batch: the effective batch must be > 0, got ",
                request.effective_batch);
  CUMULUS_CHECK(request.budget >= 0 && request.sample_limit >= 0, InvalidArgument,
                "plan_batch: the budget and the sample limit must be >= 0");
  CUMULUS_CHECK(static_cast<bool>(request.micro_batch), InvalidArgument, "plan_batch: no micro-batch function");
  CUMULUS_CHECK(request.optimizer != nullptr, InvalidArgument,
                "plan_batch: no optimizer (its first step's state is part of every micro-batch's memory)");
  CUMULUS_CHECK(request.optimizer->parameters().device() == request.device, InvalidArgument,
                "plan_batch: the optimizer's parameters are on ", request.optimizer->parameters().device().str(),
                ", the request is for ", request.device.str());
  CachingAllocator& alloc = allocator_for(request.device);
  const LimitScope limit(alloc, request.budget > 0 ? request.budget : alloc.memory_limit());
  const BufferRestore buffers(request.model);
  Plan plan = Planner(request, alloc).run();
  CUMULUS_CHECK(plan.micro_batch > 0 || !request.require_fit, OutOfMemory, "plan_batch: ", plan.reason);
  return plan;
}

}  // namespace cumulus
