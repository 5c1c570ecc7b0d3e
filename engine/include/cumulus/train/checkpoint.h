// Training checkpoints: everything a run needs to continue exactly where it stopped (bitwise on the
// CPU) in one safetensors file: the model's tensors under their state-dict names (PyTorch loads
// them), the optimizer's state as "optimizer.<name>", and in the metadata the Trainer's counters at
// a group boundary, the epoch's running loss and the run's settings. A CRC-32 of the whole file is
// verified on load: a truncated or bit-flipped file is an Error naming it, never a different resume.
//
//   std::vector<RecordedSetting> settings = {{"lr", "lr", "0.001", /*overridable=*/true}, ...};
//   CheckpointState state{trainer.counters(), optimizer.updates(), loss_sum, units};  // at a group boundary
//   save_training_checkpoint(path, model, optimizer, state, settings);
//   ...
//   ResumeOptions resume{settings, /*overrides=*/{"lr"}, loader.num_batches(), dataset.size()};
//   ResumedCheckpoint r = load_training_checkpoint(path, model, optimizer, resume);  // weights, optimizer
//   trainer.restore(r.state.counters);
//   trainer.train_epoch(loader, r.state.counters.epoch, loss, {r.state.counters.micro_batch_index, ...});
//
// Note [Resume contract]: a checkpoint records every setting that changes the result (the model,
// the optimizer and its hyperparameters, batch and accumulation, data order, schedule, ...) as text
// equal for equal values. A resume with another value is refused, naming it as a command line
// does ("--resume 'ck.st' was made with --lr 0.001, this run has 0.01; resume with the same value or
// allow the change with --override lr"), unless the setting is overridable and the caller allows
// the change (ResumeOptions::overrides; then it is reported). The counters are range-checked before
// anything is restored, so a damaged or forged value names the file.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cumulus/core/error.h"
#include "cumulus/io/file.h"
#include "cumulus/optim/optimizer.h"
#include "cumulus/train/accumulation.h"
#include "cumulus/train/trainer.h"

namespace cumulus::nn {
class Module;
}  // namespace cumulus::nn

namespace cumulus::train {

// One setting of the run as a checkpoint records it and a resume compares it.
struct RecordedSetting {
  std::string name;          // as users name it: the command-line flag without its dashes ("lr")
  std::string key;           // its metadata key, after "setting." ("lr", "micro_batch_size")
  std::string value;         // as text: equal values give equal text
  bool overridable = false;  // a resume may change it where allowed (a hyperparameter of the update rule)
  // What a checkpoint without the key (older than it) ran with; unset: refused as "(not recorded)".
  std::optional<std::string> before_recorded;
  std::string unit;  // added after the value in a refusal: " (micro-batches per step, all ranks together)"
};

// A float as a setting's text: the shortest that reads back as the same float ("0.001", not
// "0.00100000005"), so equal values give equal text.
std::string setting_text(float value);

// The position and counters of a run at a group boundary, besides the weights and optimizer state.
struct CheckpointState {
  // Where a resumed run continues: counters.epoch at counters.micro_batch_index (at the epoch's
  // length: every micro-batch trained, what follows the epoch, its test pass say, not yet).
  TrainingCounters counters;
  int64_t optimizer_updates = 0;  // Optimizer::updates()
  // The epoch's loss sum (stored bit for bit) and units so far: a resumed epoch reports the same mean.
  double epoch_loss_sum = 0.0;
  int64_t epoch_units = 0;
};

// Writes the checkpoint atomically (a crash leaves the previous file). `metadata`: the caller's own
// keys, stored beside the run's. `links`: whether a symlink at `path` is written through (io/file.h).
void save_training_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer& optimizer,
                              const CheckpointState& state, const std::vector<RecordedSetting>& settings,
                              const std::map<std::string, std::string>& metadata = {},
                              io::OutputLinks links = io::OutputLinks::follow);
// The same with the optimizer's state given whole: Trainer::optimizer_state() (a ZeRO run's).
void save_training_checkpoint(const std::string& path, const nn::Module& model,
                              const std::vector<std::pair<std::string, Tensor>>& optimizer_state,
                              const CheckpointState& state, const std::vector<RecordedSetting>& settings,
                              const std::map<std::string, std::string>& metadata = {},
                              io::OutputLinks links = io::OutputLinks::follow);

struct ResumeOptions {
  std::vector<RecordedSetting> settings;  // this run's: each must equal the checkpoint's
  std::set<std::string> overrides;        // names of overridable settings allowed to differ
  // The run's epoch size: a checkpoint's position and epoch units must lie within it.
  int64_t micro_batches_per_epoch = 0;
  int64_t units_per_epoch = 0;
  // > 0: the position must be a boundary of groups this long (a run without set_accum_steps).
  int64_t micro_batches_per_group = 0;
  // Added to the refusals of a file that is not a checkpoint, and of a position outside the epoch.
  std::string plain_weights_hint = "load plain weights with io::load_state_dict";
  std::string other_data_hint = "was it made with other data?";
};

struct ResumedCheckpoint {
  CheckpointState state;
  std::vector<std::string> overridden;          // "lr 0.001 -> 0.01": the changes ResumeOptions::overrides allowed
  std::map<std::string, std::string> metadata;  // every key, verified by the checksum
};

// The run's settings that differ from the checkpoint's, named in one message: the caller's input,
// not the file, is at fault (Note [Resume contract]).
class SettingMismatch : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// Restores the model's weights and the optimizer's state (Trainer::restore(state.counters) next).
// Throws SettingMismatch when the run's settings differ, and Error when the file is unreadable, not
// a checkpoint, corrupt or without a checksum, holds non-finite values or counters outside the run.
ResumedCheckpoint load_training_checkpoint(const std::string& path, const nn::Module& model,
                                           optim::Optimizer& optimizer, const ResumeOptions& options);

// The point a run would resume from, kept as train_epoch goes: the last group boundary (a checkpoint
// written after an error mid-group holds what was stepped, not the group in flight) and the epoch's
// running loss across a resume.
//
//   ResumePoint point(trainer, resumed.state);             // or CheckpointState{}: epoch 0
//   for (int epoch = point.epoch(); epoch < epochs; ++epoch) {
//     trainer.train_epoch(loader, epoch, loss, point.begin_epoch(epoch, my_hooks));
//     ... evaluate; point.end_epoch(); save_training_checkpoint(path, model, optimizer, point.state(), settings);
//   }
class ResumePoint {
 public:
  ResumePoint(Trainer& trainer, const CheckpointState& start);
  int epoch() const { return point_.counters.epoch; }
  // `options` for train_epoch(epoch): `first` set, and an on_step that records each boundary first.
  EpochOptions begin_epoch(int epoch, EpochOptions options = {});
  // After the epoch and what follows it (an evaluation): the point is the next epoch's start.
  void end_epoch();
  // The epoch's mean loss per unit to the last boundary (a resumed epoch's earlier part included;
  // a device read) and its units (every rank's).
  double mean_loss() const;
  int64_t epoch_units() const { return point_.epoch_units; }
  // The point as a checkpoint records it (the step counters and the loss read from the device now).
  CheckpointState state() const;

 private:
  Trainer& trainer_;
  CheckpointState start_, point_;
  double loss_before_ = 0.0;  // a resumed epoch's loss before this run
};

// Whether the file's metadata names it a training checkpoint (of any version): reads the header only.
bool is_training_checkpoint(const std::string& path);

}  // namespace cumulus::train
