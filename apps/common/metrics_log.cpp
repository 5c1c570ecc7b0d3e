#include "common/metrics_log.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>

#include "cumulus/core/error.h"
#include "cumulus/io/file.h"

namespace cumulus::app {

MetricsLog::MetricsLog(std::string path, const std::string& position_key, std::optional<int64_t> resume_at,
                       MetricsWrites writes)
    : path_(std::move(path)), writes_(writes) {
  if (!path_.empty() && resume_at) keep_lines_up_to(position_key, *resume_at);
  if (path_.empty() || writes_ != MetricsWrites::append) return;
  // Appending: the kept lines (none for a new run) are written now, so an unwritable file fails
  // before any training, and each line is added after them.
  io::write_file_atomic(path_, content_);
  out_.open(path_, std::ios::binary | std::ios::app);
  if (!out_) throw Error("'" + path_ + "': cannot be opened for appending");
}

void MetricsLog::keep_lines_up_to(const std::string& position_key, int64_t resume_at) {
  std::ifstream in(path_, std::ios::binary);
  if (!in) return;  // no file yet: start one
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
  out_ << json_object << '\n';
  out_.flush();
  if (!out_) throw Error("'" + path_ + "': write failed");
}

}  // namespace cumulus::app
