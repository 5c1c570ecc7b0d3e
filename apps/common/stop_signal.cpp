#include "common/stop_signal.h"

#include <cstdlib>
#include <string>

#include "cumulus/dist/communicator.h"

namespace cumulus::app {
namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int signal) {
  g_stop_signal = signal;
  std::signal(signal, SIG_DFL);  // a second Ctrl-C ends the process at once
}

}  // namespace

void install_stop_handlers() {
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
}

void ignore_write_signals() {
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGXFSZ, SIG_IGN);
}

int stop_signal() { return g_stop_signal; }
bool stop_requested() { return g_stop_signal != 0; }
void request_stop(int signal) { g_stop_signal = signal; }

int exit_code_for_stop(int signal) { return signal == SIGINT ? 130 : signal == SIGTERM ? 143 : 141; }

const char* stop_signal_name(int signal) {
  return signal == SIGINT ? "SIGINT" : signal == SIGTERM ? "SIGTERM" : "stdout closed";
}

void throw_if_interrupted() {
  if (stop_requested()) throw Interrupted{};
}

void fault_signal_point(const char* kind, int epoch, int64_t index) {
  static bool raised = false;
  const char* want = std::getenv("CUMULUS_FAULT_SIGNAL");
  if (want == nullptr || raised) return;
  std::string here = std::string(kind) + ":" + std::to_string(epoch);
  if (index >= 0) here += ":" + std::to_string(index);
  if (here != want) return;
  raised = true;
  std::raise(SIGINT);
}

bool stop_requested_on_any_rank(dist::Communicator& comm) {
  if (comm.world_size() == 1) return stop_requested();
  if (!comm.any(stop_requested())) return false;
  if (!stop_requested()) request_stop(SIGTERM);
  return true;
}

}  // namespace cumulus::app
