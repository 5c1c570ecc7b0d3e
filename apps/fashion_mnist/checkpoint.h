// Weights (--init, --save) as safetensors with PyTorch's state-dict names, and the run's checkpoints
// (--checkpoint, --resume) through the library's (cumulus/runtime/checkpoint.h, Note [Resume
// contract]) with the settings of Note [Settings table].
#pragma once

#include <string>

#include "cumulus/nn/module.h"
#include "cumulus/optim/optimizer.h"
#include "cumulus/runtime/checkpoint.h"
#include "run_config.h"

namespace fmnist {

// Where a run starts: a resumed checkpoint's state, or epoch 0.
using TrainingState = cumulus::optim::ResumedCheckpoint;

void save_weights(const std::string& path, const cumulus::nn::Module& model);
// Every parameter of `model` must be in the file with its shape, and finite; extra tensors are an
// error too. A checkpoint is refused with a pointer to --resume.
void load_weights(const std::string& path, const cumulus::nn::Module& model);

void save_checkpoint(const std::string& path, const cumulus::nn::Module& model,
                     const cumulus::optim::Optimizer& optimizer, const cumulus::optim::CheckpointState& state,
                     const RunConfig& options);
// Restores weights and optimizer state; throws UsageFailure when the checkpoint was made with other
// settings or is past --epochs, and cumulus::Error when it is unusable (load_training_checkpoint).
TrainingState load_checkpoint(const std::string& path, const cumulus::nn::Module& model,
                              cumulus::optim::Optimizer& optimizer, const RunConfig& options,
                              int64_t micro_batches_per_epoch, int64_t train_samples);

}  // namespace fmnist
