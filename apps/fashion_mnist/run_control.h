// What every phase of the run shares: the signal flag and its exit codes, the interrupt thrown
// outside the training loop, the data-parallel roles (who prints) and say(), stdout for rank 0.
//
// Signals only set a flag, honoured in every phase: during training the loop stops at the next
// group boundary (the current optimizer step finishes); during the test pass, loading or planning
// at once. The run exits 130 (SIGINT), 143 (SIGTERM) or 141 (standard output closed: SIGPIPE is
// ignored and a failed write to stdout is treated as an interrupt, so `| head` never kills a run
// before its checkpoint).
#pragma once

#include <csignal>
#include <stdexcept>

#include "options.h"

namespace fmnist {

extern volatile std::sig_atomic_t g_signal;  // SIGINT, SIGTERM, or SIGPIPE for a closed stdout

// From the start of a run: a signal during loading must also end in a clean exit (130/143), never
// in death by the signal. SIGPIPE: see say().
void install_signal_handlers();

int exit_code_for(int sig);
const char* signal_name(int sig);

// A usage error every rank finds at once (ranks started with different settings, or a problem one
// rank found and dist::problem_of_any_rank told every rank of): rank 0 says it, and the ranks end
// together.
struct SameOnEveryRank : UsageFailure {
  using UsageFailure::UsageFailure;
};

// A runtime failure every rank finds at once (ranks that loaded different data): rank 0 says it,
// and the ranks end together with exit code 1.
struct ErrorOnEveryRank : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Thrown where a phase outside the training loop (loading, planning, the test pass) notices an
// interrupt; the training loop itself stops at a group boundary without it.
struct Interrupted {};

void throw_if_interrupted();

// Test hook (tests/test_faults.cpp), not a feature, like CUMULUS_FAULT_INJECT in engine/io/file.cpp:
// CUMULUS_FAULT_SIGNAL=<point> raises SIGINT once, when the run reaches that point, so a test can
// interrupt a run at an exact place instead of after a guessed delay. The points:
//   micro_batch:<epoch>:<i>  just after micro-batch i (from 0) of epoch <epoch> (from 1) is trained
//   test_pass:<epoch>        before the first batch of epoch <epoch>'s test pass
// Unset in normal use (one getenv per call).
void fault_signal_point(const char* kind, int epoch, int64_t index = -1);

// Data parallel (mpirun): rank 0 prints, writes the checkpoint, the weights and the metrics;
// every rank writes its own memory report. See run_data_parallel_setup().
extern bool g_root;
// Set when every rank stopped at the same group boundary (a signal, agreed on): the ranks end
// together. Any other non-zero exit on one rank ends the job (MPI_Abort) instead.
extern bool g_agreed_exit;

// stdout, flushed at once: a failed write (a closed pipe, a full disk) is noticed here and turned
// into an interrupt, so the run still checkpoints and exits non-zero instead of dying or lying.
// Checked as printf's format (-Werror=format on the app): a mismatched argument fails the build.
void say(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace fmnist
