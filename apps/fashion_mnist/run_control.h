// What every phase of the run shares: the interrupt thrown outside the training loop, the
// data-parallel roles (who prints) and say(), stdout for rank 0. Signals are the library's
// (cumulus/runtime/stop_signal.h): the training loop stops at the next group boundary, loading, planning
// and the test pass at once; the run exits 130 (SIGINT), 143 (SIGTERM) or 141 (stdout closed).
#pragma once

#include <stdexcept>

#include "cumulus/runtime/stop_signal.h"
#include "options.h"

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

// Thrown where a phase outside the training loop (loading, planning, the test pass) notices an
// interrupt; the training loop itself stops at a group boundary without it.
struct Interrupted {};

void throw_if_interrupted();

// Test hook (tests/test_faults.cpp), not a feature: CUMULUS_FAULT_SIGNAL=<point> raises SIGINT once,
// when the run reaches that point, so a test interrupts a run at an exact place. The points:
//   micro_batch:<epoch>:<i>  just after micro-batch i (from 0) of epoch <epoch> (from 1) is trained
//   test_pass:<epoch>        before the first batch of epoch <epoch>'s test pass
void fault_signal_point(const char* kind, int epoch, int64_t index = -1);

// Data parallel (mpirun): rank 0 prints, writes the checkpoint, the weights and the metrics.
extern bool g_root;
// Set when every rank stopped at the same group boundary (a signal, agreed on): the ranks end
// together. Any other non-zero exit on one rank ends the job (MPI_Abort) instead.
extern bool g_agreed_exit;

// stdout, flushed at once: a failed write (a closed pipe, a full disk) is turned into a stop
// request, so the run still checkpoints and exits non-zero instead of dying or lying.
void say(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace fmnist
