// The training loop: the library's epochs loop (optim::FitLoop: the progress line, the resume point,
// a stop honoured at a group boundary) with the app's hooks: the test pass (optim::evaluate_classifier),
// the --metrics line and the checkpoint after each epoch, and the stops (a signal, out of memory, a
// failed write) with the checkpoint of the last group boundary and the reports still written.
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
