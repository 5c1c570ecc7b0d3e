// Every path of a run checked in one place, before any work, with the library's checks
// (cumulus/runtime/run_files.h): outputs distinct from each other, from the inputs and from the
// dataset's files, their directories taking a new file now, stale temporaries removed.
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
