// fit: the epochs loop around Trainer::train_epoch that most runs want (Keras' model.fit,
// Lightning's Trainer.fit): from a start (epoch 0, or a resumed checkpoint's position) to
// `epochs`, with the progress line, a hook at each epoch's end (evaluate, log), a checkpoint after
// it, and a stop honoured at a group boundary or after an epoch's checkpoint. Each epoch is summarized
// (EpochSummary: its loss, time, peak and counters).
//
//   app::FitOptions fit;
//   fit.epochs = 10;
//   fit.progress = &progress;                                    // optional (common/progress.h)
//   fit.stop = [] { return app::stop_requested(); };             // common/stop_signal.h
//   fit.on_epoch_end = [&](const app::EpochSummary& e) {
//     std::printf("epoch %d: loss %.4f, test accuracy %.3f\n", e.epoch + 1, e.train_loss,
//                 train::evaluate_classifier(model, test_loader).accuracy);
//   };
//   fit.checkpoint = [&](const train::CheckpointState& s) { save_training_checkpoint(path, model, opt, s, settings); };
//   const app::FitResult r = app::fit(trainer, loader, loss, fit);
//   if (r.end != app::FitEnd::finished) { /* stopped: the checkpoint of r.state is what to write */ }
//
// To resume, restore the checkpoint (runtime/checkpoint.h) and set FitOptions::start to its state.
// Where an exception (out of memory, an Error from a hook) must still leave a checkpoint, make a
// FitLoop and write loop.state() in the handler: the last group boundary, never the group in flight.
#pragma once

#include <cstdint>
#include <functional>

#include "common/progress.h"
#include "cumulus/train/checkpoint.h"
#include "cumulus/train/trainer.h"

namespace cumulus::app {

// What FitOptions::on_epoch_end is told after an epoch's training, before its checkpoint.
struct EpochSummary {
  int epoch = 0;                  // from 0
  int64_t first_micro_batch = 0;  // where this run started the epoch: > 0 when it resumed inside it
  double train_loss = 0.0;        // the epoch's mean per unit, a resumed epoch's earlier part included
  double seconds = 0.0;           // this run's training time of the epoch (its queued work included)
  int64_t units_trained = 0;      // the units this run trained in the epoch (every rank's)
  // The largest allocated bytes of this rank's micro-batches and steps in the epoch (the device's
  // allocator, or the Trainer's tracker's records). A tracker attached to the Trainer with a plan check
  // (MemoryTracker::plan_check) has it measured against the first full epoch, this peak and `seconds`, before
  // on_epoch_end.
  int64_t peak_bytes = 0;
  // The Trainer's counters over this run's part of the epoch: steps skipped for a non-finite
  // gradient; data parallel, the gradient all-reduces, their time (Communicator::Stats) and the
  // buckets that started while a backward ran.
  int64_t skipped_steps = 0;
  int64_t gradient_reductions = 0;
  double communication_seconds = 0.0;
  int64_t buckets_started_in_backward = 0;
};

struct FitOptions {
  int epochs = 1;  // the run's last epoch + 1 (a resumed run's earlier epochs included)
  // Where the run starts: a resumed checkpoint's state (Trainer::restore called before), or epoch 0.
  train::CheckpointState start;
  // Asked at every group boundary and after each epoch's checkpoint (data parallel: on every rank at
  // the same points, so it may be a collective such as stop_requested_on_any_rank). Empty: never.
  std::function<bool()> stop;
  // Drawn as the epochs go (not owned; may be null).
  TrainingProgress* progress = nullptr;
  // Called before each epoch (counters a caller measures per epoch), and after its training: an
  // evaluation, a log line. An exception from a hook ends fit (FitLoop::state(): the epoch's end,
  // before its on_epoch_end).
  std::function<void(int epoch)> on_epoch_begin;
  std::function<void(const EpochSummary&)> on_epoch_end;
  // After each epoch's on_epoch_end, with the state a checkpoint records (empty: no checkpoints).
  std::function<void(const train::CheckpointState&)> checkpoint;
  // train_epoch's per-step and per-micro-batch hooks (EpochOptions'; its first and stop are fit's):
  // on_step once the resume point holds the boundary, on_micro_batch before the progress line.
  std::function<void(const train::MicroBatchDone&)> on_step;
  std::function<void(const train::MicroBatchDone&)> on_micro_batch;
};

enum class FitEnd {
  finished,             // every epoch
  stopped_in_epoch,     // FitOptions::stop at a group boundary of `epoch`, next_micro_batch where to resume
  stopped_after_epoch,  // FitOptions::stop after `epoch`'s checkpoint
};

struct FitResult {
  FitEnd end = FitEnd::finished;
  int epoch = 0;  // the epoch that was running when fit ended (the last one when finished)
  int64_t next_micro_batch = 0;
  train::CheckpointState state;  // what a checkpoint written now restores
};

// The loop, for a caller that must reach its state after an exception (a checkpoint on out of memory).
class FitLoop {
 public:
  // Holds references to every argument: they must outlive the loop.
  FitLoop(train::Trainer& trainer, data::DataLoader& loader, const train::BatchLoss& loss, const FitOptions& options);
  FitResult run();
  // The last group boundary (after an epoch's training, its end): reads the step counters now.
  train::CheckpointState state() const { return point_.state(); }

 private:
  bool train(int epoch, EpochSummary& summary, FitResult& result);
  bool stop_asked() const { return options_.stop && options_.stop(); }
  EpochSummary counters() const;
  void measure_plan(const EpochSummary& summary) const;

  train::Trainer& trainer_;
  data::DataLoader& loader_;
  const train::BatchLoss& loss_;
  const FitOptions& options_;
  train::ResumePoint point_;
};

FitResult fit(train::Trainer& trainer, data::DataLoader& loader, const train::BatchLoss& loss,
              const FitOptions& options);

}  // namespace cumulus::app
