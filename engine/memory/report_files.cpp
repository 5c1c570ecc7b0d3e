// Writing the memory reports to the files a run names (cumulus/memory/report.h).
#include <string>

#include "cumulus/core/error.h"
#include "cumulus/io/file.h"
#include "cumulus/memory/report.h"

namespace cumulus::memory {

void write_memory_reports(MemoryTracker& tracker, const MemoryReportFiles& files,
                          const std::function<void(const char* what, const std::string& path)>& written) {
  auto write = [&](const io::RunFile& file, const char* what, std::string (*report)(MemoryTracker&)) {
    if (file.path.empty()) return;
    try {
      io::write_file_atomic(file.path, report(tracker), files.links);
    } catch (const Error& e) {
      throw Error(file.name + ": " + e.what());
    }
    if (written) written(what, file.path);
  };
  write(files.report, "memory report", memory_report_json);
  write(files.trace, "trace", memory_trace_json);
  write(files.plot, "memory plot", memory_plot_svg);
}

}  // namespace cumulus::memory
