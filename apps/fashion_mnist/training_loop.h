// The training loop: epochs of micro-batches through optim::Trainer, a test pass and a --metrics
// line after each, the checkpoint at each epoch end, and the stops (a signal, out of memory, a
// failed write) at the last group boundary with the checkpoint and the reports still written.
//
// The loop over micro-batches is the library's: Trainer::train_epoch (from a resumed checkpoint's
// micro-batch, its hooks keeping the progress bar and the last group boundary, its stop request
// honoured at a group boundary), and the test pass is optim::evaluate_classifier. The app adds
// what a run reports and writes around them.
#pragma once

#include <cstdint>
#include <optional>

#include "checkpoint.h"
#include "cumulus/data/dataset.h"
#include "cumulus/dist/communicator.h"
#include "cumulus/nn/model.h"
#include "cumulus/runtime/tracker.h"
#include "cumulus/runtime/trainer.h"
#include "run_config.h"

namespace fmnist {

// What the loop trains with; all made before it starts.
struct TrainingParts {
  const RunConfig& o;
  cumulus::nn::Model& model;
  cumulus::optim::Optimizer& optimizer;
  cumulus::optim::Trainer& trainer;
  const cumulus::optim::TrainerOptions& trainer_options;
  cumulus::data::DataLoader& train_loader;
  cumulus::data::DataLoader& test_loader;
  cumulus::dist::Communicator& comm;
  cumulus::MemoryTracker& tracker;  // with the planner's check when it chose the plan (measured after the first epoch)
  const TrainingState& state;       // where the run starts (a resumed checkpoint's, else epoch 0)
};

// Trains from parts.state to --epochs. Returns the exit code of a run that stopped early (an
// interrupt, out of memory, an error: the checkpoint of the last group boundary and the reports
// are written first), or nothing when every epoch finished.
std::optional<int> train(const TrainingParts& parts);

}  // namespace fmnist
