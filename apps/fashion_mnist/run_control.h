// What every phase of the run shares, and the checks made before any work. Signals are the
// apps' common library's (apps/common/stop_signal.h): the training loop stops at the next group boundary,
// loading, planning and the test pass at once; the run exits 130 (SIGINT), 143 (SIGTERM) or 141
// (stdout closed). Under mpirun every check that could stop one rank is made on every rank, so
// that no rank waits in a collective for one that stopped.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

#include "common/stop_signal.h"
#include "cumulus/dist/communicator.h"
#include "run_config.h"

namespace fmnist {

// A usage error every rank finds at once (ranks started with different settings, or a problem one
// rank found and dist::problem_of_any_rank told every rank of): rank 0 says it, the ranks end together.
struct SameOnEveryRank : UsageFailure {
  using UsageFailure::UsageFailure;
};

// A runtime failure every rank finds at once (ranks that loaded different data): rank 0 says it,
// and the ranks end together with exit code 1.
struct ErrorOnEveryRank : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The points of cumulus::fault_signal_point (tests/test_faults.cpp): micro_batch:<epoch>:<i>, just
// after micro-batch i (from 0) of epoch <epoch> (from 1) is trained; test_pass:<epoch>, before the
// first batch of epoch <epoch>'s test pass.

// Data parallel (mpirun): rank 0 prints, writes the checkpoint, the weights and the metrics.
extern bool g_root;
// Set when every rank stopped at the same group boundary (a signal, agreed on): the ranks end
// together. Any other non-zero exit on one rank ends the job (MPI_Abort) instead.
extern bool g_agreed_exit;

// stdout, flushed at once: a failed write (a closed pipe, a full disk) is turned into a stop
// request, so the run still checkpoints and exits non-zero instead of dying or lying.
void say(const char* format, ...) __attribute__((format(printf, 1, 2)));

// Before any file is touched: this rank, the number of ranks and this rank's device (one GPU per
// rank of a node for --device auto or cuda), for on_ranks(). Sets g_root and, without --threads,
// each rank's share of the host's cores. Refuses what several ranks cannot run (the planner,
// --graphs on) and a device problem of any rank (a usage error on every rank).
RankPlacement place_on_ranks(const RunConfig& config, cumulus::dist::Communicator& comm);

// Every rank must have been started with the same settings (Note [Settings table]): a usage error
// on every rank, naming the setting, if not.
void check_same_settings_on_every_rank(const RunConfig& config, cumulus::dist::Communicator& comm);

// Runs `check` on every rank; a UsageFailure on any rank becomes a usage error on every rank
// (SameOnEveryRank, naming the rank).
void usage_check_on_every_rank(cumulus::dist::Communicator& comm, const std::function<void()>& check);

// Note [Ranks agree on what they loaded]: each rank reads its own files (--data, --resume), so
// equal settings do not make the epoch's length or a resume's position equal, and ranks that differ
// would wait forever in a collective. Compared with dist::difference_among_ranks before any
// collective depends on them: a difference is an error on every rank (exit 1) naming each value.
void check_same_loaded_on_every_rank(const char* what, const std::string& mine, const std::string& advice,
                                     cumulus::dist::Communicator& comm);

// The library's checks of the run's files (cumulus/io/run_files.h): outputs writable now,
// against each other and against --init / --resume; with several ranks, every rank's
// outputs (computed from `resolved`, the configuration before on_ranks()) against each other and
// those inputs (Note [The job's outputs]). Throws UsageFailure naming the flags (and ranks).
// --checkpoint may name the --resume file: the resumed checkpoint is read before it is replaced.
void check_run_paths(const RunConfig& resolved, const RunConfig& options);

// The job's outputs against the dataset's files in `data_dir` (once it is located).
void check_outputs_against_data(const RunConfig& resolved, const RunConfig& options, const std::string& data_dir);

// models::locate_fashion_mnist with `data_flag` (--data) as the directory: --data or $CUMULUS_DATA
// without the four files is a UsageFailure naming what is missing; every other fault (no curl or
// sha256sum, a failed download, a wrong sum, mismatched headers) a cumulus::Error.
std::string locate_fashion_mnist(const std::string& data_flag, bool quiet);

}  // namespace fmnist
