// The run's parts made from its configuration: the model, its training loss and kernels, the optimizer,
// the learning-rate schedule, the Trainer's options and the memory budget.
#pragma once

#include <memory>
#include <string>

#include "cumulus/data/dataset.h"
#include "cumulus/dist/communicator.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/model.h"
#include "cumulus/optim/lr_schedule.h"
#include "cumulus/optim/optimizer.h"
#include "cumulus/runtime/trainer.h"
#include "cumulus/tensor/random.h"
#include "run_config.h"

namespace fmnist {

// The one place that knows the models by name; everything after asks the nn::Model interface.
std::unique_ptr<cumulus::nn::Model> make_model(const RunConfig& o, cumulus::Generator& gen);

// A training micro-batch's summed loss: the model's own (the MLP's fused op where it applies, Note
// [Fused MLP] in engine/ops/fused_mlp.cpp; cross-entropy of the logits by default).
cumulus::Tensor training_loss(cumulus::nn::Model& model, const cumulus::data::Batch& batch);

// Which kernels train micro-batches of `batch` samples: "fused" or "generic" (the banner and reports).
std::string kernels_used(const cumulus::nn::Model& model, const RunConfig& o, int64_t batch);

std::shared_ptr<cumulus::optim::Optimizer> make_optimizer(const RunConfig& o,
                                                          std::shared_ptr<cumulus::nn::FlatParameters> flat);

// --lr-schedule; null for constant (the optimizer's own lr).
std::shared_ptr<const cumulus::optim::LRSchedule> make_lr_schedule(const RunConfig& o, int64_t micro_batches);

// The Trainer's options: the accumulation steps of all ranks, normalization, clipping, fp16's loss
// scaling, graphs and the communicator.
cumulus::optim::TrainerOptions trainer_options(const RunConfig& o,
                                               const std::shared_ptr<cumulus::dist::Communicator>& comm);

// --memory-budget: from here on the device behaves as if it had only that much (refused if the run
// already holds more).
void apply_memory_budget(const RunConfig& o);

// fp16's loss scale, a power of two: "65536", "0.5".
std::string loss_scale_text(float scale);

}  // namespace fmnist
