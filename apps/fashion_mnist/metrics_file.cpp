#include "metrics_file.h"

#include <fstream>

#include "cumulus/core/error.h"
#include "cumulus/io/file.h"

using namespace cumulus;

namespace fmnist {

MetricsFile::MetricsFile(std::string path, bool resuming, int finished_epochs) : path_(std::move(path)) {
  if (path_.empty() || !resuming) return;
  std::ifstream in(path_, std::ios::binary);
  if (!in) return;  // no file yet: start one
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("epoch") || !j["epoch"].is_number_integer())
      throw Error("--metrics '" + path_ + "': line " + std::to_string(n) +
                  " is not a metrics line of this app; give --metrics another file");
    if (j["epoch"].get<int64_t>() <= finished_epochs) content_ += line + "\n";
  }
}

void MetricsFile::append(const nlohmann::ordered_json& line) {
  if (!enabled()) return;
  content_ += line.dump() + "\n";
  try {
    io::write_file_atomic(path_, content_);
  } catch (const Error& e) {
    throw Error("--metrics: " + std::string(e.what()));
  }
}

}  // namespace fmnist
