// PlanCheck: the planner's prediction for the plan a run trains with, and once known the
// measurement that checks it. A MemoryTracker given one (MemoryTracker::set_plan_check) writes it
// as the memory report's "planner" object; plan_check_line() is the one-line text a run prints.
//
// Typical use, after cumulus::plan::plan_batch (cumulus/plan/planner.h) chose a row of its table:
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
  // The plan's other levers as text (plan_setting_text in cumulus/plan/planner.h: "recompute conv1+bn1,
  // data on device, fp32"); may be empty.
  std::string setting;
  // The chosen PlanRow's prediction: epoch_seconds (an epoch's training, no test pass; Note
  // [Predicting time] in engine/plan/planner.cpp) and peak_bytes (the allocated peak).
  double predicted_epoch_seconds = 0.0;
  int64_t predicted_peak_bytes = 0;
  // The measurement, filled by the caller once an epoch has been compared (MemoryTracker::
  // measure_plan): that epoch's training time on the host clock and the tracker's allocated peak
  // over it. A first epoch that resumed mid-way is not comparable; the app measures the first full one.
  bool measured = false;
  int epoch = 0;  // from 0, as the tracker keeps epochs; the report and the line print it from 1
  double measured_epoch_seconds = 0.0;
  int64_t measured_peak_bytes = 0;
};

// "predicted X s an epoch and peak P, measured Y s and peak Q" (without ", measured ..." before
// the measurement); sizes as format_bytes prints them. The app prints it after "planner: ".
std::string plan_check_line(const PlanCheck& check);

}  // namespace cumulus::plan
