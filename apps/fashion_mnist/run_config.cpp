#include "run_config.h"

#include <initializer_list>
#include <stdexcept>
#include <utility>

#include "cumulus/core/error.h"
#include "cumulus/runtime/command_line.h"
#include "cumulus/runtime/run_files.h"

using namespace cumulus;

namespace fmnist {
namespace {

// Each choice's flag, the values it takes (in the order messages list them), and the noun of its
// "unknown" message where it has one.
template <class E>
struct Choices {
  const char* flag;
  const char* noun;  // "--model 'x': unknown model (expected ...)"; nullptr: "--optimizer 'x': expected ..."
  std::initializer_list<std::pair<const char*, E>> values;
};

template <class E>
extern const Choices<E> kChoices;

template <>
const Choices<ModelKind> kChoices<ModelKind>{"--model", "model", {{"mlp", ModelKind::mlp}, {"cnn", ModelKind::cnn}}};
template <>
const Choices<OptimizerKind> kChoices<OptimizerKind>{
    "--optimizer", nullptr, {{"sgd", OptimizerKind::sgd}, {"adamw", OptimizerKind::adamw}}};
template <>
const Choices<LrScheduleKind> kChoices<LrScheduleKind>{
    "--lr-schedule",
    nullptr,
    {{"constant", LrScheduleKind::constant}, {"step", LrScheduleKind::step}, {"cosine", LrScheduleKind::cosine}}};
template <>
const Choices<GraphsChoice> kChoices<GraphsChoice>{
    "--graphs", nullptr, {{"auto", GraphsChoice::automatic}, {"on", GraphsChoice::on}, {"off", GraphsChoice::off}}};
template <>
const Choices<RecomputeChoice> kChoices<RecomputeChoice>{
    "--recompute",
    nullptr,
    {{"off", RecomputeChoice::off}, {"on", RecomputeChoice::on}, {"auto", RecomputeChoice::planner}}};
template <>
const Choices<DataOnChoice> kChoices<DataOnChoice>{
    "--data-on",
    nullptr,
    {{"device", DataOnChoice::device}, {"host", DataOnChoice::host}, {"auto", DataOnChoice::planner}}};
template <>
const Choices<Precision> kChoices<Precision>{
    "--precision", nullptr, {{"fp32", Precision::fp32}, {"bf16", Precision::bf16}, {"fp16", Precision::fp16}}};
template <>
const Choices<nn::KernelChoice> kChoices<nn::KernelChoice>{"--kernels",
                                                           nullptr,
                                                           {{"auto", nn::KernelChoice::automatic},
                                                            {"fused", nn::KernelChoice::fused},
                                                            {"generic", nn::KernelChoice::generic}}};
template <>
const Choices<optim::Normalization> kChoices<optim::Normalization>{
    "--normalize",
    nullptr,
    {{"samples", optim::Normalization::units}, {"micro-batches", optim::Normalization::micro_batches}}};

// "a or b", "a, b or c".
template <class E>
std::string listed(const Choices<E>& c) {
  std::string out;
  std::size_t i = 0;
  for (const auto& [name, value] : c.values) {
    out += (i == 0 ? "" : i + 1 == c.values.size() ? " or " : ", ") + std::string(name);
    ++i;
  }
  return out;
}

// The device, the precision and the kernels, and whether they go together.
void resolve_device(const CommandLine& cli, RunConfig& c) {
  try {
    c.device = device_from_flag(cli.device);
  } catch (const Error& e) {
    throw UsageFailure("--device: " + std::string(e.what()));
  }
  c.one_gpu_per_rank = cli.device == "auto" || cli.device == "cuda";
  require(!needs_loss_scaling(c.precision) || c.normalization == optim::Normalization::units,
          "--precision fp16 needs --normalize samples: its dynamic loss scale is divided out in the per-sample "
          "normalization of each step");
  const std::string unsupported = precision_unsupported_reason(c.precision, c.device);
  require(unsupported.empty(), "--precision " + std::string(precision_name(c.precision)) + ": " + unsupported);
  if (c.kernels == nn::KernelChoice::fused) {
    require(c.model == ModelKind::mlp,
            "--kernels fused runs the MLP only (the model is " + std::string(choice_name(c.model)) + ")");
    require(c.precision == Precision::fp32 && !c.precision_by_planner,
            "--kernels fused is f32 only: give --precision fp32 (or --kernels auto)");
    require(c.recompute == RecomputeChoice::off, "--kernels fused keeps every activation: give --recompute off");
  }
  require(c.graphs != GraphsChoice::on || c.device.is_cuda(),
          "--graphs on needs a CUDA device (the device is " + c.device.str() + ")");
  c.use_graphs = c.device.is_cuda() && c.graphs != GraphsChoice::off;
  if (c.data_on == DataOnChoice::planner && !c.device.is_cuda()) c.data_on = DataOnChoice::device;  // the same memory
}

}  // namespace

template <class E>
E parse_choice(const std::string& text) {
  const Choices<E>& c = kChoices<E>;
  for (const auto& [name, value] : c.values)
    if (text == name) return value;
  const std::string expected = "expected " + listed(c);
  throw UsageFailure(std::string(c.flag) + " '" + text +
                     "': " + (c.noun != nullptr ? "unknown " + std::string(c.noun) + " (" + expected + ")" : expected));
}

template <class E>
const char* choice_name(E value) {
  for (const auto& [name, v] : kChoices<E>.values)
    if (v == value) return name;
  throw std::logic_error("choice_name: a value missing from its table");
}

template <class E>
std::vector<std::string> choice_names(const char* extra) {
  std::vector<std::string> names;
  for (const auto& [name, value] : kChoices<E>.values) names.push_back(name);
  if (extra != nullptr) names.push_back(extra);
  return names;
}

#define FMNIST_CHOICE(E)                          \
  template E parse_choice<E>(const std::string&); \
  template const char* choice_name<E>(E);         \
  template std::vector<std::string> choice_names<E>(const char*);
FMNIST_CHOICE(ModelKind)
FMNIST_CHOICE(OptimizerKind)
FMNIST_CHOICE(LrScheduleKind)
FMNIST_CHOICE(GraphsChoice)
FMNIST_CHOICE(RecomputeChoice)
FMNIST_CHOICE(DataOnChoice)
FMNIST_CHOICE(Precision)
FMNIST_CHOICE(nn::KernelChoice)
FMNIST_CHOICE(optim::Normalization)
#undef FMNIST_CHOICE

int RunConfig::accum_steps_at(int epoch) const { return optim::accum_steps_for_epoch(accum_schedule, epoch); }

std::map<int, int> RunConfig::accum_schedule_all_ranks() const {
  std::map<int, int> all;
  for (const auto& [epoch, steps] : accum_schedule) all[epoch] = steps * world_size;
  return all;
}

RunConfig resolve_run_config(const CommandLine& cli) {
  RunConfig c;
  static_cast<FlagValues&>(c) = cli;  // the values taken as given
  c.model = parse_choice<ModelKind>(cli.model);
  c.precision_by_planner = cli.precision == "auto";
  c.precision = c.precision_by_planner ? Precision::fp32 : parse_choice<Precision>(cli.precision);
  c.kernels = parse_choice<nn::KernelChoice>(cli.kernels);
  c.recompute = parse_choice<RecomputeChoice>(cli.recompute);
  c.data_on = parse_choice<DataOnChoice>(cli.data_on);
  c.graphs = parse_choice<GraphsChoice>(cli.graphs);
  c.batch_source = cli.effective_batch == 0 ? BatchSource::flags
                   : cli.batch_size_given   ? BatchSource::elastic
                                            : BatchSource::planner;
  c.accum_scheduled = !cli.schedule.empty();
  c.accum_schedule = c.accum_scheduled ? cli.schedule : std::map<int, int>{{0, cli.accum_steps}};
  c.optimizer = parse_choice<OptimizerKind>(cli.optimizer);
  c.lr_schedule = parse_choice<LrScheduleKind>(cli.lr_schedule);
  // PyTorch's defaults: 0 for SGD, 0.01 for AdamW.
  c.weight_decay = cli.weight_decay.value_or(c.optimizer == OptimizerKind::adamw ? 0.01f : 0.0f);
  c.normalization = parse_choice<optim::Normalization>(cli.normalize);
  resolve_device(cli, c);
  return c;
}

RunConfig on_ranks(const RunConfig& config, const RankPlacement& placement) {
  RunConfig c = config;
  c.rank = placement.rank;
  c.world_size = placement.world_size;
  c.device = placement.device;
  if (c.world_size > 1) c.use_graphs = false;  // CUDA graphs with several ranks: not yet
  if (c.batch_source == BatchSource::elastic) {
    const int64_t per_step = c.batch_size * c.world_size;
    if (c.effective_batch % per_step != 0)
      throw UsageFailure("--effective-batch " + std::to_string(c.effective_batch) +
                         " is not a multiple of --batch-size " + std::to_string(c.batch_size) + " x " +
                         std::to_string(c.world_size) + " rank(s) = " + std::to_string(per_step));
    c.accum_schedule = {{0, static_cast<int>(c.effective_batch / per_step)}};
  }
  if (c.rank != 0) {  // rank 0 writes the checkpoint, the weights and the metrics
    c.checkpoint_path.clear();
    c.save_path.clear();
    c.metrics_path.clear();
    c.memory_report_path = rank_path(c.memory_report_path, c.rank);
    c.trace_path = rank_path(c.trace_path, c.rank);
    c.memory_plot_path = rank_path(c.memory_plot_path, c.rank);
  }
  return c;
}

RunConfig with_plan(const RunConfig& config, const BatchPlan& plan) {
  RunConfig c = config;
  c.batch_size = plan.micro_batch;
  c.accum_schedule = {{0, plan.accum_steps}};
  if (c.recompute == RecomputeChoice::planner) {
    c.recompute = plan.setting.recompute != 0 ? RecomputeChoice::on : RecomputeChoice::off;
    c.recompute_segments = plan.setting.recompute;
  }
  if (c.data_on == DataOnChoice::planner)
    c.data_on = plan.setting.data == DataPlacement::host ? DataOnChoice::host : DataOnChoice::device;
  if (c.precision_by_planner) {
    c.precision = plan.setting.precision;
    c.precision_by_planner = false;
  }
  if (plan.predicted_epoch_seconds > 0.0) {
    PlanCheck check;
    check.micro_batch = plan.micro_batch;
    check.accum_steps = plan.accum_steps;
    check.setting = plan.setting_text;
    check.predicted_epoch_seconds = plan.predicted_epoch_seconds;
    check.predicted_peak_bytes = plan.predicted_peak_bytes;
    c.plan_check = check;
  }
  return c;
}

}  // namespace fmnist
