#include "run_config.h"

namespace fmnist {
namespace {

struct SettingRow {
  const char* name;  // the flag without its dashes: what --override, the ranks' check and the report say
  const char* key;   // the checkpoint's metadata key, after "setting."
  bool overridable;  // --override may change it on resume (a hyperparameter of the update rule)
  unsigned uses;     // SettingUse bits
  // What a checkpoint written before the setting was recorded ran with (nullptr: always recorded).
  const char* before_recorded;
  // The value as text; nothing where the setting does not apply to this run (lr-gamma without
  // the step schedule, world-size with one rank).
  std::optional<std::string> (*print)(const SettingContext&);
};

struct SettingValue {
  const SettingRow* row;
  std::string value;
};

using Text = std::optional<std::string>;
using C = const SettingContext&;

using cumulus::optim::setting_text;  // floats: equal values, equal text

std::string bool_text(bool b) { return b ? "true" : "false"; }

// Accumulation is recorded as micro-batches per step, all ranks together: a checkpoint written by
// 4 ranks of 16 x 1 resumes on 2 ranks of 16 x 2 or 1 of 16 x 4 (the same global groups).
std::string accum_text(const RunConfig& o) {
  if (!o.accum_scheduled) return std::to_string(o.accum_steps_at(0) * o.world_size);
  return cumulus::optim::accum_schedule_text(o.accum_schedule_all_ranks());
}

Text when(bool applies, std::string value) { return applies ? Text(std::move(value)) : std::nullopt; }

constexpr unsigned kRecorded = kCheckpoint | kRanksAgree | kMemoryReport;

// Every setting that changes the result of a run is recorded (Note [Resume contract] in
// cumulus/runtime/checkpoint.h); the ranks also agree on what they train and where; the memory report adds how.
const std::vector<SettingRow> kTable = {
    {"model", "model", false, kRecorded, nullptr, [](C c) -> Text { return choice_name(c.o.model); }},
    {"optimizer", "optimizer", false, kRecorded, nullptr, [](C c) -> Text { return choice_name(c.o.optimizer); }},
    {"batch-size", "micro_batch_size", false, kRecorded, nullptr,
     [](C c) -> Text { return std::to_string(c.o.batch_size); }},
    {"accum-steps", "accum_steps", false, kRecorded, nullptr, [](C c) -> Text { return accum_text(c.o); }},
    {"normalize", "normalize", false, kRecorded, nullptr, [](C c) -> Text { return choice_name(c.o.normalization); }},
    {"precision", "precision", false, kRecorded, "fp32", [](C c) -> Text { return choice_name(c.o.precision); }},
    {"shuffle", "shuffle", false, kRecorded, nullptr, [](C c) -> Text { return bool_text(c.o.shuffle); }},
    {"seed", "seed", false, kRecorded, nullptr, [](C c) -> Text { return std::to_string(c.o.seed); }},
    {"train-limit", "train_limit", false, kRecorded, nullptr,
     [](C c) -> Text { return std::to_string(c.o.train_limit); }},
    // The momentum buffer exists only with momentum: changing it would drop or invent state.
    {"momentum", "momentum", false, kRecorded, nullptr, [](C c) -> Text { return setting_text(c.o.momentum); }},
    {"lr", "lr", true, kRecorded, nullptr, [](C c) -> Text { return setting_text(c.o.lr); }},
    {"lr-schedule", "lr_schedule", true, kRecorded, nullptr, [](C c) -> Text { return choice_name(c.o.lr_schedule); }},
    {"weight-decay", "weight_decay", true, kRecorded, nullptr,
     [](C c) -> Text { return setting_text(c.o.weight_decay); }},
    {"clip-grad-norm", "clip_grad_norm", true, kRecorded, nullptr,
     [](C c) -> Text { return setting_text(c.o.clip_grad_norm); }},
    {"lr-step-size", "lr_step_size", true, kRecorded, nullptr,
     [](C c) { return when(c.o.lr_schedule == LrScheduleKind::step, std::to_string(c.o.lr_step_size)); }},
    {"lr-gamma", "lr_gamma", true, kRecorded, nullptr,
     [](C c) { return when(c.o.lr_schedule == LrScheduleKind::step, setting_text(c.o.lr_gamma)); }},
    {"warmup-steps", "warmup_steps", true, kRecorded, nullptr,
     [](C c) { return when(c.o.lr_schedule == LrScheduleKind::cosine, std::to_string(c.o.warmup_steps)); }},
    {"min-lr", "min_lr", true, kRecorded, nullptr,
     [](C c) { return when(c.o.lr_schedule == LrScheduleKind::cosine, setting_text(c.o.min_lr)); }},
    // The cosine decays to the run's last step, which --epochs sets.
    {"epochs", "epochs", false, kRecorded, nullptr,
     [](C c) { return when(c.o.lr_schedule == LrScheduleKind::cosine, std::to_string(c.o.epochs)); }},
    {"betas", "betas", true, kRecorded, nullptr,
     [](C c) {
       return when(c.o.optimizer == OptimizerKind::adamw, setting_text(c.o.beta1) + "," + setting_text(c.o.beta2));
     }},
    {"eps", "eps", true, kRecorded, nullptr,
     [](C c) { return when(c.o.optimizer == OptimizerKind::adamw, setting_text(c.o.eps)); }},
    {"nesterov", "nesterov", true, kRecorded, nullptr,
     [](C c) { return when(c.o.optimizer != OptimizerKind::adamw, bool_text(c.o.nesterov)); }},
    // What every rank of a job must also agree on.
    {"epochs", "epochs", false, kRanksAgree, nullptr, [](C c) -> Text { return std::to_string(c.o.epochs); }},
    {"init", "init", false, kRanksAgree, nullptr, [](C c) -> Text { return c.o.init_path; }},
    {"resume", "resume", false, kRanksAgree, nullptr, [](C c) -> Text { return c.o.resume_path; }},
    {"eval-only", "eval_only", false, kRanksAgree, nullptr, [](C c) -> Text { return bool_text(c.o.eval_only); }},
    {"device", "device", false, kRanksAgree, nullptr,
     [](C c) -> Text { return c.o.device.is_cuda() ? "cuda" : "cpu"; }},
    // How the memory report's run went.
    {"recompute", "recompute", false, kMemoryReport, nullptr, [](C c) -> Text { return choice_name(c.o.recompute); }},
    {"kernels", "kernels", false, kMemoryReport, nullptr, [](C c) -> Text { return c.kernels; }},
    {"data-on", "data_on", false, kMemoryReport, nullptr, [](C c) -> Text { return choice_name(c.o.data_on); }},
    {"world-size", "world_size", false, kMemoryReport, nullptr,
     [](C c) { return when(c.o.world_size > 1, std::to_string(c.o.world_size)); }},
    {"rank", "rank", false, kMemoryReport, nullptr,
     [](C c) { return when(c.o.world_size > 1, std::to_string(c.o.rank)); }},
    {"epochs", "epochs", false, kMemoryReport, nullptr,  // where the recorded settings lack it
     [](C c) { return when(c.o.lr_schedule != LrScheduleKind::cosine, std::to_string(c.o.epochs)); }},
};

// As --help and the error of a wrong --override list them: the schedule's settings after
// --lr-schedule. tests/test_run_config.cpp checks it against the table.
const char* const kOverridableText =
    "lr, lr-schedule, lr-step-size, lr-gamma, warmup-steps, min-lr, weight-decay, clip-grad-norm, betas, eps, "
    "nesterov";

// The rows for `use` that apply to this run, with their values, in the table's order.
std::vector<SettingValue> settings_for(SettingUse use, const SettingContext& context) {
  std::vector<SettingValue> out;
  for (const SettingRow& row : kTable)
    if ((row.uses & use) != 0)
      if (std::optional<std::string> value = row.print(context)) out.push_back({&row, std::move(*value)});
  return out;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> named_settings(SettingUse use, const SettingContext& context) {
  std::vector<std::pair<std::string, std::string>> out;
  for (SettingValue& s : settings_for(use, context)) out.emplace_back(s.row->name, std::move(s.value));
  return out;
}

std::vector<cumulus::optim::RecordedSetting> checkpoint_settings(const RunConfig& o) {
  std::vector<cumulus::optim::RecordedSetting> out;
  for (SettingValue& s : settings_for(kCheckpoint, {o, ""})) {
    const SettingRow& row = *s.row;
    out.push_back({row.name, row.key, std::move(s.value), row.overridable,
                   row.before_recorded ? std::optional<std::string>(row.before_recorded) : std::nullopt,
                   std::string(row.name) == "accum-steps" ? " (micro-batches per step, all ranks together)" : ""});
  }
  return out;
}

const std::set<std::string>& overridable_settings() {
  // The hyperparameters of the update rule: changing them changes the result from here on, but the
  // checkpoint's state still means the same thing. Structural settings (model, optimizer, batch,
  // accumulation, data order, momentum buffer) are never overridable.
  static const std::set<std::string> names = [] {
    std::set<std::string> out;
    for (const SettingRow& row : kTable)
      if (row.overridable) out.insert(row.name);
    return out;
  }();
  return names;
}

const std::string& overridable_settings_text() {
  static const std::string text = kOverridableText;
  return text;
}

}  // namespace fmnist
