// What the run prints and writes about itself: the banner, the memory tracker's settings, the
// reports (--memory-report, --trace, --memory-plot) and the closing summary.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "checkpoint.h"
#include "cumulus/data/dataset.h"
#include "cumulus/dist/communicator.h"
#include "cumulus/memory/tracker.h"
#include "cumulus/nn/model.h"
#include "run_config.h"

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

// The planner's prediction for the chosen plan (RunConfig::planned_*) against the first full epoch
// this run trained: its training time (the test pass not included) and the tracker's peak.
struct PlanCheck {
  bool measured = false;  // an epoch has been compared
  int epoch = 0;          // from 1
  double measured_epoch_seconds = 0.0;
  int64_t measured_peak_bytes = 0;
};

// The "planner" object of the metrics lines and the memory report: the prediction, and the
// measurement once there is one. Null when the planner did not choose the plan.
nlohmann::ordered_json plan_check_json(const RunConfig& o, const PlanCheck& check);

// --memory-report (with the planner's object when it chose the plan), --trace and --memory-plot.
void write_reports(const RunConfig& o, cumulus::MemoryTracker& tracker, const PlanCheck& check);

// After the last epoch: the memory table, the reports and, with several ranks, the all-reduces'
// totals.
void finish_reports(const RunConfig& o, cumulus::MemoryTracker& tracker, cumulus::dist::Communicator& comm,
                    const PlanCheck& check);

}  // namespace fmnist
