// The learning rates the device reads at each step (Note [Learning-rate table] in
// engine/train/trainer_step.cpp): lr_at(k) for a window of update counts, refilled by the host
// only when the count could have left it.
#pragma once

#include <cstdint>
#include <memory>

#include "cumulus/optim/lr_schedule.h"
#include "cumulus/optim/optimizer.h"
#include "step_state.h"

namespace cumulus::train {

using optim::LRSchedule;
using optim::Optimizer;
using optim::UpdateScalars;

class LearningRateWindow {
 public:
  static constexpr int64_t kSize = 4096;  // entries with a schedule; one without

  LearningRateWindow(Optimizer& optimizer, std::shared_ptr<const LRSchedule> schedule)
      : optimizer_(optimizer), schedule_(std::move(schedule)) {}

  // Keeps the window valid for the next attempt (host work before the step's device part; rarely
  // a read of the update count). `steps_offset`: updates made before this run (the schedule's 0).
  void prepare(StepStateMemory& state, int64_t steps_offset);
  // Each attempt raises the update count by at most one.
  void count_attempt() { ++attempts_since_read_; }
  // The update count as a counter read saw it.
  void saw_updates(int64_t updates) {
    known_updates_ = updates;
    attempts_since_read_ = 0;
  }
  // Forgets the window (a restore moved the count): the next prepare refills it.
  void invalidate() { size_ = 0; }

  const float* table() const { return table_.data<float>(); }
  int32_t size() const { return static_cast<int32_t>(size_); }

 private:
  void fill(StepStateMemory& state, int64_t base_update, int64_t steps_offset);

  Optimizer& optimizer_;
  std::shared_ptr<const LRSchedule> schedule_;  // null: the optimizer's lr
  Tensor table_;
  int64_t size_ = 0;
  int64_t base_ = 0;              // the update count table_[0] is for
  float constant_ = -1.0f;        // without a schedule: the lr the one-entry table holds
  int64_t known_updates_ = 0;     // the device's update count as of the last read
  int64_t attempts_since_read_ = 0;
};

}  // namespace cumulus::train
