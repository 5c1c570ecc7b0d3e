// fashion_mnist: the seed experiment end to end (see --help and docs/fashion_mnist.md).
//
// Note [The app as a pipeline]: main() reads top to bottom as the run goes: parse the command line
// (options.cpp; a usage error is one line and exit 2 before any work), resolve it into a const
// RunConfig (run_config.cpp), fold in this rank's place (run_control.cpp) and the planner's choice,
// make the parts and resume a checkpoint (training_setup.cpp), train (training_loop.cpp), then
// write the weights and reports; run_and_report() maps how the run
// ended to its exit code: 0, 1 (runtime failure), 2 (usage), 130 / 143 / 141 (SIGINT / SIGTERM /
// stdout closed).
#include <cstdio>
#include <memory>
#include <optional>

#include "cumulus/core/threads.h"
#include "cumulus/data/dataset.h"
#include "cumulus/dist/communicator.h"
#include "cumulus/io/state_dict.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/memory/tracker.h"
#include "cumulus/models/fashion_mnist.h"
#include "cumulus/nn/flat_parameters.h"
#include "run_config.h"
#include "run_control.h"
#include "training.h"

using namespace cumulus;

namespace fmnist {
namespace {

// What a rank loaded that fixes how many collectives it issues (Note [Ranks agree on what they loaded]).
std::string loaded_sizes(const models::FashionMnistSplit& train, const models::FashionMnistSplit& test) {
  return std::to_string(train.size()) + " training and " + std::to_string(test.size()) + " test samples";
}

std::string resume_position(const train::TrainingCounters& c) {
  return "at epoch " + std::to_string(c.epoch + 1) + ", micro-batch " + std::to_string(c.micro_batch_index) + " (" +
         std::to_string(c.optimizer_steps) + " steps)";
}

// The test pass's loader, in the training's precision.
data::DataLoader test_loader_for(const RunConfig& o, const models::FashionMnistSplit& test) {
  data::DataLoader loader(test.tensors(), o.eval_batch_size, false, 0, o.device);
  loader.set_dtype(compute_dtype(o.precision));
  return loader;
}

// --eval-only: the test pass of the --init weights (or the seeded initialization).
int evaluate_only(const RunConfig& o, nn::Module& model, data::DataLoader test_loader, const std::string& data_dir) {
  if (!o.quiet)
    say("device: %s | model: %s | weights: %s | data: %s (%lld test)\n", o.device.describe().c_str(),
        choice_name(o.model), o.init_path.empty() ? "seeded initialization" : o.init_path.c_str(), data_dir.c_str(),
        static_cast<long long>(test_loader.dataset().size()));
  if (g_root) print_test_results(test_pass(model, test_loader));  // the other ranks hold the same weights
  return app::stop_requested() ? app::exit_code_for_stop(app::stop_signal()) : 0;
}

void save_final_weights(const RunConfig& o, const nn::Module& model) {
  if (o.save_path.empty()) return;
  try {
    io::save_state_dict(o.save_path, model);
  } catch (const Error& e) {
    throw Error("--save: " + std::string(e.what()));
  }
  if (!o.quiet) say("weights written to %s\n", o.save_path.c_str());
}

// Before any model or data is made: the stop and write signals handled, the threads set, the run's
// settings placed on this rank and checked alike on every rank, and the data folder found.
struct PreparedRun {
  RunConfig placed;
  std::string data_dir;
};

PreparedRun prepare_run(const RunConfig& resolved, dist::Communicator& comm) {
  app::install_stop_handlers();
  app::ignore_write_signals();  // a closed stdout: say() asks for a stop, the run checkpoints
  // Under `ulimit -v`, OpenBLAS's buffers are taken now or refused (Note [OpenBLAS under an address-space limit]).
  use_cpu_threads(resolved.threads);
  const RunConfig placed = on_ranks(resolved, place_on_ranks(resolved, comm));  // this rank's place and device
  check_same_settings_on_every_rank(placed, comm);
  usage_check_on_every_rank(comm, [&] { check_run_paths(resolved, placed); });
  std::string data_dir = locate_fashion_mnist(placed.data_dir, placed.quiet);
  usage_check_on_every_rank(comm, [&] { check_outputs_against_data(resolved, placed, data_dir); });
  return {placed, std::move(data_dir)};
}

// The model, seeded by --seed, with --init's weights if given.
std::unique_ptr<nn::Model> seeded_model(const RunConfig& o) {
  Generator gen(o.seed);
  std::unique_ptr<nn::Model> model = make_model(o, gen);
  if (!o.init_path.empty()) load_weights(o.init_path, *model);
  return model;
}

// --resume's checkpoint into the model, the optimizer and the trainer (every rank the same one),
// or a start at epoch 0.
TrainingState resume_if_asked(const RunConfig& config, nn::Model& model, optim::Optimizer& optimizer,
                              train::Trainer& trainer, int64_t micro_batches, int64_t train_samples,
                              dist::Communicator& comm) {
  TrainingState state;
  if (config.resume_path.empty()) return state;
  state = load_checkpoint(config.resume_path, model, optimizer, config, micro_batches, train_samples);
  trainer.restore(state.state.counters);
  check_same_loaded_on_every_rank("checkpoints", resume_position(state.state.counters),
                                  "give every rank the same --resume checkpoint", comm);
  return state;
}

int run(const RunConfig& resolved, const std::shared_ptr<dist::Communicator>& comm) {
  const auto [placed, data_dir] = prepare_run(resolved, *comm);
  const Device device = placed.device;
  const std::unique_ptr<nn::Model> model_ptr = seeded_model(placed);
  nn::Model& model = *model_ptr;
  app::throw_if_interrupted();

  // --data-on host: the splits stay in host memory and the loaders stage batches to the device
  // (auto: on the device until the planner places them).
  const Device data_device = placed.data_on == DataOnChoice::host ? Device::cpu() : device;
  models::FashionMnistSplit test = models::load_fashion_mnist(data_dir, false, data_device, placed.test_limit);
  app::throw_if_interrupted();
  if (placed.eval_only) return evaluate_only(placed, model, test_loader_for(placed, test), data_dir);
  models::FashionMnistSplit train_set = models::load_fashion_mnist(data_dir, true, data_device, placed.train_limit);
  app::throw_if_interrupted();
  check_same_loaded_on_every_rank("data", loaded_sizes(train_set, test),
                                  "give every rank the same --data (Note [Ranks agree on what they loaded])", *comm);

  auto flat = std::make_shared<nn::FlatParameters>(model);
  allocator_for(device).empty_cache();  // the per-parameter buffers packing replaced
  // --data-on auto: the planner may move the splits off the device, so what the run holds is
  // checked against the budget after it has placed them.
  const bool placement_planned = placed.data_on == DataOnChoice::planner;
  if (!placement_planned) apply_memory_budget(placed);
  if (placed.plan_only) {  // the planner's table, nothing trained
    print_plan(placed, model, flat, train_set, test, *comm);
    return 0;
  }
  const RunConfig config = placed.batch_source == BatchSource::planner
                               ? with_plan(placed, plan_batch(placed, model, flat, train_set, test, *comm))
                               : placed;  // resolved: the micro-batch, the accumulation steps and the levers
  if (placement_planned) apply_memory_budget(config);
  data::DataLoader test_loader = test_loader_for(config, test);

  data::DataLoader train_loader(train_set.tensors(), config.batch_size, config.shuffle, config.seed, device);
  train_loader.set_dtype(compute_dtype(config.precision));  // Note [Mixed precision]: ops follow the batch
  const int64_t micro_batches = train_loader.num_batches();
  auto optimizer = make_optimizer(config, flat);
  const train::TrainerOptions trainer_opts = trainer_options(config, comm);
  train::Trainer trainer(optimizer, trainer_opts, make_lr_schedule(config, micro_batches));

  const TrainingState state =
      resume_if_asked(config, model, *optimizer, trainer, micro_batches, train_set.size(), *comm);
  app::throw_if_interrupted();

  RunDescription description{data_dir, train_set.size(), test.size(), train_loader.host_resident()};
  if (!config.quiet && needs_loss_scaling(config.precision))
    description.loss_scale = trainer.counters().loss_scale;  // a read from the device
  description.backend = comm->backend();
  announce_run(config, model, description, state);
  memory::MemoryTracker tracker(device, tracker_options(config, model));
  if (config.plan_check) tracker.set_plan_check(*config.plan_check);
  const TrainingParts parts{config,       model,       *optimizer, trainer, trainer_opts,
                            train_loader, test_loader, *comm,      tracker, state};
  if (const std::optional<int> stopped = train(parts)) return *stopped;

  save_final_weights(config, model);
  finish_reports(config, tracker, *comm);
  return app::stop_requested() ? app::exit_code_for_stop(app::stop_signal()) : 0;
}

int run_and_report(const RunConfig& config, const std::shared_ptr<dist::Communicator>& comm) {
  try {
    return run(config, comm);
  } catch (const app::Interrupted&) {
    // Before the first micro-batch (loading, planning) or in an --eval-only test pass: there is no
    // new state to save, and a checkpoint being resumed is left as it was.
    std::fprintf(stderr, "fashion_mnist: interrupted (%s) before training began; nothing was written\n",
                 app::stop_signal_name(app::stop_signal()));
    return app::exit_code_for_stop(app::stop_signal());
  } catch (const SameOnEveryRank& e) {
    if (g_root) std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    g_agreed_exit = true;
    return 2;
  } catch (const ErrorOnEveryRank& e) {
    if (g_root) std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    g_agreed_exit = true;
    return 1;
  } catch (const UsageFailure& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist: unexpected error: %s\n", e.what());
    return 1;
  }
}

// The run's configuration, as far as one process can resolve it; a usage error is reported (exit 2).
std::optional<RunConfig> resolve_or_report(const CommandLine& command_line) {
  try {
    return resolve_run_config(command_line);
  } catch (const UsageFailure& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return std::nullopt;
  }
}

}  // namespace
}  // namespace fmnist

// OpenBLAS starts no worker before main under an address-space limit; run() starts those that fit.
CUMULUS_OPENBLAS_PREINIT;

int main(int argc, char** argv) {
  const fmnist::ParseResult parsed = fmnist::parse_command_line(argc, argv);
  if (!parsed.proceed) return parsed.exit_code;
  const std::optional<fmnist::RunConfig> config = fmnist::resolve_or_report(parsed.command_line);
  if (!config) return 2;
  std::shared_ptr<cumulus::dist::Communicator> comm;
  try {
    comm = cumulus::dist::Communicator::from_environment();
  } catch (const cumulus::Error& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 1;
  }
  const int code = fmnist::run_and_report(*config, comm);
  // With several ranks, a failure on one rank ends the job: the others may be waiting in a
  // collective for it. mpirun names the rank; rank 0's last checkpoint was written atomically.
  if (code != 0 && comm->world_size() > 1 && !fmnist::g_agreed_exit) {
    std::fflush(stdout);
    std::fflush(stderr);
    comm->abort(code);
  }
  return code;
}
