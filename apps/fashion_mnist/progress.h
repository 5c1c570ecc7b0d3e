// Progress of an epoch: on a terminal a bar redrawn in place (micro-batches, loss, samples/s,
// ETA); otherwise a plain line about every 10% of the epoch, so logs stay readable.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace fmnist {

class Progress {
 public:
  Progress(std::FILE* out, bool enabled);
  void begin_epoch(int epoch, int64_t total_micro_batches, int64_t first);
  // Whether update() would print now: callers read the loss (a device synchronization) only then.
  bool due(int64_t done) const;
  void update(int64_t done, double mean_loss, int64_t samples_done);
  void end_epoch();

 private:
  std::FILE* out_;
  bool enabled_, tty_;
  int epoch_ = 0;
  int64_t total_ = 0, first_ = 0, next_line_at_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool drawn_ = false;
};

std::string format_duration(double seconds);  // "1:05", "1:02:03"

}  // namespace fmnist
