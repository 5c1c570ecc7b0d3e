// The micro-batch planner: predict before you run out (Note [Planning a micro-batch] and Note [Plan
// levers] in engine/plan/planner.cpp). train::plan_request fills a request for a Trainer's loop.
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
#include "cumulus/dist/collective_times.h"
#include "cumulus/memory/category.h"
#include "cumulus/optim/optimizer.h"

namespace cumulus::nn {
class Module;
}  // namespace cumulus::nn


namespace cumulus::plan {

// "1048576", "512KiB", "1.5GiB", "2GB" (KB/MB/GB: powers of 1000, KiB/MiB/GiB: of 1024; a space
// before the unit allowed) in bytes. Throws InvalidArgument naming the text.
int64_t parse_byte_size(const std::string& text);

// How a plan's table was predicted.
enum class PlanMethod {
  // Note [Memory prediction]: the recorded allocations replayed through a caching allocator.
  recorded_sequence,
  // The fallback when the recordings do not match: the state at rest and the optimizer's (in 2 MiB
  // segments) plus a line through two probes' allocated peaks, within the budget less 5%.
  probe_line,
};

// Where a training set lives: on the training device, or on the host, each batch staged (a copy each).
enum class DataPlacement : uint8_t { device, host };
const char* data_placement_name(DataPlacement placement);  // "device", "host"

// A setting of the levers besides the micro-batch (Note [Plan levers]), as PlanRequest::apply gets it.
struct PlanSetting {
  // Bit i: recompute segment i of PlanRequest::recompute_segments (0: every activation stored).
  uint32_t recompute = 0;
  DataPlacement data = DataPlacement::device;
  Precision precision = Precision::fp32;
  // Where the optimizer's state lives and in how many bits: plan_batch sets them on the optimizer
  // (Optimizer::place_state, set_state_bits), apply need not.
  optim::StatePlacement optimizer_state = optim::StatePlacement::device;
  int optimizer_bits = 32;
  // The ZeRO stage a Trainer over PlanRequest::world_size ranks trains with (0, 1 or 2): each row
  // is one rank's (rank PlanRequest::rank), its shard of the state and, at 2, of the gradients.
  int zero_stage = 0;
  bool operator==(const PlanSetting& o) const {
    return recompute == o.recompute && data == o.data && precision == o.precision &&
           optimizer_state == o.optimizer_state && optimizer_bits == o.optimizer_bits && zero_stage == o.zero_stage;
  }
  bool operator!=(const PlanSetting& o) const { return !(*this == o); }
};

// The recompute lever: "off", "all" (every segment, or any without names) or the segments on ("conv1+bn1").
std::string recompute_text(uint32_t mask, const std::vector<std::string>& segment_names = {});
// "recompute off, data on device, fp32" (the recompute part as recompute_text gives it), then
// ", optimizer state on host", ", 8-bit optimizer state" and ", ZeRO stage 2" where they are.
std::string plan_setting_text(const PlanSetting& setting, const std::vector<std::string>& segment_names = {});

// One candidate micro-batch with one setting of the levers: a divisor of the effective batch.
struct PlanRow {
  int64_t micro_batch = 0;
  int64_t accum_steps = 0;     // effective batch / micro_batch
  int64_t peak_bytes = 0;      // predicted allocated peak, the state at rest and the optimizer's included
  int64_t reserved_bytes = 0;  // predicted reserved at the peak (what a budget limits); -1 with probe_line
  std::array<int64_t, kNumMemoryCategories> peak_by_category{};  // the split at the peak (recorded_sequence)
  bool fits = true;     // predicted within the budget (always, without one)
  PlanSetting setting;  // the levers it was recorded, timed and predicted with
  // Predicted seconds (Note [Predicting time]): a micro-batch, an effective batch, an epoch (or 0).
  double micro_batch_seconds = 0.0;
  double batch_seconds = 0.0;
  double epoch_seconds = 0.0;
  // Of batch_seconds, the collectives its ZeRO stage makes over PlanRequest::world_size ranks
  // (PlanRequest::collective_times; 0 for one rank or without them).
  double communication_seconds = 0.0;
  // The spread: batch_seconds through each size's fastest and slowest timing (equal when untimed).
  double batch_seconds_low = 0.0;
  double batch_seconds_high = 0.0;
  bool chosen = false;
};

// Seconds of one micro-batch as a line in its size (units), fitted over the timed probes.
struct TimeFit {
  double fixed_seconds = 0.0;
  double seconds_per_unit = 0.0;
  int probes = 0;  // timed sizes it was fitted over (0: not fitted)
  double predict(int64_t units) const { return fixed_seconds + seconds_per_unit * static_cast<double>(units); }
};

struct Plan;

struct PlanRequest {
  Device device = Device::cpu();
  // In units (samples by default; tokens with units_per_row T): > 0, a multiple of units_per_row.
  int64_t effective_batch = 0;
  // Every micro-batch weighed, recorded or probed is whole rows of this many units (1: samples).
  int64_t units_per_row = 1;
  int64_t max_probe = 0;  // the largest micro-batch (units) the planner may run; 0: the effective batch
  // Timings of each recorded size (>= 1): the median predicts, the fastest and slowest the spread.
  int timing_repeats = 3;
  // Reserved bytes, as set_memory_limit counts them. 0: none (every divisor fits, the choice unprobed).
  int64_t budget = 0;
  // Runs one training micro-batch of `units`: batch, forward, loss, backward into the gradient
  // buffers, then frees what it allocated and discards the gradients. What it throws (an interrupt)
  // leaves plan_batch after the memory limit, the model's buffers and the levers are restored.
  std::function<void(int64_t units)> micro_batch;
  // Required: the optimizer that will train (its first update's state is held throughout).
  optim::Optimizer* optimizer = nullptr;
  // Bytes the training loop will also hold (the Trainer's state_to_allocate()), held throughout.
  std::vector<int64_t> loop_state;
  int64_t unit_limit = 0;  // the most units `micro_batch` can take (the training set's size); 0: none
  // The levers (Note [Plan levers]): `apply` puts a setting in place (recompute segments, where the
  // training set lives, the batches' precision); the chosen one is left in place, `setting` put back
  // when none is chosen or on an exception. Without `apply` only the micro-batch is planned.
  std::function<void(const PlanSetting&)> apply;
  PlanSetting setting;  // in place now: weighed first, and the levers no other setting changes
  // The segments the model can recompute (nn::Model::recompute_segment_names()): every subset is
  // weighed (at most 4 segments), or only recompute_masks (bit i: segment i; at most 32 segments).
  std::vector<std::string> recompute_segments;
  std::vector<uint32_t> recompute_masks;
  // The training set in host memory, weighed only when no setting with it on the device fits.
  bool weigh_placement = false;
  // Other precisions it may choose: an opt-in, since 16 bits change the numbers (a tie keeps ours).
  std::vector<Precision> precisions;
  // The optimizer's state in host memory (Optimizer::place_state), weighed only when nothing fits
  // with it on the device (Note [Plan levers]); the optimizer must not hold its state yet. A plan
  // that takes it leaves the optimizer placed on the host.
  bool weigh_state_placement = false;
  // The optimizer's state in 8 bits (Optimizer::set_state_bits), an opt-in since it changes the
  // numbers: weighed only when nothing fits in 32 bits (on the host too, when that is weighed),
  // and left in place by a plan that takes it.
  bool weigh_state_bits = false;
  // Data parallel training over world_size ranks, planned for this rank (Note [Plan levers]): the
  // effective batch is this rank's part, and a setting's zero_stage shards the optimizer's state
  // (1) and the gradients too (2, CPU devices), as a Trainer with that stage and bucket_bytes
  // would. weigh_zero: the stages above setting.zero_stage too, each only when nothing fits below
  // it (stage 2 sums the gradients in another order: an opt-in).
  int world_size = 1;
  int rank = 0;
  int64_t bucket_bytes = 1 << 20;
  bool weigh_zero = false;
  int64_t epoch_units = 0;  // units in an epoch, for epoch_seconds (0: unit_limit)
  // Injected timings (tests, or known from elsewhere): one micro-batch's seconds, instead of timing.
  std::function<double(int64_t units, const PlanSetting& setting)> micro_batch_seconds;
  // One optimizer step's seconds; < 0: probed when the optimizer's state exists, else not counted.
  double step_seconds = -1.0;
  // What the ranks' collectives cost (dist::measure_collective_times on the training communicator,
  // every rank calling it before the root plans; or known numbers): each row adds the reductions
  // its ZeRO stage makes in an effective batch. world_size 1 (the default): none counted.
  dist::CollectiveTimes collective_times;
  // The model whose buffers (batch norm's running statistics) probes move: restored after.
  nn::Module* model = nullptr;
  bool verify = true;  // false: predict and choose only, no probe
  // When nothing fits: throw OutOfMemory with the reason instead of returning micro_batch 0.
  bool require_fit = false;
  // How messages name the budget ("--memory-budget 3GiB"); empty: "the budget" and its bytes.
  std::string budget_name;
  // Called with the plan so far as soon as the table is known, before any verifying probe.
  std::function<void(const Plan&)> on_table;
};

struct Plan {
  PlanMethod method = PlanMethod::recorded_sequence;
  std::string prediction;             // the predictor's summary, or why there is none (probe_line)
  int64_t reserved_at_rest = 0;       // from the allocator, after its cache was emptied
  int64_t optimizer_state_bytes = 0;  // what the first update will allocate, held in every row
  // Every setting weighed (the request's first) with its time fit, reserved bytes at rest and largest
  // micro-batch predicted to fit (0: none); one whose recordings did not match is left out.
  struct Weighed {
    PlanSetting setting;
    TimeFit time;
    int64_t reserved_at_rest = 0;
    int64_t largest_fitting = 0;
    TimeFit time_low, time_high;  // through each size's fastest and slowest repeat (the spread)
  };
  std::vector<Weighed> weighed;
  // Every divisor of the effective batch, largest first, once per setting weighed; one is chosen.
  std::vector<PlanRow> table;
  double step_seconds = 0.0;  // the optimizer step's time
  bool step_timed = false;    // false: neither given nor probed, counted as 0
  dist::CollectiveTimes collective_times;  // the request's: what each row's communication is from
  // Every micro-batch the planner ran, all under the budget: wall time, largest, timings per size.
  double probe_seconds = 0.0;
  int64_t largest_probe = 0;
  int timing_repeats = 0;
  std::vector<std::string> recompute_segments;  // the request's, for plan_setting_text
  PlanSetting setting;                          // the chosen row's (the request's without a choice)
  // The choice: the fastest fitting row (ties within 2%: Note [Plan levers]) that fit its probe.
  // 0: none fits (`reason` says why).
  int64_t micro_batch = 0;
  int64_t accum_steps = 0;
  bool verified = false;            // one micro-batch of it ran under the budget, the state held
  int64_t verified_peak_bytes = 0;  // that probe's allocated and reserved peaks
  int64_t verified_reserved_bytes = 0;
  std::vector<int64_t> rejected_by_probe;  // predicted to fit, ran out of memory in their probe
  std::string reason;                      // the choice and why, or why none fits, in one sentence
};

// Records and times the micro-batch at a few sizes with each setting weighed, predicts every divisor
// of the effective batch, takes the fastest predicted to fit and verifies it with one probe (the
// next best when it runs out of memory). Prints nothing. Throws InvalidArgument for a malformed
// request, OutOfMemory when nothing fits and require_fit; what `micro_batch` throws passes through.
Plan plan_batch(const PlanRequest& request);

// The plan as a table: its basis (`budget`; 0: none), the time fits and every row, the chosen one
// starred. `unit` names what the effective batch counts ("sample", "token").
std::string plan_table_text(const Plan& plan, int64_t budget, const std::string& unit = "sample");

}  // namespace cumulus::plan
