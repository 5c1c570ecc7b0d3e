#include "training_setup.h"

#include <cstdio>

#include "cumulus/memory/allocator.h"
#include "cumulus/memory/category.h"
#include "cumulus/models/cnn.h"
#include "cumulus/models/mlp.h"
#include "cumulus/ops/ops.h"
#include "cumulus/optim/adamw.h"
#include "cumulus/optim/sgd.h"

using namespace cumulus;

namespace fmnist {

std::unique_ptr<nn::Model> make_model(const Options& o, Generator& gen) {
  std::unique_ptr<nn::Model> model;
  if (o.model == "cnn") model = std::make_unique<models::CNN>(gen, o.resolved_device);
  else model = std::make_unique<models::SeedMLP>(gen, o.resolved_device);
  model->set_recompute(o.recompute == "on");  // auto: off until the planner decides
  nn::KernelChoice kernels = nn::KernelChoice::automatic;
  nn::parse_kernel_choice(o.kernels, kernels);  // CLI11 checked the value, and fused against --model
  model->set_kernels(kernels);
  return model;
}

Tensor training_loss(nn::Model& model, const data::Batch& batch) {
  return model.loss(batch.x, batch.y, ops::Reduction::Sum);
}

std::string kernels_used(const nn::Model& model, const Options& o, int64_t batch) {
  return nn::kernel_choice_name(model.kernels_for(o.resolved_device, compute_dtype(o.resolved_precision), batch));
}

std::shared_ptr<optim::Optimizer> make_optimizer(const Options& o, std::shared_ptr<nn::FlatParameters> flat) {
  if (o.optimizer == "adamw") {
    optim::AdamWOptions a;
    a.lr = o.lr;
    a.beta1 = o.beta1;
    a.beta2 = o.beta2;
    a.eps = o.eps;
    a.weight_decay = o.resolved_weight_decay();
    return std::make_shared<optim::AdamW>(flat, a);
  }
  optim::SGDOptions s;
  s.lr = o.lr;
  s.momentum = o.momentum;
  s.nesterov = o.nesterov;
  s.weight_decay = o.resolved_weight_decay();
  return std::make_shared<optim::SGD>(flat, s);
}

namespace {

// Optimizer steps of the whole run: each epoch's micro-batches in groups of that epoch's steps
// (per rank) times the ranks.
int64_t total_optimizer_steps(const Options& o, int64_t micro_batches) {
  const std::map<int, int> schedule = o.schedule.empty() ? std::map<int, int>{{0, o.accum_steps}} : o.schedule;
  int64_t steps = 0;
  for (int e = 0; e < o.epochs; ++e) {
    const int n = optim::Accumulator::steps_for_epoch(schedule, e) * o.world_size;
    steps += (micro_batches + n - 1) / n;
  }
  return steps;
}

}  // namespace

std::shared_ptr<const optim::LRSchedule> make_lr_schedule(const Options& o, int64_t micro_batches) {
  if (o.lr_schedule == "step") return std::make_shared<optim::StepLR>(o.lr, o.lr_step_size, o.lr_gamma);
  if (o.lr_schedule == "cosine") {
    const int64_t total = total_optimizer_steps(o, micro_batches);
    if (o.warmup_steps >= total)
      throw UsageFailure("--warmup-steps " + std::to_string(o.warmup_steps) + " must be below the run's " +
                         std::to_string(total) + " optimizer steps");
    return std::make_shared<optim::CosineWarmupLR>(o.lr, o.warmup_steps, total, o.min_lr);
  }
  return nullptr;
}

optim::TrainerOptions trainer_options(const Options& o, const std::shared_ptr<dist::Communicator>& comm) {
  optim::TrainerOptions ao;
  // The Accumulator counts the micro-batches of all ranks (Note [Data parallel accumulation]).
  ao.accum_steps = o.accum_steps * o.world_size;
  for (const auto& [epoch, steps] : o.schedule) ao.schedule[epoch] = steps * o.world_size;
  if (o.world_size > 1) ao.communicator = comm;
  ao.normalization = o.normalization();
  ao.clip_grad_norm = o.clip_grad_norm;
  ao.loss_scaling.dynamic = needs_loss_scaling(o.resolved_precision);
  ao.use_graphs = o.use_graphs;
  return ao;
}

void apply_memory_budget(const Options& o) {
  if (o.memory_budget_bytes <= 0) return;
  const int64_t held = allocator_for(o.resolved_device).stats().reserved;
  if (held > o.memory_budget_bytes)
    throw UsageFailure("--memory-budget " + o.memory_budget + " is below the " + format_bytes(held) +
                       " this run holds before its first micro-batch (dataset, parameters, gradients)");
  allocator_for(o.resolved_device).set_memory_limit(o.memory_budget_bytes);
}

std::string loss_scale_text(float scale) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(scale));
  return buf;
}

}  // namespace fmnist
