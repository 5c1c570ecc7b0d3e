#include "progress.h"

#include <unistd.h>

#include <algorithm>

namespace fmnist {

std::string format_duration(double seconds) {
  const long s = static_cast<long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

Progress::Progress(std::FILE* out, bool enabled)
    : out_(out), enabled_(enabled), tty_(::isatty(::fileno(out)) == 1) {}

void Progress::begin_epoch(int epoch, int64_t total, int64_t first) {
  epoch_ = epoch;
  total_ = total;
  first_ = first;
  next_line_at_ = first + std::max<int64_t>(1, total / 10);
  start_ = last_draw_ = std::chrono::steady_clock::now();
  drawn_ = false;
}

bool Progress::due(int64_t done) const {
  if (!enabled_) return false;
  if (done == total_) return true;
  if (tty_) return std::chrono::steady_clock::now() - last_draw_ >= std::chrono::milliseconds(100);
  return done >= next_line_at_;
}

void Progress::update(int64_t done, double mean_loss, int64_t samples_done) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  last_draw_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double rate = elapsed > 0 ? static_cast<double>(samples_done) / elapsed : 0.0;
  const int64_t ran = done - first_;
  const double eta = ran > 0 ? elapsed / static_cast<double>(ran) * static_cast<double>(total_ - done) : 0.0;
  char speed[32];
  if (rate >= 1000) std::snprintf(speed, sizeof speed, "%.1fk", rate / 1000);
  else std::snprintf(speed, sizeof speed, "%.0f", rate);
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = total_ > 0 ? static_cast<int>(kWidth * done / total_) : kWidth;
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(out_, "\rEpoch %d [%s] %lld/%lld  loss %.4f  %s samples/s  ETA %s ", epoch_ + 1, bar.c_str(),
                 static_cast<long long>(done), static_cast<long long>(total_), mean_loss, speed,
                 format_duration(eta).c_str());
    drawn_ = true;
  } else {
    std::fprintf(out_, "Epoch %d  %lld/%lld micro-batches  loss %.4f  %s samples/s  ETA %s\n", epoch_ + 1,
                 static_cast<long long>(done), static_cast<long long>(total_), mean_loss, speed,
                 format_duration(eta).c_str());
    next_line_at_ = done + std::max<int64_t>(1, total_ / 10);
  }
  std::fflush(out_);
}

void Progress::end_epoch() {
  if (enabled_ && tty_ && drawn_) std::fputc('\n', out_);
  drawn_ = false;
}

}  // namespace fmnist
