// Weights and checkpoints as safetensors with PyTorch's state-dict names for the model, so PyTorch
// loads them with load_state_dict(safetensors.torch.load_file(path)) and its weights load here.
// A checkpoint adds the optimizer's flat state ("optimizer.<name>") and, in the metadata, the
// counters and the settings it was made with, so a resumed run continues exactly (bitwise on CPU)
// where the first one stopped.
//
// Note [Resume contract]: the checkpoint records (Note [Settings table] in settings.h) every setting that changes the result (model,
// optimizer and its hyperparameters, batch and accumulation, normalization, data order, learning
// rate schedule, clipping, weight decay, ...). Resuming with a different value is refused naming
// the flag, unless the setting is a hyperparameter of the update rule listed in --override, in
// which case the change is reported in the banner and in --metrics. Counters are range-checked
// against the run (epochs, micro-batches per epoch, samples) with the file named. A checkpoint stores
// a CRC-32 of its header and data ("checksum_crc32"), checked on load: a truncated or bit-flipped
// checkpoint is an Error naming the file, never a silently different resume.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cumulus/nn/module.h"
#include "cumulus/optim/optimizer.h"
#include "cumulus/runtime/accumulation.h"
#include "run_config.h"

namespace fmnist {

struct TrainingState {
  int epoch = 0;                 // the epoch to continue
  int64_t next_micro_batch = 0;  // its first micro-batch not yet trained (at a group boundary)
  cumulus::optim::TrainingCounters counters;
  int64_t optimizer_updates = 0;
  double epoch_loss_sum = 0.0;  // the epoch's summed training loss so far, and its samples
  int64_t epoch_samples = 0;
  std::vector<std::string> overridden;  // "lr 0.001 -> 0.01": settings --override changed on resume
};

// What the counters of a resumed checkpoint must lie within.
struct ResumeLimits {
  int64_t micro_batches_per_epoch = 0;
  int64_t train_samples = 0;
};

void save_weights(const std::string& path, const cumulus::nn::Module& model);
// Every parameter of `model` must be in the file with its shape, and finite; extra tensors are an
// error too. A checkpoint is refused with a pointer to --resume.
void load_weights(const std::string& path, const cumulus::nn::Module& model);

void save_checkpoint(const std::string& path, const cumulus::nn::Module& model,
                     const cumulus::optim::Optimizer& optimizer, const TrainingState& state, const RunConfig& options);
// Restores weights and optimizer state; throws UsageFailure when the checkpoint was made with
// other settings (Note [Resume contract]) or is past --epochs, and cumulus::Error when it is
// unreadable, truncated, corrupt (checksum mismatch), lacks a checksum or has counters outside
// `limits`.
TrainingState load_checkpoint(const std::string& path, const cumulus::nn::Module& model,
                              cumulus::optim::Optimizer& optimizer, const RunConfig& options,
                              const ResumeLimits& limits);

}  // namespace fmnist
