#include "cumulus/runtime/fit.h"

#include <chrono>

namespace cumulus::optim {

FitLoop::FitLoop(Trainer& trainer, data::DataLoader& loader, const BatchLoss& loss, const FitOptions& options)
    : trainer_(trainer), loader_(loader), loss_(loss), options_(options), point_(trainer, options.start) {}

// One epoch's training from the resume point; false when a stop ended it at a group boundary.
bool FitLoop::train(int epoch, EpochSummary& summary, FitResult& result) {
  TrainingProgress* progress = options_.progress;
  EpochOptions hooks;
  if (options_.stop) hooks.stop = [this](int64_t) { return stop_asked(); };
  hooks.on_step = options_.on_step;
  hooks.on_micro_batch = [&](const MicroBatchDone& done) {
    if (options_.on_micro_batch) options_.on_micro_batch(done);
    summary.units_trained = done.units_done;
    if (progress && progress->due(done.index + 1))
      progress->update(done.index + 1, point_.mean_loss(), summary.units_trained);
  };
  const auto t0 = std::chrono::steady_clock::now();
  const EpochOptions epoch_options = point_.begin_epoch(epoch, hooks);
  summary.first_micro_batch = epoch_options.first;
  if (progress) progress->begin_epoch(epoch, loader_.num_batches(), epoch_options.first);
  const EpochResult trained = trainer_.train_epoch(loader_, epoch, loss_, epoch_options);
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

FitResult FitLoop::run() {
  FitResult result;
  for (int epoch = point_.epoch(); epoch < options_.epochs; ++epoch) {
    result.epoch = epoch;
    if (options_.on_epoch_begin) options_.on_epoch_begin(epoch);
    EpochSummary summary;
    summary.epoch = epoch;
    if (!train(epoch, summary, result)) break;
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

FitResult fit(Trainer& trainer, data::DataLoader& loader, const BatchLoss& loss, const FitOptions& options) {
  return FitLoop(trainer, loader, loss, options).run();
}

}  // namespace cumulus::optim
