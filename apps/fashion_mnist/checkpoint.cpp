#include "checkpoint.h"

#include "cumulus/io/state_dict.h"
#include "settings.h"

namespace fmnist {

namespace io = cumulus::io;
namespace optim = cumulus::optim;

void save_weights(const std::string& path, const cumulus::nn::Module& model) { io::save_state_dict(path, model); }

void load_weights(const std::string& path, const cumulus::nn::Module& model) {
  if (optim::is_training_checkpoint(path))
    throw UsageFailure("--init '" + path +
                       "' is a cumulus checkpoint (weights, optimizer state and counters): "
                       "continue its run with --resume");
  io::LoadStateDictOptions load_options;
  load_options.require_finite = true;  // training from NaN or Inf produces only non-finite losses
  io::load_state_dict(path, model, load_options);
}

void save_checkpoint(const std::string& path, const cumulus::nn::Module& model, const optim::Optimizer& optimizer,
                     const optim::CheckpointState& state, const RunConfig& options) {
  optim::save_training_checkpoint(path, model, optimizer, state, checkpoint_settings(options));
}

TrainingState load_checkpoint(const std::string& path, const cumulus::nn::Module& model, optim::Optimizer& optimizer,
                              const RunConfig& options, int64_t micro_batches_per_epoch, int64_t train_samples) {
  optim::ResumeOptions resume;
  resume.settings = checkpoint_settings(options);
  resume.overrides = options.overrides;
  resume.micro_batches_per_epoch = micro_batches_per_epoch;
  resume.units_per_epoch = train_samples;
  resume.plain_weights_hint = "to start from plain weights use --init";
  resume.other_data_hint = "was it made with other data (--data, --train-limit)?";
  TrainingState state;
  try {
    state = optim::load_training_checkpoint(path, model, optimizer, resume);
  } catch (const optim::SettingMismatch& e) {
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
