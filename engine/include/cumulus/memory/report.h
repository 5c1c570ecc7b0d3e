// The memory tracker's reports: a table for the terminal, the JSON report (its schema in
// docs/memory.md), a Chrome trace and an SVG plot of the timeline; and the files a run writes.
//
//   memory::print_memory_table(tracker, stdout);
//   memory::MemoryReportFiles files;
//   files.report.path = "memory.json";
//   memory::write_memory_reports(tracker, files);
#pragma once

#include <cstdio>
#include <functional>
#include <string>

#include "cumulus/io/file.h"
#include "cumulus/io/run_files.h"
#include "cumulus/memory/tracker.h"

namespace cumulus::memory {

void print_memory_table(MemoryTracker& tracker, std::FILE* out);
// The documented schema (docs/memory.md): schema_version, settings, device, versions, model,
// micro_batch_size, accum_steps, summary, planner (with a plan check), then the records.
inline constexpr int kMemoryReportSchemaVersion = 3;
std::string memory_report_json(MemoryTracker& tracker);
// Chrome trace-event JSON: counter tracks per category, slices for forward, backward and step.
std::string memory_trace_json(MemoryTracker& tracker);
// An SVG of the timeline window: memory stacked by category; below, on its own scale, what changes
// above the fixed costs (the accumulation sawtooth), with micro-batch and step markers.
std::string memory_plot_svg(MemoryTracker& tracker);

// The files a run writes the reports to, each named as messages name it; an empty path is skipped.
struct MemoryReportFiles {
  io::RunFile report{"--memory-report", ""};        // memory_report_json
  io::RunFile trace{"--trace", ""};                 // memory_trace_json
  io::RunFile plot{"--memory-plot", ""};            // memory_plot_svg
  io::OutputLinks links = io::OutputLinks::follow;  // whether a symlink at a path is written through
};
// Writes each report given a path, in that order, atomically; a failed write throws Error naming
// the file ("--trace: ..."). `written(what, path)` follows each ("memory report", "trace", "memory plot").
void write_memory_reports(MemoryTracker& tracker, const MemoryReportFiles& files,
                          const std::function<void(const char* what, const std::string& path)>& written = {});

}  // namespace cumulus::memory
