// Every path of a run checked in one place, before any work (issue: nothing a user types may lose
// data). Outputs must differ from each other and from every input, compared both by canonical
// path and by device and inode (so a hard link or a symlink to the same file is caught); they
// must be regular files or not exist yet (a symlink is followed to its target, which is written);
// and their directory must take a new file now, so a run never trains for an hour and then fails
// to save. Stale temporary files of earlier runs that died while writing an output are removed.
#pragma once

#include <string>

#include "run_config.h"

namespace fmnist {

// Outputs against each other and against --init / --resume; with several ranks, every rank's
// outputs (computed from `resolved`, the configuration before on_ranks()) against each other and
// those inputs (Note [The job's outputs]). Throws UsageFailure naming the flags (and ranks).
// --checkpoint may name the --resume file: the resumed checkpoint is read before it is replaced.
void check_run_paths(const RunConfig& resolved, const RunConfig& options);

// The job's outputs against the dataset's files in `data_dir` (once it is located).
void check_outputs_against_data(const RunConfig& resolved, const RunConfig& options, const std::string& data_dir);

}  // namespace fmnist
