#include "run_control.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace fmnist {

volatile std::sig_atomic_t g_signal = 0;
bool g_root = true;
bool g_agreed_exit = false;

namespace {

void on_signal(int sig) {
  g_signal = sig;
  std::signal(sig, SIG_DFL);  // a second Ctrl-C ends the process at once
}

}  // namespace

void install_signal_handlers() {
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);
  // A file-size limit (ulimit -f) would otherwise kill the process mid-write, leaving its
  // temporary file; ignored, the write fails with EFBIG and takes the ordinary error path
  // (the message names the flag and the file, the previous file stays, the temporary is removed).
  std::signal(SIGXFSZ, SIG_IGN);
}

int exit_code_for(int sig) { return sig == SIGINT ? 130 : sig == SIGTERM ? 143 : 141; }
const char* signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "stdout closed"; }

void throw_if_interrupted() {
  if (g_signal != 0) throw Interrupted{};
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

void say(const char* format, ...) {
  if (!g_root) return;
  std::va_list args;
  va_start(args, format);
  std::vfprintf(stdout, format, args);
  va_end(args);
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) g_signal = SIGPIPE;
}

}  // namespace fmnist
