// The accumulation schedule as data: which N an epoch gets, and the steps a run of epochs takes.
#include "cumulus/train/accumulation.h"

#include <iterator>
#include <map>


namespace cumulus::train {

int accum_steps_for_epoch(const std::map<int, int>& schedule, int epoch) {
  auto it = schedule.upper_bound(epoch);  // first entry after `epoch`; the one before applies
  return it == schedule.begin() ? 1 : std::prev(it)->second;
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
