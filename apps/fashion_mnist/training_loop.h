// The training loop: the library's epochs loop (optim::FitLoop: the progress line, the resume point,
// a stop honoured at a group boundary) with the app's hooks: the test pass (optim::evaluate_classifier),
// the --metrics line and the checkpoint after each epoch, and the stops (a signal, out of memory, a
// failed write) with the checkpoint of the last group boundary and the reports still written.
// Around it, what the run prints and writes about itself: the banner, the memory tracker's
// settings, the reports (--memory-report, --trace, --memory-plot) and the closing summary.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "cumulus/data/dataset.h"
#include "cumulus/dist/communicator.h"
#include "cumulus/nn/model.h"
#include "cumulus/runtime/tracker.h"
#include "cumulus/runtime/trainer.h"
#include "run_config.h"
#include "training_setup.h"

namespace fmnist {

// What the banner describes besides the options and the model.
struct RunDescription {
  std::string data_dir;
  int64_t train_samples = 0, test_samples = 0;
  bool host_resident_data = false;
  float loss_scale = 1.0f;
  std::string backend;  // the communicator's
};

// The banner (unless --quiet), then on stderr the settings --override changed and a note when a
// resumed checkpoint has nothing left to train.
void announce_run(const RunConfig& o, const cumulus::nn::Model& model, const RunDescription& d,
                  const TrainingState& state);

// The memory tracker's model, micro-batch and the settings its report records.
cumulus::MemoryTracker::Options tracker_options(const RunConfig& o, const cumulus::nn::Model& model);

// The planner's prediction for the chosen plan (RunConfig::planned_*), or nothing when the planner
// did not choose the plan. The tracker is given it (its report's "planner" object); the training
// loop measures it against the first full epoch this run trains.
std::optional<cumulus::PlanCheck> planned_check(const RunConfig& o);

// The test pass (optim::evaluate_classifier: the accuracy over all samples, the mean over batches
// of each batch's mean loss), throwing Interrupted at a signal, and the lines it prints.
cumulus::optim::Evaluation test_pass(cumulus::nn::Module& model, cumulus::data::DataLoader& loader);
void print_test_results(const cumulus::optim::Evaluation& r);

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

// After the last epoch: the memory table, the reports and, with several ranks, the all-reduces'
// totals.
void finish_reports(const RunConfig& o, cumulus::MemoryTracker& tracker, cumulus::dist::Communicator& comm);

}  // namespace fmnist
