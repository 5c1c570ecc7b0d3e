// Stopping a training run cleanly on SIGINT (Ctrl-C) or SIGTERM: the handlers only record the
// signal; the loop asks stop_requested() at a group boundary (EpochOptions::stop), writes its
// checkpoint and exits with exit_code_for_stop(): 130, 143, or 141 for a closed standard output.
//
//   install_stop_handlers();
//   ignore_write_signals();                                    // optional: EPIPE instead of death
//   options.stop = [](int64_t) { return stop_requested(); };   // or stop_requested_on_any_rank(comm)
//   ... after the epoch stopped: save the checkpoint, return exit_code_for_stop(stop_signal());
#pragma once

#include <csignal>
#include <cstdint>

namespace cumulus::dist {
class Communicator;
}  // namespace cumulus::dist

namespace cumulus::app {

// SIGINT and SIGTERM record the signal (a second one ends the process at once).
void install_stop_handlers();
// SIGPIPE and SIGXFSZ ignored: a closed pipe or a file-size limit fails the write (EPIPE, EFBIG)
// instead of killing the process mid-write, so a run can still checkpoint (request_stop(SIGPIPE)
// where standard output is gone).
void ignore_write_signals();
// The signal that asked for a stop (SIGINT, SIGTERM, SIGPIPE), 0 when none did.
int stop_signal();
bool stop_requested();
// Asks for a stop as if `signal` had arrived (a failed write to stdout: SIGPIPE). Async-signal-safe.
void request_stop(int signal);
// 130 for SIGINT, 143 for SIGTERM, 141 otherwise (SIGPIPE): the shell's 128 + signal.
int exit_code_for_stop(int signal);
// "SIGINT", "SIGTERM", "stdout closed".
const char* stop_signal_name(int signal);

// Thrown where work between a loop's group boundaries (loading, planning, a test pass) notices a
// stop: it ends at once, with no new state to checkpoint.
struct Interrupted {};
void throw_if_interrupted();  // throws Interrupted when a stop was requested

// Test hook, not a feature: CUMULUS_FAULT_SIGNAL=<point> raises SIGINT once, when the program
// reaches that point, so that a test interrupts a run at an exact place. A point is
// "<kind>:<epoch>" or "<kind>:<epoch>:<index>" ("micro_batch:2:5"), as the program names them.
void fault_signal_point(const char* kind, int epoch, int64_t index = -1);

// Data parallel: whether any rank was asked to stop (a collective: every rank calls it at the same
// group boundary). A rank stopped by another's signal records SIGTERM, so every rank stops.
bool stop_requested_on_any_rank(dist::Communicator& comm);

}  // namespace cumulus::app
