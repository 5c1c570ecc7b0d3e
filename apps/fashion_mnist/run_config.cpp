#include "run_config.h"

#include <utility>

#include "common/command_line.h"
#include "cumulus/core/error.h"
#include "cumulus/io/run_files.h"

using namespace cumulus;

namespace fmnist {
namespace {

// The device, the precision and the kernels, and whether they go together.
void resolve_device(const CommandLine& cli, RunConfig& c) {
  try {
    c.device = app::device_from_flag(cli.device);
  } catch (const Error& e) {
    throw UsageFailure("--device: " + std::string(e.what()));
  }
  c.one_gpu_per_rank = cli.device == "auto" || cli.device == "cuda";
  require(!needs_loss_scaling(c.precision) || c.normalization == train::Normalization::units,
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
  require(c.graphs != GraphsChoice::on || (c.optimizer_state == optim::StatePlacement::device &&
                                            !c.optimizer_state_by_planner),
          "--graphs on cannot replay an update on the host: give --optimizer-state device or --graphs auto");
  // A replayed graph runs no op's host code, so an op profile would see none of its work.
  require(c.graphs != GraphsChoice::on || c.op_profile_path.empty(),
          "--graphs on replays steps without running their ops: --op-profile needs --graphs auto or off");
  c.use_graphs = c.device.is_cuda() && c.graphs != GraphsChoice::off &&
                 c.optimizer_state == optim::StatePlacement::device && c.op_profile_path.empty();
  if (c.data_on == DataOnChoice::planner && !c.device.is_cuda()) c.data_on = DataOnChoice::device;  // the same memory
}

}  // namespace

int RunConfig::accum_steps_at(int epoch) const { return train::accum_steps_for_epoch(accum_schedule, epoch); }

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
  c.optimizer_state_by_planner = cli.optimizer_state == "auto";
  if (!c.optimizer_state_by_planner) c.optimizer_state = parse_choice<optim::StatePlacement>(cli.optimizer_state);
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
  c.normalization = parse_choice<train::Normalization>(cli.normalize);
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
  // Before rank 0 alone keeps the path; --zero auto: until the planner chooses stage 0 (with_plan).
  c.gathers_checkpoint = c.world_size > 1 && (c.zero_stage >= 1 || c.zero_by_planner) && !c.checkpoint_path.empty();
  if (c.rank != 0) {  // rank 0 writes the checkpoint, the weights and the metrics
    c.checkpoint_path.clear();
    c.save_path.clear();
    c.metrics_path.clear();
    c.memory_report_path = io::rank_path(c.memory_report_path, c.rank);
    c.trace_path = io::rank_path(c.trace_path, c.rank);
    c.memory_plot_path = io::rank_path(c.memory_plot_path, c.rank);
    c.op_profile_path = io::rank_path(c.op_profile_path, c.rank);
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
    c.data_on = plan.setting.data == plan::DataPlacement::host ? DataOnChoice::host : DataOnChoice::device;
  if (c.zero_by_planner) {
    c.zero_stage = plan.setting.zero_stage;
    c.zero_by_planner = false;
    c.gathers_checkpoint = c.gathers_checkpoint && c.zero_stage >= 1;
  }
  if (c.optimizer_bits_by_planner) {
    c.optimizer_bits = plan.setting.optimizer_bits;
    c.optimizer_bits_by_planner = false;
  }
  if (c.optimizer_state_by_planner) {
    c.optimizer_state = plan.setting.optimizer_state;
    c.optimizer_state_by_planner = false;
    if (c.optimizer_state == optim::StatePlacement::host) c.use_graphs = false;  // the update waits for its copies
  }
  if (c.precision_by_planner) {
    c.precision = plan.setting.precision;
    c.precision_by_planner = false;
  }
  if (plan.predicted_epoch_seconds > 0.0) {
    plan::PlanCheck check;
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
