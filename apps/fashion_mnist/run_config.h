// The run's configuration, resolved from the command line: every choice an enum, every derived
// value computed here, once.
//
// Note [Run configuration]: only this file's functions make a RunConfig; everything else receives
// a `const RunConfig&`. Each step folds what was found into a new one, never editing a live one:
// resolve_run_config (the flags), on_ranks (this rank, the ranks, its device and outputs) and
// with_plan (the planner's micro-batch, accumulation steps and levers).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cumulus/core/device.h"
#include "cumulus/core/precision.h"
#include "cumulus/nn/model.h"
#include "cumulus/runtime/accumulation.h"
#include "cumulus/runtime/planner.h"
#include "options.h"

namespace fmnist {

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

// A choice's flag value as the enum; throws UsageFailure naming the flag and the values it takes.
// Defined for every enum above and for cumulus::Precision, nn::KernelChoice and optim::Normalization.
template <class E>
E parse_choice(const std::string& text);
// The flag value that names `value`: "mlp", "micro-batches", "auto".
template <class E>
const char* choice_name(E value);
// Every flag value of E, in the table's order, then `extra` if given (CLI11's IsMember list).
template <class E>
std::vector<std::string> choice_names(const char* extra = nullptr);

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
  uint32_t recompute_segments = 0;              // the planner's choice of the model's segments (--recompute auto)
  GraphsChoice graphs = GraphsChoice::automatic;
  bool use_graphs = false;  // from `graphs`, the device and the number of ranks

  // The batch: micro-batch x accumulation steps (x ranks) = effective batch.
  BatchSource batch_source = BatchSource::flags;
  std::map<int, int> accum_schedule = {{0, 1}};  // epoch -> micro-batches per step of each rank; from epoch 0
  bool accum_scheduled = false;                  // given as --accum-schedule (recorded as a schedule)
  // The planner's prediction for the chosen plan (with_plan); 0 when the planner did not choose.
  double planned_epoch_seconds = 0.0;
  int64_t planned_peak_bytes = 0;
  std::string planned_setting;  // its levers, "recompute conv1+bn1, data on device, fp32"

  // The optimizer and its learning-rate schedule.
  OptimizerKind optimizer = OptimizerKind::sgd;
  LrScheduleKind lr_schedule = LrScheduleKind::constant;
  float weight_decay = 0.0f;  // --weight-decay, else PyTorch's default for the optimizer
  cumulus::optim::Normalization normalization = cumulus::optim::Normalization::units;

  // Data parallel (mpirun). The output paths (FlagValues) are this rank's (Note [Run configuration]).
  int rank = 0, world_size = 1;

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

// What the planner chose (plan_batch, training_setup.h).
struct BatchPlan {
  int64_t micro_batch = 0;
  int accum_steps = 0;
  cumulus::PlanSetting setting;  // its levers (recompute segments, data placement, precision)
  std::string setting_text;      // the same as plan_setting_text() names it
  // The chosen row's prediction, compared with the first epoch's measurement (training_loop.cpp).
  double predicted_epoch_seconds = 0.0;
  int64_t predicted_peak_bytes = 0;
};

RunConfig with_plan(const RunConfig& config, const BatchPlan& plan);

}  // namespace fmnist
