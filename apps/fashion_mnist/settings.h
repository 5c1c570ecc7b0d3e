// Note [Settings table]: the one table of the run's settings that something outside the run
// records or compares: its name (the flag without dashes), the checkpoint's metadata key, whether
// --override may change it on resume, where it is used, and how its value prints (equal floats
// give equal text). It feeds the checkpoint (Note [Resume contract] in cumulus/runtime/checkpoint.h), --override,
// the data-parallel agreement check and the memory report's "settings", each taking the rows
// marked for it, in the table's order.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cumulus/runtime/checkpoint.h"
#include "run_config.h"

namespace fmnist {

enum SettingUse : unsigned {
  kCheckpoint = 1u << 0,    // recorded in a checkpoint: a resume must match it (or --override it)
  kRanksAgree = 1u << 1,    // every rank of a data-parallel job must be started with the same
  kMemoryReport = 1u << 2,  // in the memory report's settings
};

// What a printer may read besides the configuration: facts known only once the model is made.
struct SettingContext {
  const RunConfig& o;
  std::string kernels;  // the memory report's "kernels": fused or generic
};

// The rows for `use` that apply to this run, (name, value) in the table's order.
std::vector<std::pair<std::string, std::string>> named_settings(SettingUse use, const SettingContext& context);

// The kCheckpoint rows as the library's checkpoint records and compares them.
std::vector<cumulus::optim::RecordedSetting> checkpoint_settings(const RunConfig& o);

// The names --override accepts, and them as the help and the error list them.
const std::set<std::string>& overridable_settings();
const std::string& overridable_settings_text();

}  // namespace fmnist
