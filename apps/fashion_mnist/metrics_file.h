// --metrics, one JSON line per epoch, rewritten atomically after each epoch: a full disk or an
// unwritable file is an error naming the flag, and a crash never leaves half a line. A resumed run
// keeps the lines of the epochs its checkpoint had finished and drops any after them.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace fmnist {

class MetricsFile {
 public:
  MetricsFile(std::string path, bool resuming, int finished_epochs);
  bool enabled() const { return !path_.empty(); }
  void append(const nlohmann::ordered_json& line);

 private:
  std::string path_, content_;
};

}  // namespace fmnist
