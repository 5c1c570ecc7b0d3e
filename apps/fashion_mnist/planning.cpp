#include "planning.h"

#include <cstdio>
#include <string>

#include "cumulus/memory/category.h"
#include "cumulus/runtime/planner.h"
#include "run_control.h"
#include "training_setup.h"

using namespace cumulus;

namespace fmnist {
namespace {

// One line per weighed setting: how long a micro-batch takes by the fitted line.
void print_time_fits(const Plan& plan) {
  char step[64] = "not timed (its state is allocated by the first step)";
  if (plan.step_timed) std::snprintf(step, sizeof step, "%.3g ms", plan.step_seconds * 1e3);
  say("planner: the optimizer step %s; probes took %.3g s (the largest %lld samples, each size timed %d times); "
      "a micro-batch takes, fitted over the probed sizes:\n",
      step, plan.probe_seconds, static_cast<long long>(plan.largest_probe), plan.timing_repeats);
  for (const Plan::Weighed& w : plan.weighed)
    say("  %-46s %.3g ms + %.3g ms a sample (%d sizes); reserved at rest %s; largest fitting %lld\n",
        plan_setting_text(w.setting, plan.recompute_segments).c_str(), w.time.fixed_seconds * 1e3,
        w.time.seconds_per_sample * 1e3, w.time.probes, format_bytes(w.reserved_at_rest).c_str(),
        static_cast<long long>(w.largest_fitting));
}

// The planner's table after its choice: every candidate with its levers, predicted memory and time,
// whether it fits and which was chosen. The fallback's table (a line through two probes) only with
// --plan-only.
void print_plan_table(const RunConfig& o, const Plan& plan) {
  const int64_t budget = o.memory_budget_bytes;
  const bool line = plan.method == PlanMethod::probe_line;
  if (line && (!o.quiet || o.plan_only))
    say("planner: no prediction from the allocation sequence (%s); fitting a line through two probed peaks\n",
        plan.prediction.c_str());
  if (line ? !o.plan_only : o.quiet && !o.plan_only) return;
  if (!line)
    say("planner: predicted from the recorded allocation sequence (%s); reserved at rest %s, budget %s\n",
        plan.prediction.c_str(), format_bytes(plan.reserved_at_rest).c_str(),
        budget > 0 ? format_bytes(budget).c_str() : "none");
  print_time_fits(plan);
  say("  %11s %19s %6s %9s %10s %15s %5s %6s %12s %17s %10s %6s\n", "micro-batch", "recompute", "data", "precision",
      "peak MiB", "reserved bytes", "fits", "accum", "ms/eff.batch", "spread ms", "s/epoch", "chosen");
  for (const PlanRow& r : plan.table) {
    const std::string reserved = line ? "-" : std::to_string(r.reserved_bytes);
    char spread[40];
    std::snprintf(spread, sizeof spread, "%.3f-%.3f", r.batch_seconds_low * 1e3, r.batch_seconds_high * 1e3);
    say("  %11lld %19s %6s %9s %10.2f %15s %5s %6lld %12.3f %17s %10.3f %6s\n", static_cast<long long>(r.micro_batch),
        recompute_text(r.setting.recompute, plan.recompute_segments).c_str(), data_placement_name(r.setting.data),
        precision_name(r.setting.precision), static_cast<double>(r.peak_bytes) / (1 << 20), reserved.c_str(),
        budget <= 0 ? "-"
        : r.fits    ? "yes"
                    : "no",
        static_cast<long long>(r.accum_steps), r.batch_seconds * 1e3, spread, r.epoch_seconds, r.chosen ? "*" : "");
  }
}

// The levers this run lets the planner set (Note [Plan levers]): the model's recompute segments
// (--recompute auto), the training and test sets' placement (--data-on auto, CUDA only) and bf16
// (--precision auto, where the device has it). `apply` puts a setting in place: the model's
// segments, the sets moved, the batches' dtype.
void add_levers(const RunConfig& o, nn::Model& model, models::FashionMnistSplit& train, models::FashionMnistSplit& test,
                DType& batch_dtype, PlanRequest& request) {
  request.setting.precision = o.precision;
  if (o.recompute == RecomputeChoice::on) request.setting.recompute = 1;  // shown as "all" (no segment names)
  request.setting.data = o.data_on == DataOnChoice::host ? DataPlacement::host : DataPlacement::device;
  if (o.recompute == RecomputeChoice::planner) request.recompute_segments = model.recompute_segment_names();
  request.weigh_placement = o.data_on == DataOnChoice::planner;
  if (o.precision_by_planner && precision_unsupported_reason(Precision::bf16, o.device).empty())
    request.precisions = {Precision::bf16};
  request.apply = [&o, &model, &train, &test, &batch_dtype](const PlanSetting& s) {
    if (o.recompute == RecomputeChoice::planner) model.set_recompute_segments(s.recompute);
    const Device where = s.data == DataPlacement::host ? Device::cpu() : o.device;
    const MemoryCategoryScope scope(MemoryCategory::data);
    for (models::FashionMnistSplit* set : {&train, &test})
      *set = models::FashionMnistSplit{set->images.to(where), set->labels.to(where), set->num_classes};
    batch_dtype = compute_dtype(s.precision);
  };
}

// The library's planner with this run; --plan-only predicts without verifying.
Plan run_planner(const RunConfig& o, nn::Model& model, const std::shared_ptr<nn::FlatParameters>& flat,
                 models::FashionMnistSplit& train, models::FashionMnistSplit& test) {
  // The run's optimizer is made after planning; one with its settings tells the planner what state
  // its first step allocates.
  const std::shared_ptr<optim::Optimizer> optimizer = make_optimizer(o, flat);
  DType batch_dtype = compute_dtype(o.precision);
  PlanRequest request;
  request.device = o.device;
  request.effective_batch = o.effective_batch;
  request.budget = o.memory_budget_bytes;  // 0 with --plan-only alone: everything fits
  request.micro_batch = [&](int64_t b) {
    throw_if_interrupted();
    data::DataLoader loader(train.tensors(), b, false, 0, o.device);  // host-resident data: staging included
    loader.set_dtype(batch_dtype);
    loader.seek(0);
    // As the Trainer's closure: the batch is released before backward (only what the graph saves stays).
    Tensor loss = training_loss(model, loader.next(0));
    loss.backward();
    loss = Tensor();
    flat->mark_gradients_stale();
  };
  request.optimizer = optimizer.get();
  request.loop_state = optim::Trainer::state_to_allocate();  // the Trainer's
  request.sample_limit = train.size();
  add_levers(o, model, train, test, batch_dtype, request);
  request.model = &model;
  request.verify = !o.plan_only;
  request.budget_name = "--memory-budget " + o.memory_budget;
  const Plan plan = cumulus::plan_batch(request);
  print_plan_table(o, plan);
  return plan;
}

}  // namespace

BatchPlan plan_batch(const RunConfig& o, nn::Model& model, const std::shared_ptr<nn::FlatParameters>& flat,
                     models::FashionMnistSplit& train, models::FashionMnistSplit& test) {
  const Plan plan = run_planner(o, model, flat, train, test);
  if (plan.micro_batch == 0) throw OutOfMemory("planner: " + plan.reason);
  if (!o.quiet) say("planner: %s\n", plan.reason.c_str());
  BatchPlan chosen{plan.micro_batch, static_cast<int>(plan.accum_steps), plan.setting,
                   plan_setting_text(plan.setting, plan.recompute_segments)};
  for (const PlanRow& r : plan.table)
    if (r.chosen) {
      chosen.predicted_epoch_seconds = r.epoch_seconds;
      chosen.predicted_peak_bytes = r.peak_bytes;
    }
  return chosen;
}

void print_plan(const RunConfig& o, nn::Model& model, const std::shared_ptr<nn::FlatParameters>& flat,
                models::FashionMnistSplit& train, models::FashionMnistSplit& test) {
  const Plan plan = run_planner(o, model, flat, train, test);
  say("planner: %s\n", plan.micro_batch > 0 ? plan.reason.c_str() : ("nothing fits: " + plan.reason).c_str());
}

}  // namespace fmnist
