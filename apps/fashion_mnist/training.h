// Training: the run's parts made from its configuration (training_setup.cpp: the model, the
// optimizer and its schedule, the Trainer's options, the planner's choice, the weights, and the
// checkpoints: the library's, cumulus/train/checkpoint.h, with the settings of Note [Settings
// table]), and the loop that trains them (training_loop.cpp: the epochs, each through
// Trainer::train_epoch from the last group boundary, then the test pass, the --metrics line, the
// checkpoint; the stops) with what the run prints and writes about itself.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "cumulus/data/dataset.h"
#include "cumulus/dist/communicator.h"
#include "cumulus/memory/tracker.h"
#include "cumulus/models/fashion_mnist.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/model.h"
#include "cumulus/optim/lr_schedule.h"
#include "cumulus/optim/optimizer.h"
#include "cumulus/train/checkpoint.h"
#include "cumulus/train/trainer.h"
#include "cumulus/tensor/random.h"
#include "run_config.h"

namespace fmnist {

// ---- the run's parts (training_setup.cpp) ----------------------------------------------------

// The one place that knows the models by name; everything after asks the nn::Model interface.
std::unique_ptr<cumulus::nn::Model> make_model(const RunConfig& o, cumulus::Generator& gen);

// A training micro-batch's summed loss: the model's own (the MLP's fused op where it applies, Note
// [Fused MLP] in engine/ops/fused_mlp.cpp; cross-entropy of the logits by default).
cumulus::Tensor training_loss(cumulus::nn::Model& model, const cumulus::data::Batch& batch);

// Which kernels train micro-batches of `batch` samples: "fused" or "generic" (the banner and reports).
std::string kernels_used(const cumulus::nn::Model& model, const RunConfig& o, int64_t batch);

std::shared_ptr<cumulus::optim::Optimizer> make_optimizer(const RunConfig& o,
                                                          std::shared_ptr<cumulus::nn::FlatParameters> flat);

// --lr-schedule; null for constant (the optimizer's own lr).
std::shared_ptr<const cumulus::optim::LRSchedule> make_lr_schedule(const RunConfig& o, int64_t micro_batches);

// The Trainer's options: the accumulation steps of all ranks, normalization, clipping, fp16's loss
// scaling, graphs and the communicator.
cumulus::train::TrainerOptions trainer_options(const RunConfig& o,
                                               const std::shared_ptr<cumulus::dist::Communicator>& comm);

// --memory-budget: from here on the device behaves as if it had only that much (refused if the run
// already holds more).
void apply_memory_budget(const RunConfig& o);

// fp16's loss scale, a power of two: "65536", "0.5".
std::string loss_scale_text(float scale);

// --effective-batch: the library's planner (cumulus::plan::plan_batch) with this run's micro-batch,
// optimizer and budget, and the levers --recompute, --data-on and --precision auto give it (Note
// [Plan levers]); the chosen setting is left in place (the model's recompute segments, `train` and
// `test` moved). Returns what with_plan() takes; OutOfMemory when nothing fits.
// Under mpirun every rank first times the collectives (the planner adds the communication each
// candidate makes), then rank 0 plans its part of the effective batch for every rank (with --zero
// auto, weighing ZeRO stages) and the others put its choice in place.
BatchPlan plan_batch(const RunConfig& c, cumulus::nn::Model& model,
                     const std::shared_ptr<cumulus::nn::FlatParameters>& flat,
                     cumulus::models::FashionMnistSplit& train, cumulus::models::FashionMnistSplit& test,
                     cumulus::dist::Communicator& comm);

// --plan-only: the planner's table of every candidate, nothing verified, nothing trained (under
// mpirun every rank times the collectives, rank 0 plans and prints).
void print_plan(const RunConfig& c, cumulus::nn::Model& model, const std::shared_ptr<cumulus::nn::FlatParameters>& flat,
                cumulus::models::FashionMnistSplit& train, cumulus::models::FashionMnistSplit& test,
                cumulus::dist::Communicator& comm);

// Where a run starts: a resumed checkpoint's state, or epoch 0.
using TrainingState = cumulus::train::ResumedCheckpoint;

// --init: every parameter of `model` must be in the file with its shape, and finite; extra tensors
// are an error too. A checkpoint is refused with a pointer to --resume.
void load_weights(const std::string& path, const cumulus::nn::Module& model);

// Restores weights and optimizer state; throws UsageFailure when the checkpoint was made with other
// settings or is past --epochs, and cumulus::Error when it is unusable (load_training_checkpoint).
TrainingState load_checkpoint(const std::string& path, const cumulus::nn::Module& model,
                              cumulus::optim::Optimizer& optimizer, const RunConfig& options,
                              int64_t micro_batches_per_epoch, int64_t train_samples);

// ---- the training loop and the run's reports (training_loop.cpp) -----------------------------

// What the banner describes besides the options and the model.
struct RunDescription {
  std::string data_dir;
  int64_t train_samples = 0, test_samples = 0;
  bool host_resident_data = false;
  float loss_scale = 1.0f;
  std::string backend;  // the communicator's
};

// The banner (unless --quiet), then on stderr the settings --override changed and a note when a
// resumed checkpoint has nothing left to train.
void announce_run(const RunConfig& o, const cumulus::nn::Model& model, const RunDescription& d,
                  const TrainingState& state);

// The memory tracker's model, micro-batch and the settings its report records.
cumulus::memory::MemoryTracker::Options tracker_options(const RunConfig& o, const cumulus::nn::Model& model);

// The test pass (train::evaluate_classifier: the accuracy over all samples, the mean over batches
// of each batch's mean loss), throwing Interrupted at a signal, and the lines it prints.
cumulus::train::Evaluation test_pass(cumulus::nn::Module& model, cumulus::data::DataLoader& loader);
void print_test_results(const cumulus::train::Evaluation& r);

// What the loop trains with; all made before it starts.
struct TrainingParts {
  const RunConfig& o;
  cumulus::nn::Model& model;
  cumulus::optim::Optimizer& optimizer;
  cumulus::train::Trainer& trainer;
  const cumulus::train::TrainerOptions& trainer_options;
  cumulus::data::DataLoader& train_loader;
  cumulus::data::DataLoader& test_loader;
  cumulus::dist::Communicator& comm;
  cumulus::memory::MemoryTracker&
      tracker;                      // with the planner's check when it chose the plan (measured after the first epoch)
  const TrainingState& state;       // where the run starts (a resumed checkpoint's, else epoch 0)
};

// Trains from parts.state to --epochs. Returns the exit code of a run that stopped early (an
// interrupt, out of memory, an error: the checkpoint of the last group boundary and the reports
// are written first), or nothing when every epoch finished.
std::optional<int> train(const TrainingParts& parts);

// After the last epoch: the memory table, the reports and, with several ranks, the all-reduces'
// totals.
void finish_reports(const RunConfig& o, cumulus::memory::MemoryTracker& tracker, cumulus::dist::Communicator& comm);

}  // namespace fmnist
