#include "run_control.h"

#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace fmnist {

bool g_root = true;
bool g_agreed_exit = false;

void throw_if_interrupted() {
  if (cumulus::stop_requested()) throw Interrupted{};
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
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) cumulus::request_stop(SIGPIPE);
}

}  // namespace fmnist
