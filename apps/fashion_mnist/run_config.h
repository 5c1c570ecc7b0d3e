// The run's configuration: the command line as given (options.cpp), resolved into a RunConfig
// (run_config.cpp), and the table of the settings a run records and compares (settings.cpp).
//
// The command line is parsed and checked with CLI11 (Note [The app as a pipeline] in main.cpp):
// each flag's value as given, checked alone and against the others. A usage error is one line and
// exit code 2 before any work. As with argparse, the last value of a repeated flag wins. The
// resolution makes every choice an enum and computes every derived value, once.
//
// Note [Run configuration]: only run_config.cpp's functions make a RunConfig; everything else receives
// a `const RunConfig&`. Each step folds what was found into a new one, never editing a live one:
// resolve_run_config (the flags), on_ranks (this rank, the ranks, its device and outputs) and
// with_plan (the planner's micro-batch, accumulation steps and levers).
//
// Note [Settings table]: the one table of the run's settings that something outside the run
// records or compares: its name (the flag without dashes), the checkpoint's metadata key, whether
// --override may change it on resume, where it is used, and how its value prints (equal floats
// give equal text). It feeds the checkpoint (Note [Resume contract] in cumulus/train/checkpoint.h), --override,
// the data-parallel agreement check and the memory report's "settings", each taking the rows
// marked for it, in the table's order.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/command_line.h"
#include "cumulus/optim/optimizer.h"
#include "common/settings_table.h"
#include "cumulus/core/device.h"
#include "cumulus/core/error.h"
#include "cumulus/core/precision.h"
#include "cumulus/nn/model.h"
#include "cumulus/plan/plan_check.h"
#include "cumulus/plan/planner.h"
#include "cumulus/train/accumulation.h"
#include "cumulus/train/checkpoint.h"

namespace fmnist {

// ---- the command line (options.cpp) ----------------------------------------------------------

// The flags whose values the run's configuration takes as they are (RunConfig derives from it too).
struct FlagValues {
  std::string data_dir;  // empty: search (locate_fashion_mnist)
  int epochs = 20;
  int64_t batch_size = 64;      // the micro-batch (of each rank)
  int64_t effective_batch = 0;  // with memory_budget: the planner picks batch_size and accum_steps;
                                // with batch_size: accum_steps = effective / (batch x ranks)
  std::string memory_budget;    // as given, for messages
  int64_t memory_budget_bytes = 0;
  bool plan_only = false;  // --plan-only: print the planner's table of candidates and exit
  float lr = 1e-3f;
  int64_t lr_step_size = 0;  // step: multiply by lr_gamma every lr_step_size steps
  float lr_gamma = 0.1f;
  int64_t warmup_steps = 0;  // cosine: linear warmup, then cosine decay to min_lr at the last step
  float min_lr = 0.0f;
  float momentum = 0.0f;
  bool nesterov = false;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // AdamW
  int zero_stage = 0;  // ZeRO stage 1: the optimizer state sharded over the ranks (same weights); 2: the gradients too
  bool zero_by_planner = false;  // --zero auto: 0 (above), 1 or 2, until with_plan() decides
  bool reduce_every_micro_batch = false;  // each micro-batch reduced across ranks, in stage 2's order
  int optimizer_bits = 32;  // the optimizer's state (AdamW's moments, SGD's momentum): f32, or 8-bit block-wise
  bool optimizer_bits_by_planner = false;  // --optimizer-bits auto: 32 (above) or 8, until with_plan() decides
  float clip_grad_norm = 0.0f;
  bool shuffle = false;
  uint64_t seed = 0;
  std::string init_path, save_path, checkpoint_path, resume_path;
  std::string memory_report_path, trace_path, memory_plot_path, metrics_path, op_profile_path;
  std::set<std::string> overrides;  // --override: settings a resumed run may change, e.g. {"lr"}
  int64_t train_limit = 0, test_limit = 0;
  int64_t eval_batch_size = 64;
  int threads = 0;  // CPU BLAS threads; 0: every core
  bool eval_only = false;
  bool quiet = false;
};

// The command line: the values above, and the choices as given (resolved by run_config.cpp).
struct CommandLine : FlagValues {
  std::string device = "auto";
  std::string model = "mlp";
  bool batch_size_given = false;
  int accum_steps = 1;
  std::string accum_schedule;  // "0:8,4:2"
  std::map<int, int> schedule;
  std::string lr_schedule = "constant";  // constant | step | cosine, per optimizer step
  std::string optimizer = "sgd";
  std::optional<float> weight_decay;  // default: 0 for SGD, 0.01 for AdamW (PyTorch's defaults)
  std::string normalize = "samples";
  std::string graphs = "auto";     // auto|on|off: CUDA graphs for the steady state (CUDA only)
  std::string recompute = "off";   // off|on|auto (the planner decides): activation checkpointing
  std::string data_on = "device";  // device|host|auto: where the dataset lives (host: staged batch by batch)
  std::string optimizer_state = "device";  // device|host|auto: where the optimizer's state lives and is updated
  std::string precision = "fp32";  // fp32|bf16|fp16|auto: the compute type of activations
  std::string kernels = "auto";    // auto|fused|generic: the MLP's training kernels (Note [Fused MLP])
};

// A usage error found after parsing (e.g. --data holds no dataset): main prints it, exit code 2.
struct UsageFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Throws UsageFailure(message) unless `ok`.
void require(bool ok, const std::string& message);
// Runs `check`; the library's refusal of what was given (cumulus::InvalidArgument) becomes a usage
// error, its message after `prefix`.
template <class Check>
void as_usage(const Check& check, const std::string& prefix = "") {
  try {
    check();
  } catch (const cumulus::InvalidArgument& e) {
    throw UsageFailure(prefix + e.what());
  }
}

struct ParseResult {
  bool proceed = false;  // false: exit with `exit_code` (0 after --help or --version)
  int exit_code = 0;
  CommandLine command_line;
};

ParseResult parse_command_line(int argc, char** argv);

// ---- the run's configuration (run_config.cpp) ------------------------------------------------

enum class ModelKind { mlp, cnn };
enum class OptimizerKind { sgd, adamw };
enum class LrScheduleKind { constant, step, cosine };
enum class GraphsChoice { automatic, on, off };
// planner: "auto" (the planner weighs it, Note [Plan levers]), until with_plan() decides.
enum class RecomputeChoice { off, on, planner };
enum class DataOnChoice { device, host, planner };
// Where the micro-batch and the accumulation steps come from.
enum class BatchSource {
  flags,    // --batch-size with --accum-steps or --accum-schedule
  elastic,  // --effective-batch with --batch-size: accumulation steps = effective / (batch x ranks)
  planner,  // --effective-batch without --batch-size: the planner picks both
};

// Each choice flag's table (cumulus::FlagChoices): the flag, the noun of its "unknown" message where
// it has one, and its values in the order messages list them.
using cumulus::app::FlagChoices;
inline const FlagChoices<ModelKind>& choices_of(ModelKind) {
  static const FlagChoices<ModelKind> c{"--model", "model", {{"mlp", ModelKind::mlp}, {"cnn", ModelKind::cnn}}};
  return c;
}
inline const FlagChoices<OptimizerKind>& choices_of(OptimizerKind) {
  static const FlagChoices<OptimizerKind> c{
      "--optimizer", nullptr, {{"sgd", OptimizerKind::sgd}, {"adamw", OptimizerKind::adamw}}};
  return c;
}
inline const FlagChoices<LrScheduleKind>& choices_of(LrScheduleKind) {
  static const FlagChoices<LrScheduleKind> c{
      "--lr-schedule",
      nullptr,
      {{"constant", LrScheduleKind::constant}, {"step", LrScheduleKind::step}, {"cosine", LrScheduleKind::cosine}}};
  return c;
}
inline const FlagChoices<GraphsChoice>& choices_of(GraphsChoice) {
  static const FlagChoices<GraphsChoice> c{
      "--graphs", nullptr, {{"auto", GraphsChoice::automatic}, {"on", GraphsChoice::on}, {"off", GraphsChoice::off}}};
  return c;
}
inline const FlagChoices<RecomputeChoice>& choices_of(RecomputeChoice) {
  static const FlagChoices<RecomputeChoice> c{
      "--recompute",
      nullptr,
      {{"off", RecomputeChoice::off}, {"on", RecomputeChoice::on}, {"auto", RecomputeChoice::planner}}};
  return c;
}
inline const FlagChoices<cumulus::optim::StatePlacement>& choices_of(cumulus::optim::StatePlacement) {
  using cumulus::optim::StatePlacement;
  static const FlagChoices<StatePlacement> c{
      "--optimizer-state", nullptr, {{"device", StatePlacement::device}, {"host", StatePlacement::host}}};
  return c;
}
inline const FlagChoices<DataOnChoice>& choices_of(DataOnChoice) {
  static const FlagChoices<DataOnChoice> c{
      "--data-on",
      nullptr,
      {{"device", DataOnChoice::device}, {"host", DataOnChoice::host}, {"auto", DataOnChoice::planner}}};
  return c;
}
inline const FlagChoices<cumulus::Precision>& choices_of(cumulus::Precision) {
  using cumulus::Precision;
  static const FlagChoices<Precision> c{
      "--precision", nullptr, {{"fp32", Precision::fp32}, {"bf16", Precision::bf16}, {"fp16", Precision::fp16}}};
  return c;
}
inline const FlagChoices<cumulus::nn::KernelChoice>& choices_of(cumulus::nn::KernelChoice) {
  using cumulus::nn::KernelChoice;
  static const FlagChoices<KernelChoice> c{
      "--kernels",
      nullptr,
      {{"auto", KernelChoice::automatic}, {"fused", KernelChoice::fused}, {"generic", KernelChoice::generic}}};
  return c;
}
inline const FlagChoices<cumulus::train::Normalization>& choices_of(cumulus::train::Normalization) {
  using cumulus::train::Normalization;
  static const FlagChoices<Normalization> c{
      "--normalize", nullptr, {{"samples", Normalization::units}, {"micro-batches", Normalization::micro_batches}}};
  return c;
}

// A choice's flag value as the enum; a UsageFailure naming the flag and the values it takes.
template <class E>
E parse_choice(const std::string& text) {
  E value{};
  as_usage([&] { value = choices_of(E{}).parse(text); });
  return value;
}
// The flag value that names `value`: "mlp", "micro-batches", "auto".
template <class E>
const char* choice_name(E value) {
  return choices_of(value).name(value);
}

struct RunConfig : FlagValues {
  // What runs where, and how.
  cumulus::Device device;
  bool one_gpu_per_rank = false;  // --device auto or cuda: under mpirun each rank of a node takes its own GPU
  ModelKind model = ModelKind::mlp;
  cumulus::Precision precision = cumulus::Precision::fp32;
  bool precision_by_planner = false;  // --precision auto: fp32 (above) or bf16, until with_plan() decides
  cumulus::nn::KernelChoice kernels = cumulus::nn::KernelChoice::automatic;
  RecomputeChoice recompute = RecomputeChoice::off;
  DataOnChoice data_on = DataOnChoice::device;  // planner only on CUDA (the CPU's device is the host)
  cumulus::optim::StatePlacement optimizer_state = cumulus::optim::StatePlacement::device;
  bool optimizer_state_by_planner = false;  // --optimizer-state auto: device (above) or host, until with_plan()
  uint32_t recompute_segments = 0;              // the planner's choice of the model's segments (--recompute auto)
  GraphsChoice graphs = GraphsChoice::automatic;
  bool use_graphs = false;  // from `graphs`, the device and the number of ranks

  // The batch: micro-batch x accumulation steps (x ranks) = effective batch.
  BatchSource batch_source = BatchSource::flags;
  std::map<int, int> accum_schedule = {{0, 1}};  // epoch -> micro-batches per step of each rank; from epoch 0
  bool accum_scheduled = false;                  // given as --accum-schedule (recorded as a schedule)
  // The planner's prediction for the chosen plan (with_plan); none when the planner did not choose
  // it. The tracker is given it (its report's "planner" object); the training loop measures it
  // against the first full epoch this run trains.
  std::optional<cumulus::plan::PlanCheck> plan_check;

  // The optimizer and its learning-rate schedule.
  OptimizerKind optimizer = OptimizerKind::sgd;
  LrScheduleKind lr_schedule = LrScheduleKind::constant;
  float weight_decay = 0.0f;  // --weight-decay, else PyTorch's default for the optimizer
  cumulus::train::Normalization normalization = cumulus::train::Normalization::units;

  // Data parallel (mpirun). The output paths (FlagValues) are this rank's (Note [Run configuration]).
  int rank = 0, world_size = 1;
  bool gathers_checkpoint = false;  // --zero 1 --checkpoint: every rank sends rank 0 its optimizer shard

  // Micro-batches per optimizer step of each rank in `epoch`, and of all ranks together by epoch.
  int accum_steps_at(int epoch) const;
  std::map<int, int> accum_schedule_all_ranks() const;
};

// The command line resolved for one process. Throws UsageFailure naming the flag.
RunConfig resolve_run_config(const CommandLine& command_line);

// What the data-parallel setup found (place_on_ranks, run_control.h).
struct RankPlacement {
  int rank = 0, world_size = 1;
  cumulus::Device device;  // this rank's
};

// `config` on this rank: its device, rank and number of ranks; no CUDA graphs with several ranks;
// --effective-batch with --batch-size as accumulation steps (UsageFailure unless the ranks' micro-
// batches divide it); rank 0 writes the checkpoint, the weights and the metrics, every rank its own
// memory report, trace and plot ("memory.json" -> "memory.rank1.json").
RunConfig on_ranks(const RunConfig& config, const RankPlacement& placement);

// What the planner chose (plan_batch, training.h).
struct BatchPlan {
  int64_t micro_batch = 0;
  int accum_steps = 0;
  cumulus::plan::PlanSetting setting;  // its levers (recompute segments, data placement, precision)
  std::string setting_text;      // the same as plan_setting_text() names it
  // The chosen row's prediction, compared with the first epoch's measurement (training_loop.cpp).
  double predicted_epoch_seconds = 0.0;
  int64_t predicted_peak_bytes = 0;
};

RunConfig with_plan(const RunConfig& config, const BatchPlan& plan);

// ---- the settings table (settings.cpp) -------------------------------------------------------

// What a printer may read besides the configuration: facts known only once the model is made.
struct SettingContext {
  const RunConfig& o;
  std::string kernels;  // the memory report's "kernels": fused or generic
};

// The table (apps/common/settings_table.h), and its overridable names as the help and the error
// of a wrong --override list them.
const cumulus::app::SettingsTable<SettingContext>& settings_table();
const std::string& overridable_settings_text();

}  // namespace fmnist
