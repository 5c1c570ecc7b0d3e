// fashion_mnist: the seed experiment end to end (see --help and README.md).
//
// The loop, per micro-batch: gather the batch on the device, forward, summed cross-entropy,
// Accumulator::backward (gradients add into the persistent buffers), and at each group boundary one
// fused optimizer step. The memory tracker wraps each phase. Signals only set a flag, honoured in
// every phase: during training the loop stops at the next group boundary (the current optimizer
// step finishes); during the test pass, loading or planning at once. The checkpoint is written if
// asked, and the run exits 130 (SIGINT), 143 (SIGTERM) or 141 (standard output closed: SIGPIPE is
// ignored and a failed write to stdout is treated as an interrupt, so `| head` never kills a run
// before its checkpoint).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "checkpoint.h"
#include "cumulus/autograd/grad_mode.h"
#include "cumulus/core/threads.h"
#include "cumulus/data/dataset.h"
#include "cumulus/dist/communicator.h"
#include "cumulus/io/file.h"
#include "cumulus/memory/planner.h"
#include "cumulus/memory/prediction.h"
#include "cumulus/memory/tracker.h"
#include "cumulus/models/cnn.h"
#include "cumulus/models/mlp.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/model.h"
#include "cumulus/ops/metrics.h"
#include "cumulus/ops/ops.h"
#include "cumulus/optim/adamw.h"
#include "cumulus/optim/sgd.h"
#include "cumulus/optim/trainer.h"
#include "data_files.h"
#include "options.h"
#include "progress.h"
#include "run_paths.h"

using namespace cumulus;

namespace fmnist {
namespace {

volatile std::sig_atomic_t g_signal = 0;  // SIGINT, SIGTERM, or SIGPIPE for a closed stdout

void on_signal(int sig) {
  g_signal = sig;
  std::signal(sig, SIG_DFL);  // a second Ctrl-C ends the process at once
}

int exit_code_for(int sig) { return sig == SIGINT ? 130 : sig == SIGTERM ? 143 : 141; }
const char* signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "stdout closed"; }

// A usage error every rank finds at once (ranks started with different settings, or a problem one
// rank found and dist::problem_of_any_rank told every rank of): rank 0 says it, and the ranks end
// together.
struct SameOnEveryRank : UsageFailure {
  using UsageFailure::UsageFailure;
};

// Thrown where a phase outside the training loop (loading, planning, the test pass) notices an
// interrupt; the training loop itself stops at a group boundary without it.
struct Interrupted {};

void throw_if_interrupted() {
  if (g_signal != 0) throw Interrupted{};
}

// Data parallel (mpirun): rank 0 prints, writes the checkpoint, the weights and the metrics;
// every rank writes its own memory report. See run_data_parallel_setup().
bool g_root = true;
// Set when every rank stopped at the same group boundary (a signal, agreed on): the ranks end
// together. Any other non-zero exit on one rank ends the job (MPI_Abort) instead.
bool g_agreed_exit = false;

// stdout, flushed at once: a failed write (a closed pipe, a full disk) is noticed here and turned
// into an interrupt, so the run still checkpoints and exits non-zero instead of dying or lying.
void say(const char* format, ...) {
  if (!g_root) return;
  std::va_list args;
  va_start(args, format);
  std::vfprintf(stdout, format, args);
  va_end(args);
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) g_signal = SIGPIPE;
}

struct EvalResult {
  double accuracy = 0.0;
  double avg_loss = 0.0;
};

// fp16's loss scale, a power of two: "65536", "0.5".
std::string loss_scale_text(float scale) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(scale));
  return buf;
}

// The seed's test loop: accuracy over all samples, and the mean over batches of each batch's mean
// loss. The totals stay on the device until the pass ends: one read per pass, not three per batch.
EvalResult evaluate(nn::Module& model, const data::DataLoader& loader) {
  NoGradGuard no_grad;
  model.eval();  // batch norm normalizes with its running statistics and leaves them alone
  struct BackToTraining {
    nn::Module& m;
    ~BackToTraining() { m.train(); }
  } restore{model};
  ops::ClassificationTally tally(loader.device());
  for (int64_t i = 0; i < loader.num_batches(); ++i) {
    throw_if_interrupted();
    const data::Batch b = loader.batch(i);
    const Tensor logits = model(b.x);
    tally.add(logits, b.y, ops::cross_entropy(logits, b.y, ops::Reduction::Mean));
  }
  const ops::ClassificationTally::Totals t = tally.read();
  EvalResult r;
  r.accuracy = static_cast<double>(t.correct) / static_cast<double>(loader.dataset().size());
  r.avg_loss = t.loss_sum / static_cast<double>(loader.num_batches());
  return r;
}

// The one place that knows the models by name; everything after asks the nn::Model interface.
std::unique_ptr<nn::Model> make_model(const Options& o, Generator& gen) {
  std::unique_ptr<nn::Model> model;
  if (o.model == "cnn") model = std::make_unique<models::CNN>(gen, o.resolved_device);
  else model = std::make_unique<models::SeedMLP>(gen, o.resolved_device);
  model->set_recompute(o.recompute == "on");  // auto: off until the planner decides
  nn::KernelChoice kernels = nn::KernelChoice::automatic;
  nn::parse_kernel_choice(o.kernels, kernels);  // CLI11 checked the value, and fused against --model
  model->set_kernels(kernels);
  return model;
}

// A training micro-batch's summed loss: the model's own (the MLP's fused op where it applies, Note
// [Fused MLP] in engine/ops/fused_mlp.cpp; cross-entropy of the logits by default).
Tensor training_loss(nn::Model& model, const data::Batch& batch) {
  return model.loss(batch.x, batch.y, ops::Reduction::Sum);
}

// Which kernels train micro-batches of `batch` samples: "fused" or "generic" (the banner and reports).
std::string kernels_used(const nn::Model& model, const Options& o, int64_t batch) {
  return nn::kernel_choice_name(model.kernels_for(o.resolved_device, compute_dtype(o.resolved_precision), batch));
}

std::shared_ptr<optim::Optimizer> make_optimizer(const Options& o, std::shared_ptr<nn::FlatParameters> flat) {
  if (o.optimizer == "adamw") {
    optim::AdamWOptions a;
    a.lr = o.lr;
    a.beta1 = o.beta1;
    a.beta2 = o.beta2;
    a.eps = o.eps;
    a.weight_decay = o.resolved_weight_decay();
    return std::make_shared<optim::AdamW>(flat, a);
  }
  optim::SGDOptions s;
  s.lr = o.lr;
  s.momentum = o.momentum;
  s.nesterov = o.nesterov;
  s.weight_decay = o.resolved_weight_decay();
  return std::make_shared<optim::SGD>(flat, s);
}

// Optimizer steps of the whole run: each epoch's micro-batches in groups of that epoch's steps
// (per rank) times the ranks.
int64_t total_optimizer_steps(const Options& o, int64_t micro_batches) {
  const std::map<int, int> schedule = o.schedule.empty() ? std::map<int, int>{{0, o.accum_steps}} : o.schedule;
  int64_t steps = 0;
  for (int e = 0; e < o.epochs; ++e) {
    const int n = optim::Accumulator::steps_for_epoch(schedule, e) * o.world_size;
    steps += (micro_batches + n - 1) / n;
  }
  return steps;
}

// --lr-schedule; null for constant (the optimizer's own lr).
std::shared_ptr<const optim::LRSchedule> make_lr_schedule(const Options& o, int64_t micro_batches) {
  if (o.lr_schedule == "step") return std::make_shared<optim::StepLR>(o.lr, o.lr_step_size, o.lr_gamma);
  if (o.lr_schedule == "cosine") {
    const int64_t total = total_optimizer_steps(o, micro_batches);
    if (o.warmup_steps >= total)
      throw UsageFailure("--warmup-steps " + std::to_string(o.warmup_steps) + " must be below the run's " +
                         std::to_string(total) + " optimizer steps");
    return std::make_shared<optim::CosineWarmupLR>(o.lr, o.warmup_steps, total, o.min_lr);
  }
  return nullptr;
}

// --metrics, one JSON line per epoch, rewritten atomically after each epoch: a full disk or an
// unwritable file is an error naming the flag, and a crash never leaves half a line. A resumed run
// keeps the lines of the epochs its checkpoint had finished and drops any after them.
class MetricsFile {
 public:
  MetricsFile(std::string path, bool resuming, int finished_epochs) : path_(std::move(path)) {
    if (path_.empty() || !resuming) return;
    std::ifstream in(path_, std::ios::binary);
    if (!in) return;  // no file yet: start one
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      if (line.empty()) continue;
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("epoch") || !j["epoch"].is_number_integer())
        throw Error("--metrics '" + path_ + "': line " + std::to_string(n) +
                    " is not a metrics line of this app; give --metrics another file");
      if (j["epoch"].get<int64_t>() <= finished_epochs) content_ += line + "\n";
    }
  }
  bool enabled() const { return !path_.empty(); }
  void append(const nlohmann::ordered_json& line) {
    if (!enabled()) return;
    content_ += line.dump() + "\n";
    try {
      io::write_file_atomic(path_, content_);
    } catch (const Error& e) {
      throw Error("--metrics: " + std::string(e.what()));
    }
  }

 private:
  std::string path_, content_;
};

// The planner's recompute decision and its table, shown as soon as the library has them (before
// its verifying probes run). The fallback's table (a line through two probes) only with --plan-only.
void print_plan_table(const Options& o, const Plan& plan) {
  const int64_t budget = o.memory_budget_bytes;
  const bool line = plan.method == PlanMethod::probe_line;
  if (line && (!o.quiet || o.plan_only))
    say("planner: no prediction from the allocation sequence (%s); fitting a line through two probed peaks\n",
        plan.prediction.c_str());
  if (plan.recompute_weighed && !o.quiet) {
    if (plan.recompute)
      say("planner: recompute on: micro-batch %lld fits with it, %lld without\n",
          static_cast<long long>(plan.largest_with_recompute), static_cast<long long>(plan.largest_without_recompute));
    else
      say("planner: recompute off: %s\n", plan.largest_without_recompute == o.effective_batch
                                              ? "the whole effective batch fits without it"
                                              : "it would not let a larger micro-batch fit");
  }
  if (line ? !o.plan_only : o.quiet && !o.plan_only) return;
  if (!line)
    say("planner: predicted from the recorded allocation sequence (%s); reserved at rest %s, budget %s\n",
        plan.prediction.c_str(), format_bytes(plan.reserved_at_rest).c_str(),
        budget > 0 ? format_bytes(budget).c_str() : "none");
  say("  %11s %10s %15s %5s %6s\n", "micro-batch", "peak MiB", "reserved bytes", "fits", "accum");
  for (const PlanRow& r : plan.table) {
    const std::string reserved = line ? "-" : std::to_string(r.reserved_bytes);
    say("  %11lld %10.2f %15s %5s %6lld\n", static_cast<long long>(r.micro_batch),
        static_cast<double>(r.peak_bytes) / (1 << 20), reserved.c_str(),
        budget <= 0 ? "-"
        : r.fits    ? "yes"
                    : "no",
        static_cast<long long>(r.accum_steps));
  }
}

// --effective-batch: the library's planner (cumulus::plan_batch, Note [Planning a micro-batch] in
// engine/memory/planner.cpp) with this run's training micro-batch, optimizer and budget: every
// divisor predicted in reserved bytes with the optimizer state the first step allocates, the
// largest that fits verified by one probe under the limit (--recompute auto: recompute only if it
// lets a larger micro-batch fit). Parameters and batch norm's statistics are left as they were.
// Returns false when --plan-only asks to stop after the table.
bool plan_batch(Options& o, nn::Model& model, const std::shared_ptr<nn::FlatParameters>& flat,
                const data::ImageDataset& train) {
  // The run's optimizer is made after planning; one with its settings tells the planner what state
  // its first step allocates.
  const std::shared_ptr<optim::Optimizer> optimizer = make_optimizer(o, flat);
  PlanRequest request;
  request.device = o.resolved_device;
  request.effective_batch = o.effective_batch;
  request.budget = o.memory_budget_bytes;  // 0 with --plan-only alone: everything fits
  request.micro_batch = [&](int64_t b) {
    throw_if_interrupted();
    data::DataLoader loader(train, b, false, 0, o.resolved_device);  // host-resident data: staging included
    loader.set_dtype(compute_dtype(o.resolved_precision));
    const data::Batch batch = loader.batch(0);
    Tensor loss = training_loss(model, batch);
    loss.backward();
    loss = Tensor();
    flat->mark_gradients_stale();
  };
  request.optimizer = optimizer.get();
  request.sample_limit = train.size();
  if (o.recompute == "auto") request.set_recompute = [&](bool on) { model.set_recompute(on); };
  request.model = &model;
  request.verify = !o.plan_only;
  request.budget_name = "--memory-budget " + o.memory_budget;
  request.on_table = [&](const Plan& plan) { print_plan_table(o, plan); };
  const Plan plan = cumulus::plan_batch(request);
  if (o.recompute == "auto") o.recompute = plan.recompute ? "on" : "off";
  if (o.plan_only) return false;
  if (plan.micro_batch == 0) throw OutOfMemory("planner: " + plan.reason);
  o.batch_size = plan.micro_batch;
  o.accum_steps = static_cast<int>(plan.accum_steps);
  if (!o.quiet) say("planner: %s\n", plan.reason.c_str());
  return true;
}

void write_reports(const Options& o, MemoryTracker& tracker) {
  auto write = [&](const char* flag, const std::string& path, const std::string& content, const char* what) {
    if (path.empty()) return;
    try {
      io::write_file_atomic(path, content);
    } catch (const Error& e) {
      throw Error(std::string(flag) + ": " + e.what());
    }
    if (!o.quiet) say("%s written to %s\n", what, path.c_str());
  };
  write("--memory-report", o.memory_report_path, memory_report_json(tracker), "memory report");
  write("--trace", o.trace_path, memory_trace_json(tracker), "trace");
  write("--memory-plot", o.memory_plot_path, memory_plot_svg(tracker), "memory plot");
}

// "memory.json" -> "memory.rank1.json": each rank's own report.
std::string rank_path(const std::string& path, int rank) {
  if (path.empty()) return path;
  const std::string suffix = ".rank" + std::to_string(rank);
  const std::size_t slash = path.find_last_of('/');
  const std::size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) || dot == slash + 1) return path + suffix;
  return path.substr(0, dot) + suffix + path.substr(dot);
}

std::string host_name() {
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 ? std::string(name) : std::string("unknown");
}

// One GPU per rank on each node: the rank's place among the node's ranks (--device auto or cuda;
// an explicit cuda:N is taken as given on every rank, for launchers that give each rank its own
// CUDA_VISIBLE_DEVICES). Returns this rank's problem ("" if none) instead of throwing, so that
// every rank can learn of it and all stop together.
std::string choose_rank_device(Options& o, const dist::Communicator& comm) {
  if (!o.resolved_device.is_cuda() || (o.device != "auto" && o.device != "cuda")) return "";
  const int devices = cuda_device_count();
  try {
    o.resolved_device = Device::cuda(dist::device_for_local_rank(comm.local_rank(), comm.local_size(), devices));
    return "";
  } catch (const InvalidArgument& e) {
    const std::string n = std::to_string(devices);
    return "host " + host_name() + ": " + e.what() + "; start at most " + n + " per node (mpirun -npernode " + n +
           "), or give --device cpu (or --device cuda:0 where each rank sees a GPU of its own through "
           "CUDA_VISIBLE_DEVICES)";
  }
}

// Data parallel setup, before any file is touched: the ranks' roles and outputs, the device of
// each rank, the accumulation steps from --effective-batch, and the check that every rank was
// started with the same settings (a usage error on every rank, naming the setting, if not).
void run_data_parallel_setup(Options& o, dist::Communicator& comm) {
  o.rank = comm.rank();
  o.world_size = comm.world_size();
  g_root = comm.is_root();
  if (o.elastic) {
    const int64_t per_step = o.batch_size * o.world_size;
    if (o.effective_batch % per_step != 0)
      throw UsageFailure("--effective-batch " + std::to_string(o.effective_batch) +
                         " is not a multiple of --batch-size " + std::to_string(o.batch_size) + " x " +
                         std::to_string(o.world_size) + " rank(s) = " + std::to_string(per_step));
    o.accum_steps = static_cast<int>(o.effective_batch / per_step);
  }
  if (o.world_size == 1) return;
  // Ranks on one host share its cores: without --threads, each takes its share.
  if (o.threads == 0)
    set_cpu_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / comm.local_size()));
  if (o.effective_batch > 0 && !o.elastic)
    throw UsageFailure("the planner (--effective-batch without --batch-size) runs in one process; with " +
                       std::to_string(o.world_size) + " ranks give --effective-batch and --batch-size");
  if (o.resolved_device.is_cuda()) {
    if (o.graphs == "on") throw UsageFailure("--graphs on: CUDA graphs with several ranks are not supported yet");
    o.use_graphs = false;
  }
  // Before any work: NCCL would refuse two ranks on one GPU only in the first backward.
  if (const std::string problem = dist::problem_of_any_rank(comm, choose_rank_device(o, comm)); !problem.empty())
    throw SameOnEveryRank(problem);
  if (!g_root) {
    o.checkpoint_path.clear();
    o.save_path.clear();
    o.metrics_path.clear();
    o.memory_report_path = rank_path(o.memory_report_path, o.rank);
    o.trace_path = rank_path(o.trace_path, o.rank);
    o.memory_plot_path = rank_path(o.memory_plot_path, o.rank);
  }
  std::vector<std::pair<std::string, std::string>> settings = recorded_settings(o);
  settings.emplace_back("epochs", std::to_string(o.epochs));
  settings.emplace_back("init", o.init_path);
  settings.emplace_back("resume", o.resume_path);
  settings.emplace_back("eval-only", o.eval_only ? "true" : "false");
  settings.emplace_back("device", o.resolved_device.is_cuda() ? "cuda" : "cpu");
  try {
    dist::check_same_settings(comm, settings);
  } catch (const InvalidArgument& e) {
    throw SameOnEveryRank(e.what());
  }
}

void print_test_results(const EvalResult& r) {
  say("Test Results:\n Accuracy: %.1f%%, Avg loss: %f\n\n", 100.0 * r.accuracy, r.avg_loss);
}

int run(Options& o, const std::shared_ptr<dist::Communicator>& comm) {
  // From the start: a signal during loading must also end in a clean exit (130/143), never in
  // death by the signal. SIGPIPE: see say().
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);
  if (o.threads > 0) set_cpu_threads(o.threads);
  run_data_parallel_setup(o, *comm);
  const Device device = o.resolved_device;
  check_run_paths(o);
  const std::string data_dir = locate_fashion_mnist(o.data_dir, o.quiet);
  check_outputs_against_data(o, data_dir);

  Generator gen(o.seed);
  const std::unique_ptr<nn::Model> model_ptr = make_model(o, gen);
  nn::Model& model = *model_ptr;
  if (!o.init_path.empty()) load_weights(o.init_path, model);
  throw_if_interrupted();

  // --data-on host: the splits stay in host memory and the loaders stage batches to the device.
  const Device data_device = o.data_on == "host" ? Device::cpu() : device;
  const data::ImageDataset test = data::load_mnist_split(data_dir, false, data_device, o.test_limit);
  throw_if_interrupted();
  data::DataLoader test_loader(test, o.eval_batch_size, false, 0, device);
  test_loader.set_dtype(compute_dtype(o.resolved_precision));  // evaluation in the training's precision
  if (o.eval_only) {
    if (!o.quiet)
      say("device: %s | model: %s | weights: %s | data: %s (%lld test)\n", device.describe().c_str(), o.model.c_str(),
          o.init_path.empty() ? "seeded initialization" : o.init_path.c_str(), data_dir.c_str(),
          static_cast<long long>(test.size()));
    if (g_root) print_test_results(evaluate(model, test_loader));  // the other ranks hold the same weights
    return g_signal == 0 ? 0 : exit_code_for(g_signal);
  }
  const data::ImageDataset train = data::load_mnist_split(data_dir, true, data_device, o.train_limit);
  throw_if_interrupted();

  auto flat = std::make_shared<nn::FlatParameters>(model);
  allocator_for(device).empty_cache();  // the per-parameter buffers packing replaced
  if (o.memory_budget_bytes > 0) {
    const int64_t held = allocator_for(device).stats().reserved;
    if (held > o.memory_budget_bytes)
      throw UsageFailure("--memory-budget " + o.memory_budget + " is below the " + format_bytes(held) +
                         " this run holds before its first micro-batch (dataset, parameters, gradients)");
    allocator_for(device).set_memory_limit(o.memory_budget_bytes);
  }
  if (o.effective_batch > 0 && !o.elastic && !plan_batch(o, model, flat, train)) return 0;  // --plan-only

  data::DataLoader train_loader(train, o.batch_size, o.shuffle, o.seed, device);
  train_loader.set_dtype(compute_dtype(o.resolved_precision));  // Note [Mixed precision]: ops follow the batch
  const int64_t micro_batches = train_loader.num_batches();
  auto optimizer = make_optimizer(o, flat);
  optim::TrainerOptions ao;
  // The Accumulator counts the micro-batches of all ranks (Note [Data parallel accumulation]).
  ao.accum_steps = o.accum_steps * o.world_size;
  for (const auto& [epoch, steps] : o.schedule) ao.schedule[epoch] = steps * o.world_size;
  if (o.world_size > 1) ao.communicator = comm;
  ao.normalization = o.normalization();
  ao.clip_grad_norm = o.clip_grad_norm;
  ao.loss_scaling.dynamic = needs_loss_scaling(o.resolved_precision);
  ao.use_graphs = o.use_graphs;
  optim::Trainer trainer(optimizer, ao, make_lr_schedule(o, micro_batches));
  const optim::Accumulator& acc = trainer.accumulator();  // the counters

  TrainingState state;
  if (!o.resume_path.empty()) {
    state = load_checkpoint(o.resume_path, model, *optimizer, o, ResumeLimits{micro_batches, train.size()});
    trainer.restore(state.counters);
  }
  throw_if_interrupted();

  if (!o.quiet) {
    const int n0 = optim::Accumulator::steps_for_epoch(
        o.schedule.empty() ? std::map<int, int>{{0, o.accum_steps}} : o.schedule, state.epoch);
    const std::string ranks = o.world_size > 1 ? " x " + std::to_string(o.world_size) + " ranks" : std::string();
    say("device: %s | model: %s | data: %s (%lld train, %lld test) | micro-batch %lld x %d steps%s = effective batch "
        "%lld | %s lr %g%s\n",
        device.describe().c_str(),
        o.model == "cnn" ? "cnn (batch norm: statistics per micro-batch)" : "mlp 784-512-512-10", data_dir.c_str(),
        static_cast<long long>(train.size()), static_cast<long long>(test.size()), static_cast<long long>(o.batch_size),
        n0, ranks.c_str(), static_cast<long long>(o.batch_size * n0 * o.world_size),
        o.optimizer == "adamw" ? "AdamW" : "SGD", static_cast<double>(o.lr),
        o.lr_schedule == "constant" ? "" : (" (" + o.lr_schedule + " schedule)").c_str());
    if (o.recompute == "on") say("recompute: on (activations of the model's segments are recomputed in backward)\n");
    if (o.model == "mlp") {
      const char* fused = o.resolved_device.is_cuda()
                              ? "fused (mlp_cross_entropy: a micro-batch's forward, loss and backward in 3 + 3 "
                                "launches of our own)"
                              : "fused (mlp_cross_entropy: one op for the micro-batch; on the CPU the generic "
                                "kernels' arithmetic)";
      say("kernels: %s\n", kernels_used(model, o, o.batch_size) == "fused" ? fused : "generic (one op per layer)");
    }
    if (o.resolved_precision != Precision::fp32)
      say("precision: %s activations, gradients of activations and GEMM weight copies; f32 weights, gradient "
          "buffers, optimizer state and loss%s\n",
          o.precision.c_str(),
          needs_loss_scaling(o.resolved_precision) ? "; dynamic loss scale (now " +
                                                         loss_scale_text(acc.loss_scale()) + ")"
                                                   : std::string());
    if (train_loader.host_resident())
      say("data: on the host; micro-batches copied to the device one ahead (pinned staging, copy stream)\n");
    if (o.world_size > 1)
      say("data parallel: %d ranks (%s), this is rank 0; one all-reduce of the gradient per optimizer step, in %s "
          "buckets overlapping the last backward of each group\n",
          o.world_size, comm->backend().c_str(), "1 MiB");
    if (!o.resume_path.empty())
      say("resumed from %s at epoch %d, micro-batch %lld\n", o.resume_path.c_str(), state.epoch + 1,
          static_cast<long long>(state.next_micro_batch));
  }
  for (const std::string& change : state.overridden)
    if (g_root) std::fprintf(stderr, "fashion_mnist: --override: %s\n", change.c_str());
  if (state.epoch == o.epochs && g_root) {
    std::fprintf(stderr,
                 "fashion_mnist: '%s' has finished all %d epochs (--epochs %d): nothing to train; give a "
                 "larger --epochs to train further\n",
                 o.resume_path.c_str(), o.epochs, o.epochs);
  }

  MemoryTracker::Options to;
  to.model = model.name();
  if (model.uses_batch_statistics())
    to.annotations["batch_norm_statistics"] = "per micro-batch of " + std::to_string(o.batch_size) + " samples";
  to.micro_batch_size = o.batch_size;
  to.accum_steps = o.schedule.empty() ? o.accum_steps : o.schedule.begin()->second;
  to.settings = recorded_settings(o);
  to.settings.emplace_back("recompute", o.recompute);
  to.settings.emplace_back("kernels", kernels_used(model, o, o.batch_size));
  to.settings.emplace_back("data-on", o.data_on);
  if (o.world_size > 1) {
    to.settings.emplace_back("world-size", std::to_string(o.world_size));
    to.settings.emplace_back("rank", std::to_string(o.rank));
  }
  if (std::none_of(to.settings.begin(), to.settings.end(), [](const auto& kv) { return kv.first == "epochs"; }))
    to.settings.emplace_back("epochs", std::to_string(o.epochs));
  MemoryTracker tracker(device, to);
  Progress progress(stderr, !o.quiet && g_root, o.epochs);

  // Training losses are summed on the device by the Accumulator (per epoch, over stepped groups)
  // and read only at a progress refresh, a checkpoint and the end of an epoch; `loss_before_run`
  // is what a resumed epoch had before this run.
  double loss_before_run = 0.0;
  trainer.set_tracker(&tracker);

  // The position of the last group boundary: what a checkpoint written now restores. Its step
  // counters live on the device and are read when a checkpoint is written. After an epoch's last
  // group and before its test pass, the boundary is the epoch's end (next_micro_batch equal to
  // the epoch's micro-batches): a run interrupted in the test pass resumes with that test pass.
  TrainingState boundary = state;
  auto checkpoint_now = [&](const char* why) {
    if (o.checkpoint_path.empty()) return;
    const optim::Accumulator::Counters now = acc.counters();
    boundary.counters.optimizer_steps = now.optimizer_steps;
    boundary.counters.skipped_steps = now.skipped_steps;
    boundary.counters.loss_scale = now.loss_scale;
    boundary.counters.loss_scale_clean_steps = now.loss_scale_clean_steps;
    boundary.optimizer_updates = optimizer->updates();
    boundary.epoch_loss_sum = boundary.next_micro_batch == 0 ? 0.0 : loss_before_run + acc.epoch_loss_sum();
    try {
      save_checkpoint(o.checkpoint_path, model, *optimizer, boundary, o);
    } catch (const Error& e) {
      throw Error("--checkpoint: " + std::string(e.what()));
    }
    if (!o.quiet) say("checkpoint (%s) written to %s\n", why, o.checkpoint_path.c_str());
  };
  MetricsFile metrics(o.metrics_path, !o.resume_path.empty(), state.epoch);
  // Ends the run after an interrupt, an out-of-memory or a failed write: the checkpoint of the last
  // group boundary and the reports are still written (each failure reported, none hiding another).
  auto stop = [&](const std::string& message, int code, const char* why) {
    progress.end_epoch();
    if (!message.empty()) std::fprintf(stderr, "fashion_mnist: %s\n", message.c_str());
    allocator_for(device).set_memory_limit(0);  // room to report and save; a group in flight is dropped
    int status = code;
    for (auto& write : {std::function<void()>([&] { checkpoint_now(why); }),
                        std::function<void()>([&] { write_reports(o, tracker); })}) {
      try {
        write();
      } catch (const Error& e) {
        std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
        status = status == 0 ? 1 : status;
      }
    }
    return status;
  };

  // Data parallel: whether any rank was signalled (a collective: every rank asks at the same
  // boundary). A rank stopped by another's signal reports it as SIGTERM.
  auto stop_agreed = [&] {
    if (!comm->any(g_signal != 0)) return false;
    if (g_signal == 0) g_signal = SIGTERM;
    return true;
  };
  // A stop every rank makes at the same boundary: after rank 0 has written the checkpoint and the
  // reports, the ranks meet and end together (no rank is aborted mid-write).
  auto stop_together = [&](const std::string& message, int code, const char* why) {
    const int status = stop(g_root ? message : std::string(), code, why);
    if (o.world_size > 1) {
      comm->barrier();
      g_agreed_exit = true;
    }
    return status;
  };

  try {
    for (int epoch = state.epoch; epoch < o.epochs; ++epoch) {
      const bool resuming_epoch = epoch == state.epoch;
      const int64_t first = resuming_epoch ? state.next_micro_batch : 0;
      loss_before_run = resuming_epoch ? state.epoch_loss_sum : 0.0;
      int64_t samples = resuming_epoch ? state.epoch_samples : 0, samples_this_run = 0;
      train_loader.set_epoch(epoch);
      train_loader.seek(first);
      trainer.begin_epoch(epoch, micro_batches, first);
      progress.begin_epoch(epoch, micro_batches, first);
      boundary.epoch = epoch;
      boundary.next_micro_batch = first;
      boundary.counters = acc.counters();
      boundary.epoch_samples = samples;
      const int64_t skipped_before = acc.skipped_steps();
      const dist::Communicator::Stats comm_before = comm->stats();
      const int64_t buckets_in_backward_before = acc.buckets_started_in_backward();
      const auto t0 = std::chrono::steady_clock::now();
      int64_t epoch_peak = 0;

      for (int64_t i = first; i < micro_batches; ++i) {
        // A stop is honoured at the last group boundary (what the checkpoint holds); with several
        // ranks, at a boundary all of them agree on, so they stop together.
        if (o.world_size == 1 ? g_signal != 0 : acc.micro_batches_in_group() == 0 && stop_agreed())
          return stop_together("interrupted (" + std::string(signal_name(g_signal)) + ") at epoch " +
                                   std::to_string(epoch + 1) + ", micro-batch " + std::to_string(i),
                               exit_code_for(g_signal), "interrupted");
        const int64_t b = std::min<int64_t>(o.batch_size, train.size() - i * o.batch_size);
        if (dist::owner_of_micro_batch(i, o.world_size) == o.rank) {
          if (train_loader.position() != i) train_loader.seek(i);  // another rank's micro-batches in between
          // Host-resident data: batch i onto the device, this rank's next one behind it (outside
          // the closure: a replayed graph runs no host code).
          train_loader.stage(i, i + o.world_size);
          trainer.micro_batch(b, [&] { return training_loss(model, train_loader.next(i)); });
          epoch_peak = std::max(epoch_peak, tracker.last_micro_batch().peak_bytes);
        } else {
          trainer.skip_micro_batch();
        }
        samples += b;  // every rank's: the epoch's samples, as one process counts them
        samples_this_run += b;
        if (trainer.step_if_ready()) {
          epoch_peak = std::max(epoch_peak, allocator_for(device).stats().allocated_peak);
          boundary.next_micro_batch = i + 1;
          boundary.counters.epoch = epoch;
          boundary.counters.micro_batch_index = acc.micro_batch_index();
          boundary.counters.micro_batches_total = acc.micro_batches_total();
          boundary.epoch_samples = samples;
        }
        if (progress.due(i + 1))
          progress.update(i + 1,
                          (loss_before_run + acc.epoch_loss_sum()) /
                              static_cast<double>(std::max<int64_t>(boundary.epoch_samples, 1)),
                          samples_this_run);
      }
      progress.end_epoch();
      // Reading the loss waits for the device, so the epoch's time below includes its queued work
      // (with graphs the host runs far ahead of the GPU).
      const double train_loss =
          (loss_before_run + acc.epoch_loss_sum()) / static_cast<double>(std::max<int64_t>(samples, 1));
      const double train_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const int64_t skipped = acc.skipped_steps() - skipped_before;
      const bool scaling = needs_loss_scaling(o.resolved_precision);
      const float loss_scale = scaling ? acc.loss_scale() : 1.0f;
      // Under fp16 loss scaling a skipped step is how the scale finds its level, not a fault; at
      // its floor (Note [Loss scaling]) the scale cannot help any more, and the user hears of it.
      const bool at_floor = scaling && loss_scale <= ao.loss_scaling.min_scale;
      if (g_root && scaling && skipped > 0 && std::isfinite(train_loss) && !at_floor && !o.quiet)
        say("fp16: %lld optimizer step(s) skipped for gradients that overflowed in fp16; loss scale now %s\n",
            static_cast<long long>(skipped), loss_scale_text(loss_scale).c_str());
      else if (g_root && (skipped > 0 || !std::isfinite(train_loss))) {
        const std::string floor_note = at_floor && skipped > 0 ? "; fp16's loss scale holds at its floor of " +
                                                                     loss_scale_text(ao.loss_scaling.min_scale) +
                                                                     ", so these gradients overflow unscaled"
                                                               : "";
        std::fprintf(stderr,
                     "fashion_mnist: warning: epoch %d: %lld optimizer step(s) skipped for non-finite gradients, "
                     "training loss %g (a NaN or Inf in the data, the weights or the loss; try a lower --lr or "
                     "--clip-grad-norm%s)%s\n",
                     epoch + 1, static_cast<long long>(skipped), train_loss, scaling ? " or --precision bf16" : "",
                     floor_note.c_str());
      }

      EvalResult r;
      try {
        if (g_root) r = evaluate(model, test_loader);  // the other ranks hold the same weights
      } catch (const Interrupted&) {
        return stop("interrupted (" + std::string(signal_name(g_signal)) + ") in the test pass of epoch " +
                        std::to_string(epoch + 1) + "; a resumed run starts with that test pass",
                    exit_code_for(g_signal), "interrupted");
      }
      say("Epoch %d\n-------------------\n", epoch + 1);
      print_test_results(r);

      nlohmann::ordered_json line = {{"epoch", epoch + 1},
                                     {"train_loss", train_loss},
                                     {"test_loss", r.avg_loss},
                                     {"test_accuracy", r.accuracy},
                                     {"samples_per_s", static_cast<double>(samples_this_run) / train_seconds},
                                     {"epoch_seconds", train_seconds},
                                     {"optimizer_steps", acc.optimizer_steps()},
                                     {"skipped_steps", acc.skipped_steps()},
                                     {"peak_bytes", epoch_peak},
                                     {"micro_batch_size", o.batch_size},
                                     {"model", o.model},
                                     {"accum_steps", acc.accum_steps() / o.world_size},  // per rank, as --accum-steps
                                     {"lr", acc.last_lr()},
                                     {"precision", o.precision},
                                     {"kernels", kernels_used(model, o, o.batch_size)}};
      if (scaling) line["loss_scale"] = loss_scale;
      if (o.world_size > 1) {
        const dist::Communicator::Stats now = comm->stats();
        line["world_size"] = o.world_size;
        line["gradient_reductions"] = now.gradient_reductions - comm_before.gradient_reductions;
        line["communication_seconds"] = now.communication_seconds - comm_before.communication_seconds;
        line["gradient_buckets"] = acc.gradient_buckets();
        line["buckets_started_in_backward"] = acc.buckets_started_in_backward() - buckets_in_backward_before;
      }
      if (model.uses_batch_statistics())
        line["batch_norm_statistics_samples"] = o.batch_size;  // per micro-batch, not per group
      if (!state.overridden.empty()) line["overrides"] = state.overridden;
      metrics.append(line);
      boundary.epoch = epoch + 1;
      boundary.next_micro_batch = 0;
      boundary.counters = acc.counters();
      boundary.counters.epoch = epoch + 1;
      boundary.counters.micro_batch_index = 0;
      boundary.epoch_samples = 0;
      checkpoint_now("epoch end");
      // After the epoch's checkpoint: nothing is lost, the next run starts the next epoch.
      if (o.world_size == 1 ? g_signal != 0 : stop_agreed())
        return stop_together(
            "interrupted (" + std::string(signal_name(g_signal)) + ") after epoch " + std::to_string(epoch + 1),
            exit_code_for(g_signal), "interrupted");
    }
  } catch (const OutOfMemory& e) {
    const int status = stop(
        std::string(e.what()) +
            "\nfashion_mnist: lower --batch-size, or let the planner fit it: --effective-batch N --memory-budget SIZE",
        1, "out of memory; resumes at the last completed step");
    if (!o.quiet) {
      print_memory_table(tracker, stdout);  // with the failing request and the largest live ops
      say("");
    }
    return status;
  } catch (const Error& e) {
    return stop(e.what(), 1, "after an error; resumes at the last completed step");
  }

  if (!o.save_path.empty()) {
    try {
      save_weights(o.save_path, model);
    } catch (const Error& e) {
      throw Error("--save: " + std::string(e.what()));
    }
    if (!o.quiet) say("weights written to %s\n", o.save_path.c_str());
  }
  if (!o.quiet && g_root) {
    print_memory_table(tracker, stdout);
    say("");
  }
  write_reports(o, tracker);
  if (g_root && o.world_size > 1 && !o.quiet) {
    const dist::Communicator::Stats st = comm->stats();
    const bool nccl = comm->backend() == "MPI+NCCL";  // Note [Communication time]
    say("data parallel: %lld gradient all-reduces (%lld transport calls, %.1f MiB per rank), %.3f s in them (%s)\n",
        static_cast<long long>(st.gradient_reductions), static_cast<long long>(st.messages),
        static_cast<double>(st.bytes_reduced) / (1 << 20), st.communication_seconds,
        nccl ? "NCCL's device time" : "the host's wait for MPI");
  }
  return g_signal == 0 ? 0 : exit_code_for(g_signal);
}

int run_and_report(Options& options, const std::shared_ptr<cumulus::dist::Communicator>& comm) {
  try {
    return run(options, comm);
  } catch (const Interrupted&) {
    // Before the first micro-batch (loading, planning) or in an --eval-only test pass: there is no
    // new state to save, and a checkpoint being resumed is left as it was.
    std::fprintf(stderr, "fashion_mnist: interrupted (%s) before training began; nothing was written\n",
                 signal_name(g_signal));
    return exit_code_for(g_signal);
  } catch (const SameOnEveryRank& e) {
    if (g_root) std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    g_agreed_exit = true;
    return 2;
  } catch (const UsageFailure& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 2;
  } catch (const cumulus::Error& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist: unexpected error: %s\n", e.what());
    return 1;
  }
}

}  // namespace
}  // namespace fmnist

int main(int argc, char** argv) {
  fmnist::Options options;
  const fmnist::ParseResult parsed = fmnist::parse_options(argc, argv, options);
  if (!parsed.proceed) return parsed.exit_code;
  std::shared_ptr<cumulus::dist::Communicator> comm;
  try {
    comm = cumulus::dist::Communicator::from_environment();
  } catch (const cumulus::Error& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 1;
  }
  const int code = fmnist::run_and_report(options, comm);
  // With several ranks, a failure on one rank ends the job: the others may be waiting in a
  // collective for it. mpirun names the rank; rank 0's last checkpoint was written atomically.
  if (code != 0 && comm->world_size() > 1 && !fmnist::g_agreed_exit) {
    std::fflush(stdout);
    std::fflush(stderr);
    comm->abort(code);
  }
  return code;
}
