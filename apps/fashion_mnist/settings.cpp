#include "run_config.h"

namespace fmnist {
namespace {

using cumulus::app::kCheckpoint;
using cumulus::app::kMemoryReport;
using cumulus::app::kRanksAgree;
using Text = cumulus::app::SettingText;
using C = const SettingContext&;

using cumulus::train::setting_text;  // floats: equal values, equal text

std::string bool_text(bool b) { return b ? "true" : "false"; }

// Accumulation is recorded as micro-batches per step, all ranks together: a checkpoint written by
// 4 ranks of 16 x 1 resumes on 2 ranks of 16 x 2 or 1 of 16 x 4 (the same global groups).
std::string accum_text(const RunConfig& o) {
  if (!o.accum_scheduled) return std::to_string(o.accum_steps_at(0) * o.world_size);
  return cumulus::app::accum_schedule_text(o.accum_schedule_all_ranks());
}

Text when(bool applies, std::string value) { return applies ? Text(std::move(value)) : std::nullopt; }

constexpr unsigned kRecorded = kCheckpoint | kRanksAgree | kMemoryReport;

// Every setting that changes the result of a run is recorded (Note [Resume contract] in
// cumulus/train/checkpoint.h); the ranks also agree on what they train and where; the memory report adds how.
const std::vector<cumulus::app::SettingRow<SettingContext>> kTable = {
    {"model", "model", false, kRecorded, nullptr, [](C c) -> Text { return choice_name(c.o.model); }},
    {"optimizer", "optimizer", false, kRecorded, nullptr, [](C c) -> Text { return choice_name(c.o.optimizer); }},
    {"batch-size", "micro_batch_size", false, kRecorded, nullptr,
     [](C c) -> Text { return std::to_string(c.o.batch_size); }},
    {"accum-steps", "accum_steps", false, kRecorded, nullptr, [](C c) -> Text { return accum_text(c.o); },
     " (micro-batches per step, all ranks together)"},
    {"normalize", "normalize", false, kRecorded, nullptr, [](C c) -> Text { return choice_name(c.o.normalization); }},
    {"precision", "precision", false, kRecorded, "fp32", [](C c) -> Text { return choice_name(c.o.precision); }},
    {"shuffle", "shuffle", false, kRecorded, nullptr, [](C c) -> Text { return bool_text(c.o.shuffle); }},
    {"seed", "seed", false, kRecorded, nullptr, [](C c) -> Text { return std::to_string(c.o.seed); }},
    {"train-limit", "train_limit", false, kRecorded, nullptr,
     [](C c) -> Text { return std::to_string(c.o.train_limit); }},
    // The momentum buffer exists only with momentum: changing it would drop or invent state.
    {"momentum", "momentum", false, kRecorded, nullptr, [](C c) -> Text { return setting_text(c.o.momentum); }},
    // The state's arrays differ in type and length between the two.
    {"optimizer-bits", "optimizer_bits", false, kRecorded, "32",
     [](C c) -> Text { return std::to_string(c.o.optimizer_bits); }},
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
    {"optimizer-state", "optimizer_state", false, kMemoryReport, "device",
     [](C c) -> Text { return choice_name(c.o.optimizer_state); }},
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

}  // namespace

const cumulus::app::SettingsTable<SettingContext>& settings_table() {
  static const cumulus::app::SettingsTable<SettingContext> table(kTable);
  return table;
}

const std::string& overridable_settings_text() {
  static const std::string text = kOverridableText;
  return text;
}

}  // namespace fmnist
