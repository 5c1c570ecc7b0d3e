// The files a run reads and writes, checked before any work, so that nothing a user types loses data
// and a run never trains for an hour and then fails to save; and the memory tracker's reports
// written to them at the end. Two paths are the same file when their
// canonical forms are equal or, where both exist, their device and inode are (a hard link, or a
// symlink to the file: an output's identity is that of the file a write lands in, a symlink's
// target). Each check throws InvalidArgument whose message names the file by its RunFile::name.
//
//   std::vector<RunFile> outputs = {{"--checkpoint", ckpt}, {"--metrics", metrics}};
//   check_inputs_readable({{"--resume", resume}});
//   check_outputs_writable(outputs);
//   check_outputs_distinct(outputs, {{"--resume", resume}}, resume_may_be_overwritten);
//   ... train ...
//   MemoryReportFiles reports;
//   reports.report.path = "memory.json";
//   write_memory_reports(tracker, reports);
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace cumulus {

class MemoryTracker;

struct RunFile {
  std::string name;  // how messages name it: "--save", "rank 1's --trace"
  std::string path;
};

// Each input (an empty path skipped) exists, is a regular file (not a directory, a FIFO, a device)
// and is readable by this process.
void check_inputs_readable(const std::vector<RunFile>& inputs);

// Each output's directory takes a new file now (io::check_output_writable), its name fits the
// filesystem, and the temporary files an earlier writer of it left when it died are removed.
void check_outputs_writable(const std::vector<RunFile>& outputs);

// No two outputs are the same file, and no output is an input but where `may_replace(input,
// output)` allows it (a checkpoint written over the one resumed, read in full before).
void check_outputs_distinct(const std::vector<RunFile>& outputs, const std::vector<RunFile>& inputs,
                            const std::function<bool(const RunFile& input, const RunFile& output)>& may_replace = {});

// No output is the file this process's standard output or error is redirected to.
void check_outputs_not_standard_streams(const std::vector<RunFile>& outputs);

// No output is a regular file in `directory` (`what` names its files: "the dataset").
void check_outputs_outside(const std::vector<RunFile>& outputs, const std::string& directory, const std::string& what);

// A rank's own name for a file every rank of a data-parallel job writes: ".rank<k>" before the
// extension ("memory.json" -> "memory.rank1.json", "trace" -> "trace.rank1"); "" stays "".
std::string rank_path(const std::string& path, int rank);

// The memory tracker's reports (runtime/tracker.h), each named as messages name it; an empty path
// is not written.
struct MemoryReportFiles {
  RunFile report{"--memory-report", ""};  // memory_report_json
  RunFile trace{"--trace", ""};           // memory_trace_json
  RunFile plot{"--memory-plot", ""};      // memory_plot_svg
};
// Writes each report given a path, in that order, atomically (io::write_file_atomic); a failed
// write throws Error naming the file ("--trace: ..."). `written(what, path)` follows each file
// written, `what` being "memory report", "trace" or "memory plot" (for a line saying so).
void write_memory_reports(MemoryTracker& tracker, const MemoryReportFiles& files,
                          const std::function<void(const char* what, const std::string& path)>& written = {});

}  // namespace cumulus
