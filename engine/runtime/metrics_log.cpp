#include "cumulus/runtime/metrics_log.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>

#include "cumulus/core/error.h"
#include "cumulus/io/file.h"

namespace cumulus {

MetricsLog::MetricsLog(std::string path, const std::string& position_key, std::optional<int64_t> resume_at,
                       MetricsWrites writes)
    : path_(std::move(path)), writes_(writes) {
  if (path_.empty() || !resume_at) return;
  std::ifstream in(path_, std::ios::binary);
  if (!in) return;  // no file yet: start one
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains(position_key) || !j[position_key].is_number_integer())
      throw Error("'" + path_ + "': line " + std::to_string(n) +
                  " is not a metrics line (a JSON object with an integer '" + position_key + "'); give another file");
    if (j[position_key].get<int64_t>() <= *resume_at) content_ += line + "\n";
  }
}

void MetricsLog::append(const std::string& json_object) {
  if (!enabled()) return;
  if (writes_ == MetricsWrites::atomic_rewrite) {
    content_ += json_object + "\n";
    io::write_file_atomic(path_, content_);
    return;
  }
  if (!out_.is_open()) {
    io::write_file_atomic(path_, content_);  // the kept lines (none for a new run), then appends
    out_.open(path_, std::ios::binary | std::ios::app);
    if (!out_) throw Error("'" + path_ + "': cannot be opened for appending");
  }
  out_ << json_object << '\n';
  out_.flush();
  if (!out_) throw Error("'" + path_ + "': write failed");
}

}  // namespace cumulus
