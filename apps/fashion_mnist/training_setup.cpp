#include "training.h"

#include <cstdio>

#include "cumulus/dist/collective_times.h"
#include "cumulus/io/state_dict.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/models/cnn.h"
#include "cumulus/models/mlp.h"
#include "cumulus/ops/loss.h"
#include "cumulus/optim/adamw.h"
#include "cumulus/optim/sgd.h"
#include "cumulus/plan/planner.h"
#include "run_control.h"

using namespace cumulus;

namespace fmnist {

std::unique_ptr<nn::Model> make_model(const RunConfig& o, Generator& gen) {
  std::unique_ptr<nn::Model> model;
  if (o.model == ModelKind::cnn) model = std::make_unique<models::CNN>(gen, o.device);
  else model = std::make_unique<models::SeedMLP>(gen, o.device);
  model->set_recompute(o.recompute == RecomputeChoice::on);  // auto: off until the planner decides
  model->set_kernels(o.kernels);                             // fused checked against the model by resolve_run_config()
  return model;
}

Tensor training_loss(nn::Model& model, const data::Batch& batch) {
  return model.loss(batch.x, batch.y, ops::Reduction::Sum);
}

std::string kernels_used(const nn::Model& model, const RunConfig& o, int64_t batch) {
  return nn::kernel_choice_name(model.kernels_for(o.device, compute_dtype(o.precision), batch));
}

namespace {
std::shared_ptr<optim::Optimizer> make_update_rule(const RunConfig& o, std::shared_ptr<nn::FlatParameters> flat) {
  if (o.optimizer == OptimizerKind::adamw) {
    optim::AdamWOptions a;
    a.lr = o.lr;
    a.beta1 = o.beta1;
    a.beta2 = o.beta2;
    a.eps = o.eps;
    a.weight_decay = o.weight_decay;
    a.state_bits = o.optimizer_bits;
    return std::make_shared<optim::AdamW>(flat, a);
  }
  optim::SGDOptions s;
  s.lr = o.lr;
  s.momentum = o.momentum;
  s.nesterov = o.nesterov;
  s.weight_decay = o.weight_decay;
  s.state_bits = o.optimizer_bits;
  return std::make_shared<optim::SGD>(flat, s);
}
}  // namespace

std::shared_ptr<optim::Optimizer> make_optimizer(const RunConfig& o, std::shared_ptr<nn::FlatParameters> flat) {
  std::shared_ptr<optim::Optimizer> optimizer = make_update_rule(o, std::move(flat));
  optimizer->place_state(o.optimizer_state);
  return optimizer;
}

std::shared_ptr<const optim::LRSchedule> make_lr_schedule(const RunConfig& o, int64_t micro_batches) {
  if (o.lr_schedule == LrScheduleKind::step) return std::make_shared<optim::StepLR>(o.lr, o.lr_step_size, o.lr_gamma);
  if (o.lr_schedule == LrScheduleKind::cosine) {
    const int64_t total = train::optimizer_steps_in_epochs(o.accum_schedule_all_ranks(), micro_batches, o.epochs);
    if (o.warmup_steps >= total)
      throw UsageFailure("--warmup-steps " + std::to_string(o.warmup_steps) + " must be below the run's " +
                         std::to_string(total) + " optimizer steps");
    return std::make_shared<optim::CosineWarmupLR>(o.lr, o.warmup_steps, total, o.min_lr);
  }
  return nullptr;
}

train::TrainerOptions trainer_options(const RunConfig& o, const std::shared_ptr<dist::Communicator>& comm) {
  train::TrainerOptions ao;
  // The Trainer counts the micro-batches of all ranks (Note [Data parallel accumulation]).
  ao.accum_steps = o.accum_steps_at(0) * o.world_size;
  if (o.accum_scheduled) ao.schedule = o.accum_schedule_all_ranks();
  if (o.world_size > 1) {
    ao.communicator = comm;
    ao.zero_stage = o.zero_stage;  // one rank keeps the whole state anyway
    ao.reduce_every_micro_batch = o.reduce_every_micro_batch;
  }
  ao.normalization = o.normalization;
  ao.clip_grad_norm = o.clip_grad_norm;
  ao.loss_scaling.dynamic = needs_loss_scaling(o.precision);
  ao.use_graphs = o.use_graphs;
  return ao;
}

void apply_memory_budget(const RunConfig& o) {
  if (o.memory_budget_bytes <= 0) return;
  const int64_t held = allocator_for(o.device).stats().reserved;
  if (held > o.memory_budget_bytes)
    throw UsageFailure("--memory-budget " + o.memory_budget + " is below the " + format_bytes(held) +
                       " this run holds before its first micro-batch (dataset, parameters, gradients)");
  allocator_for(o.device).set_memory_limit(o.memory_budget_bytes);
}

std::string loss_scale_text(float scale) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(scale));
  return buf;
}

namespace {

// The planner's table after its choice (plan_table_text). The fallback's table (a line through two
// probes) only with --plan-only.
void print_plan_table(const RunConfig& o, const plan::Plan& plan) {
  const bool line = plan.method == plan::PlanMethod::probe_line;
  if (line && (!o.quiet || o.plan_only))
    say("planner: no prediction from the allocation sequence (%s); fitting a line through two probed peaks\n",
        plan.prediction.c_str());
  if (line ? !o.plan_only : o.quiet && !o.plan_only) return;
  say("%s", plan::plan_table_text(plan, o.memory_budget_bytes).c_str());
}

// This run's request to the library's planner (train::plan_request, the probes reading the training
// set where the levers put it), for rank 0's part of the effective batch (Note [Plan levers]).
plan::PlanRequest planner_request(const RunConfig& o, nn::Model& model, optim::Optimizer& optimizer,
                                  models::FashionMnistSplit& train, models::FashionMnistSplit& test) {
  const train::BatchLoss loss = [&model](const data::Batch& b) {
    app::throw_if_interrupted();
    return training_loss(model, b);
  };
  // The levers this run lets the planner set or weigh; a budget of 0 (--plan-only alone): everything fits.
  models::FashionMnistLevers levers;
  levers.recompute = o.recompute == RecomputeChoice::on;
  levers.weigh_recompute = o.recompute == RecomputeChoice::planner;
  levers.data_on_host = o.data_on == DataOnChoice::host;
  levers.weigh_placement = o.data_on == DataOnChoice::planner;
  levers.weigh_bf16 = o.precision_by_planner;
  plan::PlanRequest request = models::plan_request(model, optimizer, loss, train, test, o.effective_batch / o.world_size,
                                                   o.memory_budget_bytes, compute_dtype(o.precision), levers);
  request.weigh_state_placement = o.optimizer_state_by_planner;
  request.weigh_state_bits = o.optimizer_bits_by_planner;
  request.world_size = o.world_size;
  request.setting.zero_stage = o.zero_stage;
  request.weigh_zero = o.zero_by_planner && o.world_size > 1;
  request.require_fit = false;  // nothing fitting is plan_batch's error, and a line of --plan-only's
  request.verify = !o.plan_only;
  request.budget_name = "--memory-budget " + o.memory_budget;
  return request;
}

// The ranks' collectives, timed by every rank together before rank 0 plans (Note [Collective time
// model]): the planner adds what each candidate's ZeRO stage makes. Nothing is timed for one rank.
dist::CollectiveTimes time_collectives(const nn::FlatParameters& flat, dist::Communicator& comm) {
  return dist::measure_collective_times(comm, flat, train::TrainerOptions().bucket_bytes);
}

plan::Plan run_planner(const RunConfig& o, nn::Model& model, const std::shared_ptr<nn::FlatParameters>& flat,
                       models::FashionMnistSplit& train, models::FashionMnistSplit& test,
                       const dist::CollectiveTimes& collectives) {
  // The run's optimizer is made after planning; one with its settings tells the planner what state
  // its first step allocates.
  const std::shared_ptr<optim::Optimizer> optimizer = make_optimizer(o, flat);
  plan::PlanRequest request = planner_request(o, model, *optimizer, train, test);
  request.collective_times = collectives;
  const plan::Plan plan = cumulus::plan::plan_batch(request);
  print_plan_table(o, plan);
  return plan;
}

// A BatchPlan as one line, from rank 0 to the others.
std::string batch_plan_text(const BatchPlan& p) {
  const plan::PlanSetting& s = p.setting;
  char numbers[256];
  std::snprintf(numbers, sizeof numbers, "%lld %d %u %d %d %d %d %d %.17g %lld ", static_cast<long long>(p.micro_batch),
                p.accum_steps, s.recompute, static_cast<int>(s.data), static_cast<int>(s.precision),
                static_cast<int>(s.optimizer_state), s.optimizer_bits, s.zero_stage, p.predicted_epoch_seconds,
                static_cast<long long>(p.predicted_peak_bytes));
  return numbers + p.setting_text;
}

BatchPlan parse_batch_plan(const std::string& text) {
  BatchPlan p;
  plan::PlanSetting& s = p.setting;
  int data = 0, precision = 0, state = 0, used = 0;
  long long micro_batch = 0, peak = 0;
  const int read = std::sscanf(text.c_str(), "%lld %d %u %d %d %d %d %d %lg %lld %n", &micro_batch, &p.accum_steps,
                               &s.recompute, &data, &precision, &state, &s.optimizer_bits, &s.zero_stage,
                               &p.predicted_epoch_seconds, &peak, &used);
  if (read != 10) throw Error("fashion_mnist: rank 0's plan '" + text + "' did not arrive whole");
  p.micro_batch = micro_batch;
  p.predicted_peak_bytes = peak;
  s.data = static_cast<plan::DataPlacement>(data);
  s.precision = static_cast<Precision>(precision);
  s.optimizer_state = static_cast<optim::StatePlacement>(state);
  p.setting_text = text.substr(static_cast<std::size_t>(used));
  return p;
}

}  // namespace

// Rank 0 plans for every rank (its shard is the largest); the others take its choice and put its
// levers in place on their own model and data.
BatchPlan plan_batch(const RunConfig& o, nn::Model& model, const std::shared_ptr<nn::FlatParameters>& flat,
                     models::FashionMnistSplit& train, models::FashionMnistSplit& test, dist::Communicator& comm) {
  BatchPlan chosen;
  const dist::CollectiveTimes collectives = time_collectives(*flat, comm);
  if (comm.is_root()) {
    const plan::Plan plan = run_planner(o, model, flat, train, test, collectives);
    if (plan.micro_batch == 0) throw OutOfMemory("planner: " + plan.reason);
    if (!o.quiet) say("planner: %s\n", plan.reason.c_str());
    chosen = BatchPlan{plan.micro_batch, static_cast<int>(plan.accum_steps), plan.setting,
                       plan::plan_setting_text(plan.setting, plan.recompute_segments)};
    for (const plan::PlanRow& r : plan.table)
      if (r.chosen) {
        chosen.predicted_epoch_seconds = r.epoch_seconds;
        chosen.predicted_peak_bytes = r.peak_bytes;
      }
  }
  if (comm.world_size() == 1) return chosen;
  chosen = parse_batch_plan(comm.broadcast_from_root(comm.is_root() ? batch_plan_text(chosen) : ""));
  if (!comm.is_root()) {
    const std::shared_ptr<optim::Optimizer> optimizer = make_optimizer(o, flat);
    const plan::PlanRequest request = planner_request(o, model, *optimizer, train, test);
    if (request.apply) request.apply(chosen.setting);
  }
  return chosen;
}

void print_plan(const RunConfig& o, nn::Model& model, const std::shared_ptr<nn::FlatParameters>& flat,
                models::FashionMnistSplit& train, models::FashionMnistSplit& test, dist::Communicator& comm) {
  const dist::CollectiveTimes collectives = time_collectives(*flat, comm);
  if (!comm.is_root()) return;  // rank 0 plans for every rank
  const plan::Plan plan = run_planner(o, model, flat, train, test, collectives);
  say("planner: %s\n", plan.micro_batch > 0 ? plan.reason.c_str() : ("nothing fits: " + plan.reason).c_str());
}

void load_weights(const std::string& path, const nn::Module& model) {
  if (train::is_training_checkpoint(path))
    throw UsageFailure("--init '" + path +
                       "' is a cumulus checkpoint (weights, optimizer state and counters): "
                       "continue its run with --resume");
  io::LoadStateDictOptions load_options;
  load_options.require_finite = true;  // training from NaN or Inf produces only non-finite losses
  io::load_state_dict(path, model, load_options);
}

TrainingState load_checkpoint(const std::string& path, const nn::Module& model, optim::Optimizer& optimizer,
                              const RunConfig& options, int64_t micro_batches_per_epoch, int64_t train_samples) {
  train::ResumeOptions resume;
  resume.settings = settings_table().recorded({options, ""});
  resume.overrides = options.overrides;
  resume.micro_batches_per_epoch = micro_batches_per_epoch;
  resume.units_per_epoch = train_samples;
  resume.plain_weights_hint = "to start from plain weights use --init";
  resume.other_data_hint = "was it made with other data (--data, --train-limit)?";
  TrainingState state;
  try {
    state = train::load_training_checkpoint(path, model, optimizer, resume);
  } catch (const train::SettingMismatch& e) {
    throw UsageFailure(e.what());
  }
  const int epoch = state.state.counters.epoch;
  if (epoch > options.epochs)
    throw UsageFailure("--resume '" + path + "' is at the end of epoch " + std::to_string(epoch) + ", past --epochs " +
                       std::to_string(options.epochs) + "; give --epochs " + std::to_string(epoch) +
                       " or more (--epochs counts all epochs, not the ones still to run)");
  return state;
}

}  // namespace fmnist
