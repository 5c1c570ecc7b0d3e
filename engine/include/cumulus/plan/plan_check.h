// PlanCheck: the planner's prediction for the plan a run trains with, and the measurement that
// checks it. A MemoryTracker given one writes it as the memory report's "planner" object.
//
//   PlanCheck check;
//   check.micro_batch = row.micro_batch;  check.accum_steps = row.accum_steps;
//   check.predicted_epoch_seconds = row.epoch_seconds;  check.predicted_peak_bytes = row.peak_bytes;
//   tracker.set_plan_check(check);
//   ... after the first full epoch: tracker.measure_plan(epoch, its training seconds, its peak);
#pragma once

#include <cstdint>
#include <string>

namespace cumulus::plan {

struct PlanCheck {
  // The plan: the chosen PlanRow's micro_batch and accum_steps.
  int64_t micro_batch = 0;
  int64_t accum_steps = 0;
  std::string setting;  // plan_setting_text's "recompute conv1+bn1, data on device, fp32"; may be empty
  // The chosen PlanRow's epoch_seconds (training only; Note [Predicting time]) and peak_bytes.
  double predicted_epoch_seconds = 0.0;
  int64_t predicted_peak_bytes = 0;
  // The measurement (MemoryTracker::measure_plan) of the first full epoch: its training time on the
  // host clock and its allocated peak.
  bool measured = false;
  int epoch = 0;  // from 0, as the tracker keeps epochs; the report and the line print it from 1
  double measured_epoch_seconds = 0.0;
  int64_t measured_peak_bytes = 0;
};

// "predicted X s an epoch and peak P, measured Y s and peak Q" (", measured ..." once measured).
std::string plan_check_line(const PlanCheck& check);

}  // namespace cumulus::plan
