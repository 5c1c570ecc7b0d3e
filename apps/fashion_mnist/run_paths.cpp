#include "run_paths.h"

#include <vector>

#include "cumulus/core/error.h"
#include "cumulus/runtime/run_files.h"

namespace fmnist {
namespace {

using cumulus::RunFile;

std::vector<RunFile> outputs_of(const RunConfig& o, const std::string& owner = "") {
  std::vector<RunFile> out;
  for (const RunFile& f : {RunFile{"--save", o.save_path}, RunFile{"--checkpoint", o.checkpoint_path},
                           RunFile{"--memory-report", o.memory_report_path}, RunFile{"--trace", o.trace_path},
                           RunFile{"--memory-plot", o.memory_plot_path}, RunFile{"--metrics", o.metrics_path}})
    if (!f.path.empty()) out.push_back({owner + f.name, f.path});
  return out;
}

// Note [The job's outputs]
// Under mpirun rank k > 0 writes its reports under names with ".rank<k>" and rank 0 writes the
// checkpoint, the weights and the metrics, so one rank's outputs alone cannot show that rank 1's
// memory report is named like rank 0's checkpoint: the whole job's outputs are compared, every
// rank's names computed from the same resolved configuration (the ranks agree on it), each named
// with its rank in a message.
std::vector<RunFile> job_outputs(const RunConfig& resolved, const RunConfig& placed) {
  if (placed.world_size == 1) return outputs_of(placed);
  std::vector<RunFile> out;
  for (int k = 0; k < placed.world_size; ++k) {
    const std::vector<RunFile> rank_k = outputs_of(
        on_ranks(resolved, RankPlacement{k, placed.world_size, placed.device}), "rank " + std::to_string(k) + "'s ");
    out.insert(out.end(), rank_k.begin(), rank_k.end());
  }
  return out;
}

// The library's checks, their refusals as usage errors.
template <class Check>
void as_usage(const Check& check) {
  try {
    check();
  } catch (const cumulus::InvalidArgument& e) {
    throw UsageFailure(e.what());
  }
}

}  // namespace

void check_run_paths(const RunConfig& resolved, const RunConfig& o) {
  as_usage([&] {
    cumulus::check_outputs_writable(outputs_of(o));
    // Resuming from a checkpoint and writing the next ones to the same file is the normal use: the
    // checkpoint is read in full before anything is written.
    cumulus::check_outputs_distinct(job_outputs(resolved, o), {{"--init", o.init_path}, {"--resume", o.resume_path}},
                                    [](const RunFile& in, const RunFile& out) {
                                      const std::string checkpoint = "--checkpoint";  // any rank's
                                      return in.name == "--resume" && out.name.size() >= checkpoint.size() &&
                                             out.name.compare(out.name.size() - checkpoint.size(), checkpoint.size(),
                                                              checkpoint) == 0;
                                    });
    cumulus::check_outputs_not_standard_streams(outputs_of(o));
  });
}

void check_outputs_against_data(const RunConfig& resolved, const RunConfig& o, const std::string& data_dir) {
  as_usage([&] { cumulus::check_outputs_outside(job_outputs(resolved, o), data_dir, "the dataset"); });
}

}  // namespace fmnist
