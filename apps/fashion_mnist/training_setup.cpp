#include "training_setup.h"

#include <cstdio>

#include "cumulus/memory/allocator.h"
#include "cumulus/memory/category.h"
#include "cumulus/models/cnn.h"
#include "cumulus/models/mlp.h"
#include "cumulus/ops/loss.h"
#include "cumulus/optim/adamw.h"
#include "cumulus/optim/sgd.h"

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

std::shared_ptr<optim::Optimizer> make_optimizer(const RunConfig& o, std::shared_ptr<nn::FlatParameters> flat) {
  if (o.optimizer == OptimizerKind::adamw) {
    optim::AdamWOptions a;
    a.lr = o.lr;
    a.beta1 = o.beta1;
    a.beta2 = o.beta2;
    a.eps = o.eps;
    a.weight_decay = o.weight_decay;
    return std::make_shared<optim::AdamW>(flat, a);
  }
  optim::SGDOptions s;
  s.lr = o.lr;
  s.momentum = o.momentum;
  s.nesterov = o.nesterov;
  s.weight_decay = o.weight_decay;
  return std::make_shared<optim::SGD>(flat, s);
}

std::shared_ptr<const optim::LRSchedule> make_lr_schedule(const RunConfig& o, int64_t micro_batches) {
  if (o.lr_schedule == LrScheduleKind::step) return std::make_shared<optim::StepLR>(o.lr, o.lr_step_size, o.lr_gamma);
  if (o.lr_schedule == LrScheduleKind::cosine) {
    const int64_t total = optim::optimizer_steps_in_epochs(o.accum_schedule_all_ranks(), micro_batches, o.epochs);
    if (o.warmup_steps >= total)
      throw UsageFailure("--warmup-steps " + std::to_string(o.warmup_steps) + " must be below the run's " +
                         std::to_string(total) + " optimizer steps");
    return std::make_shared<optim::CosineWarmupLR>(o.lr, o.warmup_steps, total, o.min_lr);
  }
  return nullptr;
}

optim::TrainerOptions trainer_options(const RunConfig& o, const std::shared_ptr<dist::Communicator>& comm) {
  optim::TrainerOptions ao;
  // The Accumulator counts the micro-batches of all ranks (Note [Data parallel accumulation]).
  ao.accum_steps = o.accum_steps_at(0) * o.world_size;
  if (o.accum_scheduled) ao.schedule = o.accum_schedule_all_ranks();
  if (o.world_size > 1) ao.communicator = comm;
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

}  // namespace fmnist
