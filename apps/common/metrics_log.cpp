#include "common/metrics_log.h"

#include <sys/stat.h>

#include <cerrno>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "cumulus/core/error.h"
#include "cumulus/io/file.h"

namespace cumulus::app {

namespace {
// A metrics file a resume reads back: far more than a long run's lines (about 100 bytes a step).
constexpr uint64_t kMaxMetricsBytes = uint64_t{1} << 30;
}  // namespace

MetricsLog::MetricsLog(std::string path, const std::string& position_key, std::optional<int64_t> resume_at,
                       MetricsWrites writes)
    : path_(std::move(path)), writes_(writes) {
  if (!path_.empty() && resume_at) keep_lines_up_to(position_key, *resume_at);
  if (path_.empty() || writes_ != MetricsWrites::append) return;
  // Appending: the kept lines (none for a new run) are written now, so an unwritable file fails
  // before any training, and each line is added after them.
  // The name itself is written and then appended to, never a symlink's target.
  io::write_file_atomic(path_, content_, io::OutputLinks::replace);
  out_ = io::AppendFile(path_);
}

void MetricsLog::keep_lines_up_to(const std::string& position_key, int64_t resume_at) {
  struct stat st {};
  if (::lstat(path_.c_str(), &st) != 0 && errno == ENOENT) return;  // no file yet: start one
  std::istringstream in(io::read_regular_file(path_, "'" + path_ + "': ", kMaxMetricsBytes));
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains(position_key) || !j[position_key].is_number_integer())
      throw Error("'" + path_ + "': line " + std::to_string(n) +
                  " is not a metrics line (a JSON object with an integer '" + position_key + "'); give another file");
    if (j[position_key].get<int64_t>() <= resume_at) content_ += line + "\n";
  }
}

void MetricsLog::append(const std::string& json_object) {
  if (!enabled()) return;
  if (writes_ == MetricsWrites::atomic_rewrite) {
    content_ += json_object + "\n";
    io::write_file_atomic(path_, content_);
    return;
  }
  out_.write(json_object + "\n");
}

}  // namespace cumulus::app
