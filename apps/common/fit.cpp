#include "common/fit.h"

#include <algorithm>
#include <chrono>

#include "cumulus/dist/communicator.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/optim/optimizer.h"

namespace cumulus::app {

FitLoop::FitLoop(train::Trainer& trainer, data::DataLoader& loader, const train::BatchLoss& loss,
                 const FitOptions& options)
    : trainer_(trainer), loader_(loader), loss_(loss), options_(options), point_(trainer, options.start) {}

// One epoch's training from the resume point; false when a stop ended it at a group boundary.
bool FitLoop::train(int epoch, EpochSummary& summary, FitResult& result) {
  TrainingProgress* progress = options_.progress;
  train::EpochOptions hooks;
  if (options_.stop) hooks.stop = [this](int64_t) { return stop_asked(); };
  CachingAllocator& allocator = allocator_for(trainer_.optimizer().parameters().device());
  allocator.reset_peak();
  hooks.on_step = [&](const train::MicroBatchDone& done) {
    summary.peak_bytes = std::max(summary.peak_bytes, allocator.stats().allocated_peak);
    if (options_.on_step) options_.on_step(done);
  };
  hooks.on_micro_batch = [&](const train::MicroBatchDone& done) {
    // A tracker's record: a step after the micro-batch has reset the allocator's peak since.
    const memory::MemoryTracker* tracker = trainer_.tracker();
    if (done.trained_here)
      summary.peak_bytes = std::max(
          summary.peak_bytes, tracker ? tracker->last_micro_batch().peak_bytes : allocator.stats().allocated_peak);
    if (options_.on_micro_batch) options_.on_micro_batch(done);
    summary.units_trained = done.units_done;
    if (progress && progress->due(done.index + 1))
      progress->update(done.index + 1, point_.mean_loss(), summary.units_trained);
  };
  const auto t0 = std::chrono::steady_clock::now();
  const train::EpochOptions epoch_options = point_.begin_epoch(epoch, hooks);
  summary.first_micro_batch = epoch_options.first;
  if (progress) progress->begin_epoch(epoch, loader_.num_batches(), epoch_options.first);
  const train::EpochResult trained = trainer_.train_epoch(loader_, epoch, loss_, epoch_options);
  if (progress) progress->end_epoch();
  if (!trained.finished) {
    result.end = FitEnd::stopped_in_epoch;
    result.next_micro_batch = trained.next_micro_batch;
    return false;
  }
  // Reading the loss waits for the device, so the epoch's time includes its queued work.
  summary.train_loss = point_.mean_loss();
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return true;
}

// The Trainer's running totals that EpochSummary reports per epoch (reading them waits for the device).
EpochSummary FitLoop::counters() const {
  EpochSummary now;
  const train::TrainingCounters counters = trainer_.counters();
  now.skipped_steps = counters.skipped_steps;
  if (dist::Communicator* comm = trainer_.communicator()) {
    const dist::Communicator::Stats stats = comm->stats();
    now.gradient_reductions = stats.gradient_reductions;
    now.communication_seconds = stats.communication_seconds;
    now.buckets_started_in_backward = counters.buckets_started_in_backward;
  }
  return now;
}

// The planner's prediction against the first full epoch this run trains (one resumed mid-epoch is
// not comparable: Note [Predicting time] in engine/plan/planner.cpp).
void FitLoop::measure_plan(const EpochSummary& summary) const {
  memory::MemoryTracker* tracker = trainer_.tracker();
  if (tracker == nullptr || !tracker->plan_check() || tracker->plan_check()->measured || summary.first_micro_batch != 0)
    return;
  tracker->measure_plan(summary.epoch, summary.seconds, summary.peak_bytes);
}

FitResult FitLoop::run() {
  FitResult result;
  for (int epoch = point_.epoch(); epoch < options_.epochs; ++epoch) {
    result.epoch = epoch;
    if (options_.on_epoch_begin) options_.on_epoch_begin(epoch);
    EpochSummary summary;
    summary.epoch = epoch;
    const EpochSummary before = counters();
    if (!train(epoch, summary, result)) break;
    const EpochSummary after = counters();
    summary.skipped_steps = after.skipped_steps - before.skipped_steps;
    summary.gradient_reductions = after.gradient_reductions - before.gradient_reductions;
    summary.communication_seconds = after.communication_seconds - before.communication_seconds;
    summary.buckets_started_in_backward = after.buckets_started_in_backward - before.buckets_started_in_backward;
    measure_plan(summary);
    if (options_.on_epoch_end) options_.on_epoch_end(summary);
    point_.end_epoch();
    if (options_.checkpoint) options_.checkpoint(point_.state());
    // After the epoch's checkpoint: nothing is lost, a resumed run starts the next epoch.
    if (stop_asked()) {
      result.end = FitEnd::stopped_after_epoch;
      break;
    }
  }
  result.state = point_.state();
  return result;
}

FitResult fit(train::Trainer& trainer, data::DataLoader& loader, const train::BatchLoss& loss,
              const FitOptions& options) {
  return FitLoop(trainer, loader, loss, options).run();
}

}  // namespace cumulus::app
