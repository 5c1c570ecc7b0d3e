#include "run_paths.h"

#include <sys/stat.h>

#include <climits>
#include <filesystem>
#include <vector>

#include "cumulus/core/error.h"
#include "cumulus/io/file.h"

namespace fmnist {

namespace fs = std::filesystem;

namespace {

struct NamedPath {
  std::string flag, path;
  std::string owner = "";  // "rank k's " among the job's outputs (Note [The job's outputs])
  std::string label() const { return owner + flag; }
};

// Who a path is: its canonical form (symlinks resolved as far as the path exists) and, when it
// exists, its device and inode (which also catch hard links).
struct Identity {
  std::string canonical;
  bool exists = false;
  dev_t device = 0;
  ino_t inode = 0;
};

Identity identify(const std::string& path) {
  Identity id;
  std::error_code ec;
  const fs::path canonical = fs::weakly_canonical(fs::absolute(path, ec), ec);
  id.canonical = ec ? path : canonical.string();
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    id.exists = true;
    id.device = st.st_dev;
    id.inode = st.st_ino;
  }
  return id;
}

bool same_file(const Identity& a, const Identity& b) {
  return a.canonical == b.canonical || (a.exists && b.exists && a.device == b.device && a.inode == b.inode);
}

std::vector<NamedPath> outputs_of(const RunConfig& o, const std::string& owner = "") {
  std::vector<NamedPath> out;
  for (const NamedPath& p : {NamedPath{"--save", o.save_path}, NamedPath{"--checkpoint", o.checkpoint_path},
                             NamedPath{"--memory-report", o.memory_report_path}, NamedPath{"--trace", o.trace_path},
                             NamedPath{"--memory-plot", o.memory_plot_path}, NamedPath{"--metrics", o.metrics_path}})
    if (!p.path.empty()) out.push_back({p.flag, p.path, owner});
  return out;
}

// Note [The job's outputs]
// Under mpirun rank k > 0 writes its reports under names with ".rank<k>" and rank 0 writes the
// checkpoint, the weights and the metrics, so one rank's outputs alone cannot show that rank 1's
// memory report is named like rank 0's checkpoint: the whole job's outputs are compared, every
// rank's names computed from the same resolved configuration (the ranks agree on it), each named
// with its rank in a message.
std::vector<NamedPath> job_outputs(const RunConfig& resolved, const RunConfig& placed) {
  if (placed.world_size == 1) return outputs_of(placed);
  std::vector<NamedPath> out;
  for (int k = 0; k < placed.world_size; ++k) {
    const std::vector<NamedPath> rank_k = outputs_of(
        on_ranks(resolved, RankPlacement{k, placed.world_size, placed.device}), "rank " + std::to_string(k) + "'s ");
    out.insert(out.end(), rank_k.begin(), rank_k.end());
  }
  return out;
}

// An output's identity is that of the file a write lands in (a symlink's target).
Identity identify_output(const NamedPath& p) {
  try {
    return identify(cumulus::io::resolve_output_path(p.path));
  } catch (const cumulus::Error& e) {
    throw UsageFailure(p.label() + ": " + e.what());
  }
}

// This rank's outputs: a file name the filesystem takes, a directory that takes a new file now,
// and no stale temporary of an earlier run beside it. Returns their identities.
std::vector<Identity> check_own_outputs(const std::vector<NamedPath>& outputs) {
  std::vector<Identity> ids;
  for (const NamedPath& p : outputs) {
    ids.push_back(identify_output(p));
    const std::string name = fs::path(ids.back().canonical).filename().string();
    if (name.size() > NAME_MAX)
      throw UsageFailure(p.flag + " '" + p.path + "': the file name is " + std::to_string(name.size()) +
                         " bytes long; the filesystem allows at most " + std::to_string(NAME_MAX));
    try {
      cumulus::io::remove_stale_temp_files(cumulus::io::resolve_output_path(p.path));
      cumulus::io::check_output_writable(p.path);
    } catch (const cumulus::Error& e) {
      throw UsageFailure(p.flag + ": " + e.what());
    }
  }
  return ids;
}

}  // namespace

void check_run_paths(const RunConfig& resolved, const RunConfig& o) {
  const std::vector<NamedPath> own = outputs_of(o);
  const std::vector<Identity> own_ids = check_own_outputs(own);
  // Every rank's outputs against each other and against the inputs (Note [The job's outputs]).
  const std::vector<NamedPath> outputs = job_outputs(resolved, o);
  std::vector<Identity> ids;
  for (const NamedPath& p : outputs) ids.push_back(identify_output(p));
  for (std::size_t i = 0; i < outputs.size(); ++i)
    for (std::size_t j = i + 1; j < outputs.size(); ++j)
      if (same_file(ids[i], ids[j]))
        throw UsageFailure(outputs[i].label() + " '" + outputs[i].path + "' and " + outputs[j].label() + " '" +
                           outputs[j].path + "' are the same file; give each output its own file");
  // This process's stdout or stderr redirected into a file (or /dev/stdout naming it): writing
  // an output there would replace the file the shell is still writing.
  for (const int fd : {1, 2}) {
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) continue;
    for (std::size_t i = 0; i < own.size(); ++i)
      if (own_ids[i].exists && own_ids[i].device == st.st_dev && own_ids[i].inode == st.st_ino)
        throw UsageFailure(own[i].flag + " '" + own[i].path + "' is the file this run's standard " +
                           (fd == 1 ? "output" : "error") + " goes to; give the output its own file");
  }
  for (const NamedPath& in : {NamedPath{"--init", o.init_path}, NamedPath{"--resume", o.resume_path}}) {
    if (in.path.empty()) continue;
    const Identity input = identify(in.path);
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      // Resuming from a checkpoint and writing the next ones to the same file is the normal use:
      // the checkpoint is read in full before anything is written.
      if (in.flag == "--resume" && outputs[i].flag == "--checkpoint") continue;
      if (same_file(input, ids[i]))
        throw UsageFailure(outputs[i].label() + " '" + outputs[i].path + "' is the " + in.flag + " file '" + in.path +
                           "'; writing it would destroy the input. Give the output another name");
    }
  }
}

void check_outputs_against_data(const RunConfig& resolved, const RunConfig& o, const std::string& data_dir) {
  const std::vector<NamedPath> outputs = job_outputs(resolved, o);
  if (outputs.empty()) return;
  std::vector<Identity> ids;
  for (const NamedPath& p : outputs) ids.push_back(identify_output(p));
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(data_dir, ec)) {
    if (!entry.is_regular_file(ec)) continue;
    const Identity data_file = identify(entry.path().string());
    for (std::size_t i = 0; i < outputs.size(); ++i)
      if (same_file(data_file, ids[i]))
        throw UsageFailure(outputs[i].label() + " '" + outputs[i].path + "' is a file of the dataset in '" + data_dir +
                           "'; writing it would destroy the data. Give the output another name");
  }
}

}  // namespace fmnist
