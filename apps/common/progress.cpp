#include "common/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

namespace cumulus::app {

std::string format_duration(double seconds) {
  const long s = static_cast<long>(std::max(seconds, 0.0) + 0.5);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

int terminal_columns(int fd) {
  winsize ws{};
  if (::ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* c = std::getenv("COLUMNS"); c != nullptr) {
    const long n = std::strtol(c, nullptr, 10);
    if (n > 0 && n < 10000) return static_cast<int>(n);
  }
  return 80;
}

std::string format_progress_line(const ProgressLine& p, int columns) {
  const std::size_t limit = static_cast<std::size_t>(std::max(columns - 1, 1));
  char buf[64];
  const std::string epoch =
      "Epoch " + std::to_string(p.epoch) + (p.total_epochs > 0 ? "/" + std::to_string(p.total_epochs) : "");
  // Padded to the total's digits, so the bar keeps its width as the count grows.
  std::string count = std::to_string(p.done);
  const std::string total = std::to_string(p.total);
  if (count.size() < total.size()) count.insert(0, total.size() - count.size(), ' ');
  count += "/" + total;
  std::snprintf(buf, sizeof buf, "loss %.4f", p.loss);
  const std::string loss = buf;
  if (p.units_per_s >= 1000) std::snprintf(buf, sizeof buf, "%.1fk", p.units_per_s / 1000);
  else std::snprintf(buf, sizeof buf, "%.0f", p.units_per_s);
  const std::string speed = buf;
  // With more epochs to go, the run's ETA is the one that matters; the epoch's is extra.
  const bool run_eta = p.run_eta_s >= 0 && p.total_epochs > 1;
  const std::string main_eta =
      run_eta ? "run ETA " + format_duration(p.run_eta_s) : "ETA " + format_duration(p.epoch_eta_s);
  const std::string epoch_eta = run_eta ? "epoch ETA " + format_duration(p.epoch_eta_s) : "";

  // Levels of detail, most first; the first whose line fits with a bar of 10 or more wins.
  struct Level {
    bool speed_long, speed, epoch_eta, count, loss;
  };
  const Level levels[] = {{true, true, true, true, true},     {false, true, true, true, true},
                          {false, false, true, true, true},   {false, false, false, true, true},
                          {false, false, false, false, true}, {false, false, false, false, false}};
  auto compose = [&](const Level& l, int bar, bool eta) {
    std::string s = epoch;
    if (bar > 0) {
      const int filled = p.total > 0 ? static_cast<int>(static_cast<int64_t>(bar) * p.done / p.total) : bar;
      s += " [" + std::string(static_cast<std::size_t>(std::clamp(filled, 0, bar)), '#') +
           std::string(static_cast<std::size_t>(bar - std::clamp(filled, 0, bar)), '.') + "]";
    }
    if (l.count) s += " " + count;
    if (l.loss) s += "  " + loss;
    if (l.speed) s += "  " + speed + (l.speed_long ? " " + p.unit + "/s" : std::string("/s"));
    if (l.epoch_eta && !epoch_eta.empty()) s += "  " + epoch_eta;
    if (eta) s += "  " + main_eta;
    return s;
  };
  constexpr int kMaxBar = 30, kMinBar = 10;
  for (const Level& l : levels) {
    const std::size_t without_bar = compose(l, 0, true).size();
    if (without_bar + 3 + kMinBar > limit) continue;
    return compose(l, static_cast<int>(std::min<std::size_t>(kMaxBar, limit - without_bar - 3)), true);
  }
  // Very narrow: the epoch and the ETA, then the epoch alone, cut to fit.
  std::string s = compose(levels[5], 0, true);
  if (s.size() > limit) s = epoch;
  return s.substr(0, limit);
}

TrainingProgress::TrainingProgress(std::FILE* out, bool enabled, int total_epochs, std::string unit)
    : out_(out),
      enabled_(enabled),
      tty_(::isatty(::fileno(out)) == 1),
      total_epochs_(std::max(total_epochs, 0)),
      unit_(std::move(unit)) {}

void TrainingProgress::begin_epoch(int epoch, int64_t total, int64_t first) {
  const auto now = std::chrono::steady_clock::now();
  if (ended_) between_epochs_s_ = std::chrono::duration<double>(now - last_end_).count();
  ended_ = false;
  epoch_ = epoch;
  total_ = total;
  first_ = first;
  next_line_at_ = first + std::max<int64_t>(1, total / 10);
  start_ = last_draw_ = now;
  drawn_ = false;
}

bool TrainingProgress::due(int64_t done) const {
  if (!enabled_) return false;
  if (done == total_) return true;
  if (tty_) return std::chrono::steady_clock::now() - last_draw_ >= std::chrono::milliseconds(100);
  return done >= next_line_at_;
}

// The rest of this epoch, then each later epoch as long as the last whole one measured (or this
// epoch's pace), plus the time between epochs (evaluation, checkpoint) once seen; the last epoch's
// evaluation counts too.
double TrainingProgress::run_eta(double epoch_eta, double seconds_per_micro_batch) const {
  if (total_epochs_ <= 0) return -1;
  const int later = std::max(total_epochs_ - epoch_ - 1, 0);
  const double epoch_s = full_epoch_s_ >= 0 ? full_epoch_s_ : seconds_per_micro_batch * static_cast<double>(total_);
  const double between = std::max(between_epochs_s_, 0.0);
  return epoch_eta + between + static_cast<double>(later) * (epoch_s + between);
}

void TrainingProgress::update(int64_t done, double mean_loss, int64_t units_done) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  last_draw_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double rate = elapsed > 0 ? static_cast<double>(units_done) / elapsed : 0.0;
  const int64_t ran = done - first_;
  const double per_micro_batch = ran > 0 ? elapsed / static_cast<double>(ran) : 0.0;
  const double eta = per_micro_batch * static_cast<double>(total_ - done);
  const double run = ran > 0 ? run_eta(eta, per_micro_batch) : -1;
  if (tty_) {
    ProgressLine p;
    p.epoch = epoch_ + 1;
    p.total_epochs = total_epochs_;
    p.done = done;
    p.total = total_;
    p.loss = mean_loss;
    p.units_per_s = rate;
    p.unit = unit_;
    p.epoch_eta_s = eta;
    p.run_eta_s = run;
    // Asked at every draw, so a resized terminal is followed; "\033[K" clears what a longer
    // previous line left.
    const std::string line = format_progress_line(p, terminal_columns(::fileno(out_)));
    std::fprintf(out_, "\r%s\033[K", line.c_str());
    drawn_ = true;
  } else {
    char speed[32];
    if (rate >= 1000) std::snprintf(speed, sizeof speed, "%.1fk", rate / 1000);
    else std::snprintf(speed, sizeof speed, "%.0f", rate);
    std::string epoch = std::to_string(epoch_ + 1);
    if (total_epochs_ > 0) epoch += "/" + std::to_string(total_epochs_);
    std::string run_part;
    if (run >= 0 && total_epochs_ > 1) run_part = "  run ETA " + format_duration(run);
    std::fprintf(out_, "Epoch %s  %lld/%lld micro-batches  loss %.4f  %s %s/s  ETA %s%s\n", epoch.c_str(),
                 static_cast<long long>(done), static_cast<long long>(total_), mean_loss, speed, unit_.c_str(),
                 format_duration(eta).c_str(), run_part.c_str());
    next_line_at_ = done + std::max<int64_t>(1, total_ / 10);
  }
  std::fflush(out_);
}

void TrainingProgress::end_epoch() {
  if (enabled_ && tty_ && drawn_) std::fputc('\n', out_);
  drawn_ = false;
  if (ended_) return;  // called again after an interruption
  const auto now = std::chrono::steady_clock::now();
  // Only an epoch run from its start measures a whole one.
  if (first_ == 0 && total_ > 0) full_epoch_s_ = std::chrono::duration<double>(now - start_).count();
  last_end_ = now;
  ended_ = true;
}

}  // namespace cumulus::app
