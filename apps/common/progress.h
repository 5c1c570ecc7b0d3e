// A training run's progress on a stream: on a terminal, a bar redrawn in place (micro-batches, loss,
// units/s, the epoch's and the whole run's ETA) fitted to the terminal's width; otherwise a plain
// line about every 10% of the epoch, so logs stay readable. Made for Trainer::train_epoch's hooks:
//
//   TrainingProgress progress(stderr, /*enabled=*/true, epochs);
//   progress.begin_epoch(epoch, loader.num_batches(), first);
//   options.on_micro_batch = [&](const MicroBatchDone& d) {
//     if (progress.due(d.index + 1)) progress.update(d.index + 1, mean_loss_so_far(), d.units_done);
//   };
//   ... trainer.train_epoch(loader, epoch, loss, options); progress.end_epoch();
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace cumulus::app {

class TrainingProgress {
 public:
  // `total_epochs`: the epochs of the whole run (those a resumed run already did included), for the
  // run's ETA; 0 if unknown (only the epoch's ETA is shown). `unit`: what the rate counts.
  TrainingProgress(std::FILE* out, bool enabled, int total_epochs = 0, std::string unit = "samples");
  // `epoch` counts from 0; `first`: the micro-batch this run starts the epoch at (a resume).
  void begin_epoch(int epoch, int64_t total_micro_batches, int64_t first = 0);
  // Whether update() would print now: read the loss (a device synchronization) only then.
  bool due(int64_t done) const;
  // `done` micro-batches of the epoch, `units_done` of them trained by this run.
  void update(int64_t done, double mean_loss, int64_t units_done);
  // Ends the bar's line; may be called again (after an interruption).
  void end_epoch();

 private:
  double run_eta(double epoch_eta, double seconds_per_micro_batch) const;

  std::FILE* out_;
  bool enabled_, tty_;
  int total_epochs_ = 0;
  std::string unit_;
  int epoch_ = 0;
  int64_t total_ = 0, first_ = 0, next_line_at_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_, last_end_;
  bool drawn_ = false, ended_ = false;
  // Measured on earlier epochs of this run: a whole epoch's training, and the time from an epoch's
  // end to the next one's start (evaluation, checkpoint); negative until measured.
  double full_epoch_s_ = -1, between_epochs_s_ = -1;
};

// The fields of a progress line, and the line fitted to `columns` (at most columns - 1 characters,
// so the terminal never wraps it): less important fields go first when narrow (the rate, then the
// epoch's ETA, the micro-batch count, the loss), then the bar shrinks.
struct ProgressLine {
  int epoch = 1, total_epochs = 0;  // epoch from 1; total 0: unknown
  int64_t done = 0, total = 0;
  double loss = 0, units_per_s = 0;
  double epoch_eta_s = 0, run_eta_s = -1;  // run ETA < 0: unknown
  std::string unit = "samples";
};
std::string format_progress_line(const ProgressLine& p, int columns);

// The terminal's width for `fd`: TIOCGWINSZ, else $COLUMNS, else 80.
int terminal_columns(int fd);

std::string format_duration(double seconds);  // "1:05", "1:02:03"

}  // namespace cumulus::app
