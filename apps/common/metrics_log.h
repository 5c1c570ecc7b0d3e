// A metrics file of JSON lines (one object per epoch or per step) that survives a resume: a resumed
// run keeps the lines up to its checkpoint's position and drops the ones after it, so the file reads
// as one run. By default every append rewrites the file atomically (io::write_file_atomic): a crash
// never leaves half a line. For a line per step, where rewriting would cost the whole file each
// time, MetricsWrites::append writes the kept lines in place of the name, then adds each line to
// that file (io::AppendFile): a symlink swapped in meanwhile is never written through. Either way
// a full disk or an unwritable file is an Error naming it.
//
//   MetricsLog metrics(path, "epoch", resuming ? std::optional<int64_t>(finished_epochs) : std::nullopt);
//   metrics.append(R"({"epoch": 3, "train_loss": 0.41})");
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "cumulus/io/file.h"

namespace cumulus::app {

enum class MetricsWrites { atomic_rewrite, append };

class MetricsLog {
 public:
  MetricsLog() = default;  // writes nothing
  // `path` empty: writes nothing. `resume_at` set: keeps the lines of an existing file whose integer
  // `position_key` is at most *resume_at (a line without one, or not a JSON object, is an Error: the
  // file is not such a log); unset: a new run, whose first append (MetricsWrites::append: this
  // constructor) replaces any file there.
  explicit MetricsLog(std::string path, const std::string& position_key = "epoch",
                      std::optional<int64_t> resume_at = std::nullopt,
                      MetricsWrites writes = MetricsWrites::atomic_rewrite);
  bool enabled() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  // Appends `json_object` (one JSON object, without a newline) as a line.
  void append(const std::string& json_object);

 private:
  void keep_lines_up_to(const std::string& position_key, int64_t resume_at);

  std::string path_, content_;  // content_: the lines so far (atomic_rewrite), or those kept (append)
  MetricsWrites writes_ = MetricsWrites::atomic_rewrite;
  io::AppendFile out_;  // MetricsWrites::append
};

}  // namespace cumulus::app
