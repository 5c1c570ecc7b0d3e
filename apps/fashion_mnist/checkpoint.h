// Weights and checkpoints as safetensors with PyTorch's state-dict names for the model, so PyTorch
// loads them with load_state_dict(safetensors.torch.load_file(path)) and its weights load here.
// A checkpoint adds the optimizer's flat state ("optimizer.<name>") and, in the metadata, the
// counters and the configuration it was made with; resuming checks that configuration, so a
// resumed run continues exactly (bitwise on CPU) where the first one stopped. A checkpoint stores
// a CRC-32 of its header and data ("checksum_crc32"), checked on load: a truncated or bit-flipped
// checkpoint is an Error naming the file, never a silently different resume.
#pragma once

#include <cstdint>
#include <string>

#include "cumulus/nn/module.h"
#include "cumulus/optim/accumulator.h"
#include "options.h"

namespace fmnist {

struct TrainingState {
  int epoch = 0;                 // the epoch to continue
  int64_t next_micro_batch = 0;  // its first micro-batch not yet trained (at a group boundary)
  cumulus::optim::Accumulator::Counters counters;
  int64_t optimizer_updates = 0;
  double epoch_loss_sum = 0.0;  // the epoch's summed training loss so far, and its samples
  int64_t epoch_samples = 0;
};

void save_weights(const std::string& path, const cumulus::nn::Module& model);
// Every parameter of `model` must be in the file with its shape; extra tensors are an error too.
void load_weights(const std::string& path, const cumulus::nn::Module& model);

void save_checkpoint(const std::string& path, const cumulus::nn::Module& model,
                     const cumulus::optim::Optimizer& optimizer, const TrainingState& state, const Options& options);
// Restores weights and optimizer state; throws UsageFailure when the checkpoint was made with a
// configuration that would not resume exactly (another model, optimizer, micro-batch, ...), and
// cumulus::Error when it is unreadable, truncated, corrupt (checksum mismatch) or lacks a checksum.
TrainingState load_checkpoint(const std::string& path, const cumulus::nn::Module& model,
                              cumulus::optim::Optimizer& optimizer, const Options& options);

}  // namespace fmnist
