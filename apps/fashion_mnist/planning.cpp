#include "planning.h"

#include <cstdio>

#include "cumulus/memory/category.h"
#include "cumulus/memory/planner.h"
#include "run_control.h"
#include "training_setup.h"

using namespace cumulus;

namespace fmnist {
namespace {

// The planner's table, shown as soon as the library has it (before its verifying probes run and
// before the choice): every candidate with its predicted memory and time. The fallback's table (a
// line through two probes) only with --plan-only.
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
  char step[64] = "not timed (its state is allocated by the first step)";
  if (plan.step_timed) std::snprintf(step, sizeof step, "%.3g ms", plan.step_seconds * 1e3);
  say("planner: a micro-batch takes %.3g ms + %.3g ms a sample (fitted over %d probed sizes); the optimizer step "
      "%s\n",
      plan.time_fit[0].fixed_seconds * 1e3, plan.time_fit[0].seconds_per_sample * 1e3, plan.time_fit[0].probes, step);
  say("  %11s %9s %10s %15s %5s %6s %12s %10s\n", "micro-batch", "recompute", "peak MiB", "reserved bytes", "fits",
      "accum", "ms/eff.batch", "s/epoch");
  for (const PlanRow& r : plan.table) {
    const std::string reserved = line ? "-" : std::to_string(r.reserved_bytes);
    say("  %11lld %9s %10.2f %15s %5s %6lld %12.3f %10.3f\n", static_cast<long long>(r.micro_batch),
        r.recompute ? "on" : "off", static_cast<double>(r.peak_bytes) / (1 << 20), reserved.c_str(),
        budget <= 0 ? "-"
        : r.fits    ? "yes"
                    : "no",
        static_cast<long long>(r.accum_steps), r.batch_seconds * 1e3, r.epoch_seconds);
  }
}

// The recompute decision, once the choice is made.
void print_recompute(const RunConfig& o, const Plan& plan) {
  if (!plan.recompute_weighed || o.quiet || plan.micro_batch == 0) return;
  if (plan.recompute)
    say("planner: recompute on: micro-batch %lld is predicted fastest with it (largest fitting: %lld with it, %lld "
        "without)\n",
        static_cast<long long>(plan.micro_batch), static_cast<long long>(plan.largest_with_recompute),
        static_cast<long long>(plan.largest_without_recompute));
  else
    say("planner: recompute off: the plan without it is predicted fastest (largest fitting: %lld with it, %lld "
        "without)\n",
        static_cast<long long>(plan.largest_with_recompute), static_cast<long long>(plan.largest_without_recompute));
}

// The library's planner with this run; --plan-only predicts without verifying.
Plan run_planner(const RunConfig& o, nn::Model& model, const std::shared_ptr<nn::FlatParameters>& flat,
                 const data::ImageDataset& train) {
  // The run's optimizer is made after planning; one with its settings tells the planner what state
  // its first step allocates.
  const std::shared_ptr<optim::Optimizer> optimizer = make_optimizer(o, flat);
  PlanRequest request;
  request.device = o.device;
  request.effective_batch = o.effective_batch;
  request.budget = o.memory_budget_bytes;  // 0 with --plan-only alone: everything fits
  request.micro_batch = [&](int64_t b) {
    throw_if_interrupted();
    data::DataLoader loader(train, b, false, 0, o.device);  // host-resident data: staging included
    loader.set_dtype(compute_dtype(o.precision));
    const data::Batch batch = loader.batch(0);
    Tensor loss = training_loss(model, batch);
    loss.backward();
    loss = Tensor();
    flat->mark_gradients_stale();
  };
  request.optimizer = optimizer.get();
  request.sample_limit = train.size();
  if (o.recompute == RecomputeChoice::planner) request.set_recompute = [&](bool on) { model.set_recompute(on); };
  request.model = &model;
  request.verify = !o.plan_only;
  request.budget_name = "--memory-budget " + o.memory_budget;
  request.on_table = [&](const Plan& plan) { print_plan_table(o, plan); };
  return cumulus::plan_batch(request);
}

}  // namespace

BatchPlan plan_batch(const RunConfig& o, nn::Model& model, const std::shared_ptr<nn::FlatParameters>& flat,
                     const data::ImageDataset& train) {
  const Plan plan = run_planner(o, model, flat, train);
  print_recompute(o, plan);
  if (plan.micro_batch == 0) throw OutOfMemory("planner: " + plan.reason);
  if (!o.quiet) say("planner: %s\n", plan.reason.c_str());
  BatchPlan chosen{plan.micro_batch, static_cast<int>(plan.accum_steps), plan.recompute};
  for (const PlanRow& r : plan.table)
    if (r.chosen) {
      chosen.predicted_epoch_seconds = r.epoch_seconds;
      chosen.predicted_peak_bytes = r.peak_bytes;
    }
  return chosen;
}

void print_plan(const RunConfig& o, nn::Model& model, const std::shared_ptr<nn::FlatParameters>& flat,
                const data::ImageDataset& train) {
  const Plan plan = run_planner(o, model, flat, train);
  say("planner: %s\n", plan.micro_batch > 0 ? plan.reason.c_str() : ("nothing fits: " + plan.reason).c_str());
}

}  // namespace fmnist
