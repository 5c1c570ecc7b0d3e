// A run's settings table: one row for each setting that something outside the run records or
// compares (a checkpoint, which a resume must match unless the setting is overridden; the ranks of
// a data-parallel job, which must be started alike; the memory report's "settings"), saying which
// of those use it and how its value prints for a run. `Context` is what the printers read: the
// program's configuration, and any fact known only later.
//
//   struct Config { float lr = 0.1f; int epochs = 10; };
//   const SettingsTable<Config> table({
//       {"lr", "lr", true, kCheckpoint | kMemoryReport, nullptr,
//        [](const Config& c) -> SettingText { return setting_text(c.lr); }},
//       {"epochs", "epochs", false, kRanksAgree, nullptr,
//        [](const Config& c) -> SettingText { return std::to_string(c.epochs); }}});
//   save_training_checkpoint(path, model, optimizer, state, table.recorded(config));
//   dist::check_same_settings(comm, table.named(kRanksAgree, config));
//   resume.overrides = table.parse_overrides("lr", "lr");
#pragma once

#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cumulus/core/error.h"
#include "cumulus/train/checkpoint.h"

namespace cumulus::app {

enum SettingUse : unsigned {
  kCheckpoint = 1u << 0,    // recorded in a checkpoint: a resume must match it (or override it)
  kRanksAgree = 1u << 1,    // every rank of a data-parallel job must be started with the same
  kMemoryReport = 1u << 2,  // in the memory report's settings
};

// A setting's value as text; nothing where it does not apply to the run (a step schedule's decay
// factor under a cosine schedule).
using SettingText = std::optional<std::string>;

template <class Context>
struct SettingRow {
  const char* name;  // as users name it: the flag without its dashes ("lr")
  const char* key;   // the checkpoint's metadata key, after "setting."
  bool overridable;  // a resume may change it (a hyperparameter of the update rule)
  unsigned uses;     // SettingUse bits
  // What a checkpoint written before the setting was recorded ran with (nullptr: always recorded).
  const char* before_recorded;
  SettingText (*print)(const Context&);
  const char* unit = "";  // after the value in a refusal: " (micro-batches per step)"
};

template <class Context>
class SettingsTable {
 public:
  explicit SettingsTable(std::vector<SettingRow<Context>> rows) : rows_(std::move(rows)) {}

  // The rows for `use` that apply to the run, (name, value) in the table's order.
  std::vector<std::pair<std::string, std::string>> named(SettingUse use, const Context& context) const {
    std::vector<std::pair<std::string, std::string>> out;
    for (const SettingRow<Context>& row : rows_)
      if ((row.uses & use) != 0)
        if (SettingText value = row.print(context)) out.emplace_back(row.name, std::move(*value));
    return out;
  }

  // The kCheckpoint rows that apply, as a checkpoint records and a resume compares them.
  std::vector<train::RecordedSetting> recorded(const Context& context) const {
    std::vector<train::RecordedSetting> out;
    for (const SettingRow<Context>& row : rows_)
      if ((row.uses & kCheckpoint) != 0)
        if (SettingText value = row.print(context))
          out.push_back({row.name, row.key, std::move(*value), row.overridable,
                         row.before_recorded ? SettingText(row.before_recorded) : std::nullopt, row.unit});
    return out;
  }

  // The names of the rows a resume may change.
  std::set<std::string> overridable() const {
    std::set<std::string> out;
    for (const SettingRow<Context>& row : rows_)
      if (row.overridable) out.insert(row.name);
    return out;
  }

  // "lr,--min-lr": the names listed (comma separated, with or without their dashes). A name that is
  // not overridable is an InvalidArgument naming it and `listed` (how the program lists them).
  std::set<std::string> parse_overrides(const std::string& text, const std::string& listed) const {
    const std::set<std::string> allowed = overridable();
    std::set<std::string> out;
    for (std::size_t pos = 0; !text.empty() && pos <= text.size();) {
      std::size_t comma = text.find(',', pos);
      if (comma == std::string::npos) comma = text.size();
      std::string name = text.substr(pos, comma - pos);
      if (name.rfind("--", 0) == 0) name = name.substr(2);
      if (allowed.count(name) == 0)
        throw InvalidArgument("--override '" + name +
                              "': not a setting a resumed run may change (those are: " + listed + ")");
      out.insert(name);
      pos = comma + 1;
    }
    return out;
  }

 private:
  std::vector<SettingRow<Context>> rows_;
};

}  // namespace cumulus::app
