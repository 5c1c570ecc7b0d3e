// Budgets and the micro-batch planner (docs/ARCHITECTURE.md, "Memory accounting"; Note [Planning a
// micro-batch] and Note [Plan levers] in engine/plan/planner.cpp): predict before you run out.
//
//   PlanRequest r;
//   r.device = device;
//   r.effective_batch = 1024;
//   r.budget = parse_byte_size("3GiB");        // reserved bytes, as CachingAllocator's limit counts them
//   r.micro_batch = [&](int64_t b) { ... };    // forward, loss, backward of b units; grads discarded
//   r.units_per_row = 1;                       // or T: micro-batches of whole sequences of T tokens
//   r.optimizer = optimizer.get();             // its first step's state is counted
//   r.recompute_segments = model.recompute_segment_names();  // optional levers, put in place by
//   r.apply = [&](const PlanSetting& s) { model.set_recompute_segments(s.recompute); };  // apply
//   const Plan plan = plan_batch(r);           // plan.micro_batch x plan.accum_steps, plan.setting
//   plan.table[i].epoch_seconds                // predicted time (r.epoch_units or unit_limit)
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cumulus/core/device.h"
#include "cumulus/core/precision.h"
#include "cumulus/memory/category.h"

namespace cumulus::nn {
class Module;
}  // namespace cumulus::nn
namespace cumulus::optim {
class Optimizer;
}  // namespace cumulus::optim

namespace cumulus::plan {

// Parses a byte size: "1048576", "512KiB", "64MiB", "1.5GiB", "2GB" (KB/MB/GB are powers of 1000,
// KiB/MiB/GiB of 1024; a space before the unit is allowed). Throws InvalidArgument naming the text.
int64_t parse_byte_size(const std::string& text);

// How a plan's table was predicted.
enum class PlanMethod {
  // Note [Memory prediction]: the recorded allocation sequence replayed through a caching
  // allocator; peak and reserved bytes.
  recorded_sequence,
  // The fallback when the recordings do not match: reserved bytes at rest and the optimizer state
  // (each block rounded to a 2 MiB segment) plus a line through two probes' allocated peaks,
  // within the budget less a 5% margin. No reserved bytes.
  probe_line,
};

// Where a training set lives: on the training device, or in host memory with each batch staged to
// the device (no device memory for the set, a copy per batch).
enum class DataPlacement : uint8_t { device, host };
const char* data_placement_name(DataPlacement placement);  // "device", "host"

// A setting of the levers besides the micro-batch (Note [Plan levers]): what a row is predicted
// with and what PlanRequest::apply puts in place.
struct PlanSetting {
  // Bit i: recompute segment i of PlanRequest::recompute_segments (0: every activation stored).
  uint32_t recompute = 0;
  DataPlacement data = DataPlacement::device;
  Precision precision = Precision::fp32;
  bool operator==(const PlanSetting& o) const {
    return recompute == o.recompute && data == o.data && precision == o.precision;
  }
  bool operator!=(const PlanSetting& o) const { return !(*this == o); }
};

// The recompute lever alone: "off", "all" (every segment, or any without names) or the segments on
// ("conv1+bn1").
std::string recompute_text(uint32_t mask, const std::vector<std::string>& segment_names = {});
// "recompute off, data on device, fp32" (the recompute part as recompute_text gives it).
std::string plan_setting_text(const PlanSetting& setting, const std::vector<std::string>& segment_names = {});

// One candidate micro-batch with one setting of the levers: a divisor of the effective batch.
struct PlanRow {
  int64_t micro_batch = 0;
  int64_t accum_steps = 0;     // effective batch / micro_batch
  int64_t peak_bytes = 0;      // predicted allocated peak, the state at rest and the optimizer state included
  int64_t reserved_bytes = 0;  // predicted reserved at the peak (what a budget limits); -1 with probe_line
  std::array<int64_t, kNumMemoryCategories> peak_by_category{};  // the split at the peak (recorded_sequence)
  // Predicted within the budget (always, without one).
  bool fits = true;
  PlanSetting setting;  // the levers it was recorded, timed and predicted with
  // Predicted time (Note [Predicting time]): one micro-batch, one effective batch (accum_steps
  // micro-batches and one optimizer step), and an epoch of PlanRequest::epoch_units (0 without).
  double micro_batch_seconds = 0.0;
  double batch_seconds = 0.0;
  double epoch_seconds = 0.0;
  // The prediction's spread: batch_seconds from the lines through each size's fastest and slowest
  // of the repeated timings (PlanRequest::timing_repeats); equal to batch_seconds when untimed.
  double batch_seconds_low = 0.0;
  double batch_seconds_high = 0.0;
  bool chosen = false;
};

// Seconds of one micro-batch as a line in its size (units), fitted over the timed probes.
struct TimeFit {
  double fixed_seconds = 0.0;
  double seconds_per_unit = 0.0;
  int probes = 0;  // timed probe sizes it was fitted over (0: not fitted)
  double predict(int64_t units) const { return fixed_seconds + seconds_per_unit * static_cast<double>(units); }
};

struct Plan;

struct PlanRequest {
  Device device = Device::cpu();
  // In units (samples by default; tokens, say, with units_per_row T): > 0, a multiple of units_per_row.
  int64_t effective_batch = 0;
  // Units per row of the data: every micro-batch weighed, recorded or probed is a whole number of
  // rows (a multiple of this), and micro_batch is called with units. 1: a row is a unit (a sample).
  int64_t units_per_row = 1;
  // The largest micro-batch the planner may run (units): 0, the effective batch (no probe is larger
  // than the job runs); more, to record larger micro-batches explicitly.
  int64_t max_probe = 0;
  // How many times each recorded size is timed (Note [Predicting time]): the median sets the
  // prediction, the fastest and slowest its spread (PlanRow::batch_seconds_low/high). >= 1.
  int timing_repeats = 3;
  // Reserved bytes (what CachingAllocator::set_memory_limit counts, and what a smaller device runs
  // out of). 0: none; every divisor is predicted and fits, and the fastest is chosen, unprobed.
  int64_t budget = 0;
  // Runs one training micro-batch of `units`: batch, forward, loss, backward into the gradient
  // buffers, then frees all it allocated and discards the gradients (called at several sizes,
  // also above and below the choice). May throw (an interrupt): the exception leaves plan_batch
  // after the allocator's limit, the model's buffers and the levers' setting are restored.
  std::function<void(int64_t units)> micro_batch;
  // The optimizer that will train: the state its first update allocates (state_to_allocate()) is
  // held in every prediction and probe. Its gradients are discarded after a probe that ran out of
  // memory. Required.
  optim::Optimizer* optimizer = nullptr;
  // Blocks the training loop will hold beside every micro-batch that exist neither now nor in one
  // (bytes requested, category other): the Trainer's state_to_allocate(), its learning-rate
  // table. Held in every prediction and probe.
  std::vector<int64_t> loop_state;
  // The most units `micro_batch` can take (the training set's size in units): recordings stay within
  // it. 0: no limit.
  int64_t unit_limit = 0;
  // The levers (Note [Plan levers]). `apply` puts a setting in place (the model's recompute
  // segments, where the training set lives, the batches' precision) before micro-batches run with
  // it; the planner records, times and predicts every divisor with each setting it weighs, leaves
  // the chosen one in place, and puts `setting` back when none is chosen or an exception leaves.
  // Without `apply` only the micro-batch is planned, with `setting` as the rows' setting.
  std::function<void(const PlanSetting&)> apply;
  PlanSetting setting;  // in place now: weighed first, and the levers no other setting changes
  // Recompute: the segments the model can recompute (nn::Model::recompute_segment_names()). Every
  // subset of them is weighed (then at most 4 segments), or only the subsets in recompute_masks
  // (bit i: segment i; at most 32 segments), e.g. "the first k of L equal blocks" for k = 0..L.
  std::vector<std::string> recompute_segments;
  std::vector<uint32_t> recompute_masks;
  // Data placement: the training set in host memory is weighed only when no setting with it on
  // the device fits (staging costs a copy a batch; measured differences below that are noise).
  bool weigh_placement = false;
  // Precision: others the planner may choose besides setting.precision. An explicit opt-in, since
  // a 16-bit plan changes the numbers; a tie in time keeps setting.precision.
  std::vector<Precision> precisions;
  // Units in an epoch, for each row's epoch_seconds (0: unit_limit).
  int64_t epoch_units = 0;
  // Injected timings (tests, or timings known from elsewhere): seconds of one micro-batch of
  // `units` with the setting given, used instead of timing the probes.
  std::function<double(int64_t units, const PlanSetting& setting)> micro_batch_seconds;
  // Seconds of one optimizer step; < 0: timed by one probed step when the optimizer's state is
  // already held (its parameters, state and update count restored after), else not counted.
  double step_seconds = -1.0;
  // Optional: the model whose buffers (batch norm's running statistics) the probes' training
  // forwards move; they are copied first and written back when plan_batch returns or throws.
  nn::Module* model = nullptr;
  // False: predict and choose only, no probe (plan.verified stays false).
  bool verify = true;
  // True: when no micro-batch fits, plan_batch throws OutOfMemory with the plan's reason instead of
  // returning a plan with micro_batch 0 (train::plan_request's requests ask for this).
  bool require_fit = false;
  // How messages name the budget, e.g. the flag it came from ("--memory-budget 3GiB"); empty: "the
  // budget" and its bytes.
  std::string budget_name;
  // Optional: called once with the plan so far (table, prediction, recompute; no choice yet) as
  // soon as the table is known, before any verifying probe, so that it can be shown early.
  std::function<void(const Plan&)> on_table;
};

struct Plan {
  PlanMethod method = PlanMethod::recorded_sequence;
  // The predictor's one-line summary, or why there is no prediction (probe_line).
  std::string prediction;
  int64_t reserved_at_rest = 0;       // from the allocator, after its cache was emptied
  int64_t optimizer_state_bytes = 0;  // what the first update will allocate, held in every row
  // Every setting weighed, in order (the request's first), with its time fit (Note [Predicting
  // time]), its reserved bytes at rest and the largest micro-batch predicted to fit with it (0:
  // none). A setting whose recordings did not match is left out (plan_setting_text and why in
  // `prediction`).
  struct Weighed {
    PlanSetting setting;
    TimeFit time;
    int64_t reserved_at_rest = 0;
    int64_t largest_fitting = 0;
    TimeFit time_low, time_high;  // through each size's fastest and slowest repeat (the spread)
  };
  std::vector<Weighed> weighed;
  // Every divisor of the effective batch, largest first, each once per weighed setting in the
  // order weighed. Exactly one row is chosen when a plan is.
  std::vector<PlanRow> table;
  // The optimizer step's time (step_timed false: neither given nor probed, counted as 0).
  double step_seconds = 0.0;
  bool step_timed = false;
  // The probes: every micro-batch the planner ran (recordings, their timing repeats, the fallback's
  // line and the verifying probes), all under the budget: their wall time, the largest (units; no
  // more than the effective batch unless PlanRequest::max_probe asks) and the repeats per size.
  double probe_seconds = 0.0;
  int64_t largest_probe = 0;
  int timing_repeats = 0;
  std::vector<std::string> recompute_segments;  // the request's, for plan_setting_text
  PlanSetting setting;                          // the chosen row's (the request's without a choice)
  // The choice: the fitting row with the smallest predicted time (a tie within 2%: Note [Plan
  // levers]) that also fit its probe. 0: none fits (reason says why; the caller decides
  // whether that is an error).
  int64_t micro_batch = 0;
  int64_t accum_steps = 0;
  bool verified = false;            // one micro-batch of it ran under the budget, the state held
  int64_t verified_peak_bytes = 0;  // that probe's allocated and reserved peaks
  int64_t verified_reserved_bytes = 0;
  std::vector<int64_t> rejected_by_probe;  // predicted to fit, ran out of memory in their probe
  std::string reason;                      // the choice and why, or why none fits, in one sentence
};

// Plans the micro-batch for `request.effective_batch` under `request.budget`: records the
// micro-batch's allocations at two sizes no larger than the effective batch (and smaller ones) with
// each setting of the levers, under the budget, timing each size timing_repeats times, predicts
// every divisor from the state at rest plus the optimizer's first-step state, and takes the fastest
// predicted to fit (ties within 2%: Note [Plan levers]), verified with one probe micro-batch under
// the budget, falling back to the next best when the probe runs out of memory. Prints nothing.
// Throws InvalidArgument for a malformed request, OutOfMemory when nothing fits and the request
// requires a fit; what `micro_batch` throws (other than an OutOfMemory in a verifying probe)
// passes through.
Plan plan_batch(const PlanRequest& request);

// The plan as a table to print, each line ending in a newline: where the prediction came from (a
// recorded allocation sequence: the state at rest and the budget, `budget` 0 for none), the
// optimizer step's and each weighed setting's time fit, then every candidate row (micro-batch,
// levers, predicted peak and reserved bytes, whether it fits, accumulation steps, time per
// effective batch with its spread and per epoch, the chosen one starred). `unit` names what the
// effective batch counts ("sample", "token").
std::string plan_table_text(const Plan& plan, int64_t budget, const std::string& unit = "sample");

}  // namespace cumulus::plan
