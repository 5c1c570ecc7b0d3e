// The accumulation schedule as data: which N an epoch gets, and its text form for a command line.
#include "cumulus/train/accumulation.h"

#include <cstdlib>
#include <iterator>
#include <map>
#include <string>

#include "cumulus/core/error.h"

namespace cumulus::train {

int accum_steps_for_epoch(const std::map<int, int>& schedule, int epoch) {
  auto it = schedule.upper_bound(epoch);  // first entry after `epoch`; the one before applies
  return it == schedule.begin() ? 1 : std::prev(it)->second;
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

int64_t optimizer_steps_in_epochs(const std::map<int, int>& schedule, int64_t micro_batches, int epochs) {
  int64_t steps = 0;
  for (int e = 0; e < epochs; ++e) {
    const int n = accum_steps_for_epoch(schedule, e);
    steps += (micro_batches + n - 1) / n;
  }
  return steps;
}

}  // namespace cumulus::train
