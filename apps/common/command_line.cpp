#include "common/command_line.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "cumulus/core/device.h"
#include "cumulus/core/threads.h"
#include "cumulus/dist/communicator.h"
#include "cumulus/version.h"

// Set for this file by the root CMakeLists.txt when it is configured.
#ifndef CUMULUS_GIT_COMMIT
#define CUMULUS_GIT_COMMIT "unknown"
#endif
#ifndef CUMULUS_BUILD_TYPE
#define CUMULUS_BUILD_TYPE "unknown"
#endif

namespace cumulus::app {

std::string integer_text_problem(const std::string& text, int64_t lo, int64_t hi) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  const bool digits =
      !text.empty() && end == text.c_str() + text.size() && text.find_first_not_of("+-0123456789") == std::string::npos;
  if (digits && errno != ERANGE && v >= lo && v <= hi) return "";
  return "expected an integer from " + std::to_string(lo) + " to " + std::to_string(hi) + ", got '" + text + "'";
}

std::string unsigned_64_text_problem(const std::string& text) {
  errno = 0;
  std::strtoull(text.c_str(), nullptr, 10);
  if (!text.empty() && text.find_first_not_of("0123456789") == std::string::npos && errno != ERANGE) return "";
  return "expected an integer from 0 to 18446744073709551615, got '" + text + "'";
}

int help_columns() {
  winsize ws{};
  if (::isatty(STDOUT_FILENO) && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 40) return ws.ws_col;
  if (const char* c = std::getenv("COLUMNS")) {
    const int n = std::atoi(c);
    if (n >= 40) return n;
  }
  return 100;
}

std::string wrap_help_text(const std::string& help, int width, std::size_t description_column) {
  std::string out;
  std::size_t pos = 0;
  while (pos < help.size()) {
    std::size_t eol = help.find('\n', pos);
    if (eol == std::string::npos) eol = help.size();
    std::string line = help.substr(pos, eol - pos);
    pos = eol + 1;
    const bool option_line =
        line.size() > description_column && line.rfind("  -", 0) == 0 && line[description_column - 1] == ' ';
    // An option's description continues at its column, also when it starts on a line of its own
    // (after a long option name); other text keeps its own indentation, at most 20 columns.
    const std::size_t leading = line.find_first_not_of(' ');
    const std::size_t indent = option_line || (leading != std::string::npos && leading >= description_column)
                                   ? description_column
                                   : std::min<std::size_t>(leading, 20);
    while (static_cast<int>(line.size()) > width) {
      std::size_t cut = line.rfind(' ', static_cast<std::size_t>(width));
      if (cut == std::string::npos || cut <= indent) cut = line.find(' ', static_cast<std::size_t>(width));
      if (cut == std::string::npos) break;
      out += line.substr(0, cut) + "\n";
      const std::size_t next = line.find_first_not_of(' ', cut);
      line = next == std::string::npos ? std::string() : std::string(indent, ' ') + line.substr(next);
    }
    out += line + "\n";
  }
  return out;
}

Device device_from_flag(const std::string& text) {
  if (text == "auto") return cuda_available() ? Device::cuda(0) : Device::cpu();
  const Device device = Device::parse(text);
  check_device_available(device);
  return device;
}

OptimizerStateHelp optimizer_state_help(const std::string& state, const std::string& eager_note) {
  OptimizerStateHelp help;
  help.bits = "32|8|auto: " + state +
              " in 32-bit floats or in 8 bits (block-wise quantized, a scale per 64 values: 26.6% of the fp32 "
              "bytes). auto, with the planner (--effective-batch): 8 only when no plan fits in 32 (an opt-in: 8 "
              "bits change the numbers)";
  help.placement = "device|host|auto: where " + state +
                   " live and their update runs. host: in host memory of their own (pinned on a GPU), outside "
                   "the device's memory and --memory-budget, updated there with the CPU kernels on copies of the "
                   "weights and gradients (the same weights as device; on a GPU they cross the bus each step" +
                   eager_note + "). auto, with the planner: host only when no plan fits with them on the device or "
                   "in 8 bits";
  help.zero = "Under mpirun: 1 shards " + state +
              " over the ranks (ZeRO stage 1: each rank keeps and updates 1/N of them, the same weights as 0); 2 "
              "also shards the gradients (stage 2: each micro-batch's gradients are reduce-scattered as backward "
              "finishes them, each rank keeping 1/N; the weights agree with 0's to float rounding; on CUDA not yet "
              "run on a GPU, and auto weighs it on the CPU only); 0 "
              "keeps all of them on every rank";
  return help;
}

std::string version_text(const std::string& program) {
  std::string s = program + " (cumulus) " + CUMULUS_VERSION + "\ncommit " + CUMULUS_GIT_COMMIT + ", build type " +
                  CUMULUS_BUILD_TYPE + "\n";
  s += std::string("CUDA: ") + (cuda_compiled() ? "compiled" : "not compiled");
#ifdef CUMULUS_WITH_CUDNN
  s += ", cuDNN: compiled";
#else
  s += ", cuDNN: not compiled";
#endif
  return s + ", " + dist::transports_text() + "\nCPU: " + cpu_capability() + " kernels, OpenBLAS " + blas_core() +
         " kernels\n";
}

std::map<int, int> parse_accum_schedule(const std::string& text) {
  std::map<int, int> out;
  auto bad = [&](const std::string& why) {
    return InvalidArgument("'" + text + "': " + why + " (expected EPOCH:STEPS,... starting at 0, e.g. 0:8,4:2)");
  };
  for (std::size_t pos = 0; pos <= text.size();) {
    const std::size_t comma = text.find(',', pos);
    const std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    const std::size_t colon = item.find(':');
    if (colon == std::string::npos) throw bad("'" + item + "' has no ':'");
    char* end = nullptr;
    const long epoch = std::strtol(item.c_str(), &end, 10);
    if (end != item.c_str() + colon || epoch < 0 || epoch > 1000000) throw bad("bad epoch in '" + item + "'");
    const char* steps_text = item.c_str() + colon + 1;
    const long steps = std::strtol(steps_text, &end, 10);
    if (*steps_text == '\0' || *end != '\0' || steps <= 0 || steps > 1000000) throw bad("bad steps in '" + item + "'");
    if (!out.emplace(static_cast<int>(epoch), static_cast<int>(steps)).second)
      throw bad("epoch " + std::to_string(epoch) + " given twice");
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (out.empty() || out.begin()->first != 0) throw bad("the schedule must start at epoch 0");
  return out;
}

std::string accum_schedule_text(const std::map<int, int>& schedule) {
  std::string text;
  for (const auto& [epoch, steps] : schedule)
    text += (text.empty() ? "" : ",") + std::to_string(epoch) + ":" + std::to_string(steps);
  return text;
}

}  // namespace cumulus::app
