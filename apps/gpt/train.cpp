// gpt train: the files checked (io::check_run_files) before any work, then the model, the
// optimizer and the loop; the state saved at each evaluation, at the end and on a stop.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include <cumulus/cumulus.h>
#include <cumulus/data/token_windows.h>
#include <cumulus/dist/collective_times.h>
#include <cumulus/dist/communicator.h>
#include <cumulus/io/run_files.h>
#include <cumulus/models/gpt.h>

#include "common/command_line.h"
#include "common/metrics_log.h"
#include "common/stop_signal.h"

#include "flags.h"
#include "run_state.h"

using namespace cumulus;

namespace gpt {
namespace {

Device parse_device(const std::string& text) {
  try {
    return app::device_from_flag(text);
  } catch (const Error& e) {
    throw UsageError("--device " + text + ": " + e.what());
  }
}

// Note [Data parallel gpt]
// Under mpirun every rank draws the same windows by micro-batch index (TokenWindows::random_batch)
// and trains those dist::owner_of_micro_batch gives it, skipping the others'; the Trainer counts
// every rank's micro-batches and sums the gradients across ranks at each step (Note [Data parallel
// accumulation] in engine/dist/communicator.cpp). So N ranks of --accum-steps A train the groups of
// one process with A x N, and the run records A x N: its checkpoint resumes on any number of ranks
// whose accumulation makes the same groups, one process included. Every rank reads it. Rank 0
// prints, evaluates and writes --save and --metrics; rank k > 0 writes its own memory report, plot
// and op profile as FILE.rank<k>. With --effective-batch rank 0 plans its part of it for every rank
// (plan_run) and each rank trains within --memory-budget.
void place_on_ranks(TrainFlags& f, const dist::Communicator& comm) {
  if (comm.world_size() == 1) return;
  if (f.effective_batch % comm.world_size() != 0)
    throw UsageError("--effective-batch " + std::to_string(f.effective_batch) + " does not divide over " +
                     std::to_string(comm.world_size()) + " ranks; give a multiple of the world size");
  say_only_on_rank(comm.rank());
  if (comm.is_root()) return;
  f.metrics.clear();
  for (std::string* path : {&f.memory_report, &f.memory_plot, &f.op_profile})
    if (!path->empty()) *path += ".rank" + std::to_string(comm.rank());
}

std::string fmt(const char* format, double a, double b = 0, double c = 0, double d = 0, double e = 0) {
  char buf[512];
  std::snprintf(buf, sizeof buf, format, a, b, c, d, e);
  return buf;
}

// Every file the run reads and writes, checked together before any work. A resume reads the
// metrics it continues (when there are some) and may write over its own weights, state and metrics.
void check_train_files(const TrainFlags& f, const Corpus& corpus) {
  io::RunFiles files;
  files.inputs = {{"--data", corpus.path}, {"--init", f.init}, {"--resume", f.resume}};
  if (!f.resume.empty()) {
    files.inputs.push_back({"--resume's training state", state_path(f.resume)});
    std::error_code ec;
    if (std::filesystem::exists(std::filesystem::symlink_status(f.metrics, ec)))
      files.inputs.push_back({"--metrics", f.metrics});
  }
  files.outputs = {{"--save", f.save},
                   {"--save's training state", f.save.empty() ? "" : state_path(f.save)},
                   {"--metrics", f.metrics},
                   {"--memory-report", f.memory_report},
                   {"--memory-plot", f.memory_plot},
                   {"--op-profile", f.op_profile}};
  files.may_replace = [](const io::RunFile& in, const io::RunFile& out) {
    return (in.name == "--resume" && out.name == "--save") ||
           (in.name == "--resume's training state" && out.name == "--save's training state") ||
           (in.name == "--metrics" && out.name == "--metrics");
  };
  try {
    io::check_run_files(files);
  } catch (const InvalidArgument& e) {
    throw UsageError(e.what());
  }
}

// The model the size flags describe, over a vocabulary of vocab_size.
models::GPTConfig gpt_config(const TrainFlags& f, int64_t vocab_size) {
  models::GPTConfig config;
  config.vocab_size = vocab_size;
  config.block_size = f.context;
  config.n_layer = f.layers;
  config.n_head = f.heads;
  config.n_embd = f.width;
  try {
    config.validate();
  } catch (const InvalidArgument& e) {
    throw UsageError(std::string("--width/--heads/--layers: ") + e.what());
  }
  return config;
}

std::unique_ptr<models::GPT> make_model(const models::GPTConfig& config, uint64_t seed, Device device) {
  Generator gen(seed);
  try {
    return std::make_unique<models::GPT>(config, gen, device);
  } catch (const std::bad_alloc&) {
    int64_t params = 0;
    for (const models::GPTTensorLayout& t : models::gpt_state_layout(config)) params += t.shape.numel();
    throw OutOfMemory("out of memory while allocating the model (" + std::to_string(params) + " parameters, " +
                      std::to_string(params * 4) + " bytes)");
  }
}

// The corpus as tokens of `vocab`: a byte it lacks (a resumed run's vocabulary is its checkpoint's)
// is the data's fault, named with the file.
std::vector<int32_t> encode_corpus(const models::CharVocabulary& vocab, const std::string& text, const Corpus& corpus,
                                   const std::string& resume) {
  try {
    return vocab.encode(text);
  } catch (const InvalidArgument& e) {
    throw Error(corpus.flag + " '" + corpus.path + "': " + e.what() + " (the vocabulary of --resume '" + resume +
                "'); resume with the text the run was trained on");
  }
}

optim::AdamWOptions adamw_options(const TrainFlags& f) {
  optim::AdamWOptions adamw;
  adamw.lr = static_cast<float>(f.lr);
  adamw.beta1 = static_cast<float>(f.beta1);
  adamw.beta2 = static_cast<float>(f.beta2);
  adamw.weight_decay = static_cast<float>(f.weight_decay);
  adamw.state_bits = f.optimizer_bits;
  return adamw;
}

// AdamW over the model's flat parameters, weight decay on its matrices only, the state where
// --optimizer-state puts it (auto: on the device until the planner places it).
std::shared_ptr<optim::AdamW> make_optimizer(const TrainFlags& f, models::GPT& model) {
  const optim::AdamWOptions adamw = adamw_options(f);
  auto optimizer = std::make_shared<optim::AdamW>(std::make_shared<nn::FlatParameters>(model), adamw);
  optimizer->set_param_groups(optim::decay_matrices_only(model.named_parameters(), adamw.weight_decay));
  optimizer->place_state(f.optimizer_state == "host" ? optim::StatePlacement::host : optim::StatePlacement::device);
  return optimizer;
}

// Cosine decay after a linear warmup over --steps (none for --steps 0).
std::shared_ptr<const optim::LRSchedule> make_schedule(const TrainFlags& f) {
  if (f.steps == 0) return nullptr;
  return std::make_shared<optim::CosineWarmupLR>(static_cast<float>(f.lr), f.warmup, f.steps,
                                                 static_cast<float>(f.min_lr));
}

// The threads this rank runs: --threads, or (0) every core it may use; ranks on one host share its
// cores, each its share.
int rank_threads(const TrainFlags& f, const dist::Communicator& comm) {
  if (comm.world_size() > 1 && f.threads == 0)
    return fit_cpu_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / comm.local_size()));
  return use_cpu_threads(f.threads);
}

// The chosen plan as the ranks share it: what the planner left in place on rank 0, for the others.
struct PlanChoice {
  int64_t micro_batch = 0, accum_steps = 0;  // windows and this rank's micro-batches a step
  int zero = 0, bits = 32;
  std::string state = "device";
  uint32_t recompute = 0;
  int64_t predicted_peak_bytes = 0;  // rank 0's
  double predicted_step_seconds = 0.0;
};

std::string choice_text(const PlanChoice& c) {
  return std::to_string(c.micro_batch) + " " + std::to_string(c.accum_steps) + " " + std::to_string(c.zero) + " " +
         std::to_string(c.bits) + " " + c.state + " " + std::to_string(c.recompute) + " " +
         std::to_string(c.predicted_peak_bytes) + " " + fmt("%.17g", c.predicted_step_seconds);
}

PlanChoice parse_choice(const std::string& text) {
  PlanChoice c;
  std::istringstream in(text);
  in >> c.micro_batch >> c.accum_steps >> c.zero >> c.bits >> c.state >> c.recompute >> c.predicted_peak_bytes >>
      c.predicted_step_seconds;
  if (!in) throw Error("gpt: rank 0's plan '" + text + "' did not arrive whole");
  return c;
}

int64_t budget_bytes(const TrainFlags& f) {
  if (f.memory_budget.empty()) return 0;
  int64_t budget = 0;
  try {
    budget = plan::parse_byte_size(f.memory_budget);
  } catch (const Error& e) {
    throw UsageError("--memory-budget " + f.memory_budget + ": " + e.what());
  }
  if (budget <= 0) throw UsageError("--memory-budget " + f.memory_budget + ": must be more than 0 bytes");
  return budget;
}

// Rank 0's planning for this rank's part of --effective-batch (under mpirun, as rank 0 of the world:
// its shard is the largest; Note [Plan levers]). It prints the reason and leaves its choice in place.
PlanChoice plan_on_root(models::GPT& model, optim::Optimizer& optimizer, const data::TokenWindows& windows,
                        const TrainFlags& f, int world, const dist::CollectiveTimes& collectives) {
  plan::PlanRequest request = models::plan_request(model, optimizer, windows, f.effective_batch / world * f.context,
                                                   budget_bytes(f), f.recompute == "auto");
  request.budget_name = f.memory_budget.empty() ? "" : "--memory-budget " + f.memory_budget;
  request.weigh_state_placement = f.optimizer_state == "auto";
  request.weigh_state_bits = f.optimizer_bits_text == "auto";
  request.world_size = world;
  request.setting.zero_stage = f.zero;
  request.weigh_zero = f.zero_text == "auto" && world > 1;
  request.collective_times = collectives;
  if (world > 1) say("planner: collectives measured: %s\n", collectives.text().c_str());
  const plan::Plan plan = plan::plan_batch(request);
  say("planner: %s\n", plan.reason.c_str());
  PlanChoice c;
  c.micro_batch = plan.micro_batch / f.context;
  c.accum_steps = plan.accum_steps;
  c.zero = plan.setting.zero_stage;
  c.bits = optimizer.state_bits();
  c.state = optim::state_placement_name(optimizer.state_placement());
  c.recompute = model.recompute_segments();
  for (const plan::PlanRow& r : plan.table)
    if (r.chosen) c.predicted_peak_bytes = r.peak_bytes, c.predicted_step_seconds = r.batch_seconds;
  return c;
}

// --effective-batch: the planner's choice of micro-batch and accumulation steps (and, with
// --recompute auto, of recompute; with --optimizer-state, --optimizer-bits or --zero auto, of where
// AdamW's state lives, in how many bits and how it is sharded) for the model and optimizer as they
// are. Rank 0 plans; every rank takes its choice (a refusal ends every rank with its reason).
PlanChoice plan_run(models::GPT& model, optim::Optimizer& optimizer, const data::TokenWindows& windows, TrainFlags& f,
                    dist::Communicator& comm) {
  // Every rank times the collectives together; rank 0 plans with them (Note [Collective time model]).
  const nn::FlatParameters& flat = optimizer.parameters();
  const dist::CollectiveTimes collectives =
      dist::measure_collective_times(comm, flat, train::TrainerOptions().bucket_bytes);
  std::string shared;
  if (comm.is_root()) {
    try {
      shared = choice_text(plan_on_root(model, optimizer, windows, f, comm.world_size(), collectives));
    } catch (const Error& e) {
      shared = std::string("refused ") + e.what();
      if (comm.world_size() == 1) throw;
      comm.broadcast_from_root(shared);
      throw;
    }
  }
  shared = comm.broadcast_from_root(shared);
  if (shared.rfind("refused ", 0) == 0) throw Error(shared.substr(8));
  const PlanChoice c = parse_choice(shared);
  model.set_recompute_segments(c.recompute);
  optimizer.place_state(c.state == "host" ? optim::StatePlacement::host : optim::StatePlacement::device);
  optimizer.set_state_bits(c.bits);
  f.micro_batch = c.micro_batch;
  f.accum_steps = c.accum_steps;
  f.zero = c.zero;
  f.optimizer_state = c.state;
  f.optimizer_bits = c.bits;
  return c;
}

// The chosen plan's prediction for the run (its steps and rank 0's peak), for the memory report.
plan::PlanCheck plan_check(const PlanChoice& c, const TrainFlags& f) {
  plan::PlanCheck check;
  check.micro_batch = c.micro_batch * f.context;
  check.accum_steps = c.accum_steps;
  check.predicted_epoch_seconds = c.predicted_step_seconds * static_cast<double>(f.steps);
  check.predicted_peak_bytes = c.predicted_peak_bytes;
  return check;
}

// The prediction against the run's training (its evaluations and saves included) and its peak.
void check_plan(memory::MemoryTracker& tracker, double seconds) {
  tracker.measure_plan(0, seconds, tracker.summary().peak_bytes);
  const plan::PlanCheck& c = *tracker.plan_check();
  say("planner: predicted peak %lld bytes and %.3g s for the run's steps; measured peak %lld bytes and %.3g s\n",
      static_cast<long long>(c.predicted_peak_bytes), c.predicted_epoch_seconds,
      static_cast<long long>(c.measured_peak_bytes), c.measured_epoch_seconds);
}

// The tracker's table (unless --quiet), its JSON report and timeline plot, and one line of
// activation bytes per token.
void report_memory(memory::MemoryTracker& tracker, const TrainFlags& f, bool root) {
  if (!f.quiet && root) memory::print_memory_table(tracker, stdout);
  memory::MemoryReportFiles files;
  files.report.path = f.memory_report;
  files.plot.path = f.memory_plot;
  files.links = io::OutputLinks::replace;
  memory::write_memory_reports(tracker, files);
  const memory::MemorySummary m = tracker.summary();
  say("memory: activations %.0f bytes per token, peak %.2f MiB\n", m.activation_bytes_per_unit,
      static_cast<double>(m.peak_bytes) / (1 << 20));
  if (const ops::CudaAttentionCalls calls = ops::cuda_attention_calls(); calls.cudnn + calls.own > 0)
    say("memory: attention ran %lld times on cuDNN's fused SDPA, %lld on our own kernels\n",
        static_cast<long long>(calls.cudnn), static_cast<long long>(calls.own));
}

// The corpus's text, its vocabulary (a resumed run's is its checkpoint's) and its split into
// training and validation tokens.
struct Text {
  std::string text;
  models::CharVocabulary vocab;
  models::TokenSplit split;
};

Text read_text(const TrainFlags& f, const Corpus& corpus) {
  Text t;
  t.text = read_corpus(corpus);
  t.vocab =
      f.resume.empty() ? models::CharVocabulary::of_text(t.text) : models::read_gpt_checkpoint(f.resume).vocabulary;
  const std::vector<int32_t> tokens = encode_corpus(t.vocab, t.text, corpus, f.resume);
  try {
    t.split = models::split_tokens(tokens, 0.9, f.context + 1);
  } catch (const InvalidArgument& e) {
    throw UsageError("--context " + std::to_string(f.context) + ": " + e.what());
  }
  return t;
}

// --precision, refused where the device cannot run it.
Precision checked_precision(const TrainFlags& f, Device device) {
  const Precision precision = parse_precision(f.precision);
  if (const std::string why = precision_unsupported_reason(precision, device); !why.empty())
    throw UsageError("--precision " + f.precision + ": " + why);
  return precision;
}

// The model on `device`: --init's weights if given, recomputation and compute dtype as flagged;
// --effective-batch checked against the training text.
std::unique_ptr<models::GPT> build_model(const TrainFlags& f, const Text& t, Device device, Precision precision) {
  std::unique_ptr<models::GPT> model = make_model(gpt_config(f, t.vocab.size()), static_cast<uint64_t>(f.seed), device);
  if (!f.init.empty()) models::load_gpt_initial_weights(f.init, *model, t.vocab);
  model->set_recompute(f.recompute == "on");
  model->set_compute_dtype(compute_dtype(precision));
  if (f.effective_batch > 0 && f.effective_batch * f.context > t.split.train.numel())
    throw UsageError("--effective-batch " + std::to_string(f.effective_batch) +
                     ": more tokens than the training text holds");
  return model;
}

memory::MemoryTracker::Options tracker_options(const TrainFlags& f) {
  memory::MemoryTracker::Options tracking;
  tracking.model = "gpt " + std::to_string(f.layers) + " x " + std::to_string(f.width);
  tracking.micro_batch_size = f.micro_batch * f.context;  // tokens
  tracking.accum_steps = static_cast<int>(f.accum_steps);
  tracking.timeline_steps = f.memory_plot.empty() ? 0 : 4;
  return tracking;
}

// The Trainer's options; each step's log (its mean loss and lr) lands in `last_step`.
train::TrainerOptions trainer_options(const TrainFlags& f, Precision precision, memory::MemoryTracker& tracker,
                                      train::StepLog& last_step, const std::shared_ptr<dist::Communicator>& comm) {
  train::TrainerOptions options;
  options.tracker = &tracker;
  options.accum_steps = static_cast<int>(f.accum_steps * comm->world_size());  // every rank's micro-batches
  if (comm->world_size() > 1) {
    options.communicator = comm;
    options.zero_stage = f.zero;
    options.reduce_every_micro_batch = f.reduce_every_micro_batch;
  }
  options.clip_grad_norm = static_cast<float>(f.clip);
  options.loss_scaling.dynamic = needs_loss_scaling(precision);
  options.on_step = [&last_step](const train::StepLog& log) { last_step = log; };
  return options;
}

void print_banner(const TrainFlags& f, const Corpus& corpus, const Text& t, const models::GPT& model,
                  const Device& device, Precision precision, const dist::Communicator& comm) {
  say("gpt: %s, %lld tokens (vocabulary %lld; train %lld, validation %lld), %lld parameters, %lld x %lld x %lld "
      "tokens a step\n",
      corpus.path.c_str(), static_cast<long long>(t.text.size()), static_cast<long long>(t.vocab.size()),
      static_cast<long long>(t.split.train.numel()), static_cast<long long>(t.split.validation.numel()),
      static_cast<long long>(model.num_parameters()), static_cast<long long>(f.micro_batch),
      static_cast<long long>(f.accum_steps * comm.world_size()), static_cast<long long>(f.context));
  // The GEMMs' speed depends on which OpenBLAS kernels run (an environment may choose narrower ones).
  if (f.device == "cpu")
    say("cpu: %d thread%s, %s kernels, OpenBLAS %s kernels\n", f.threads, f.threads == 1 ? "" : "s", cpu_capability(),
        blas_core());
  if (comm.world_size() > 1)
    say("data parallel: %d ranks (%s), each %lld x %lld windows a step, ZeRO stage %d%s\n", comm.world_size(),
        dist::transports_text().c_str(), static_cast<long long>(f.micro_batch), static_cast<long long>(f.accum_steps),
        f.zero,
        f.zero == 1   ? " (AdamW's state sharded)"
        : f.zero == 2 ? " (AdamW's state and the gradients sharded)"
                      : "");
  if (f.optimizer_state == "host") say("optimizer: AdamW's state in host memory, updated there\n");
  // Which attention runs on the GPU (cuDNN's fused SDPA by default, ours under CUMULUS_CUDA_ATTENTION=own).
  if (device.is_cuda())
    say("cuda: attention on %s\n", ops::cuda_attention_description(compute_dtype(precision)).c_str());
}

// The training loop and what it writes: a metrics line and a log line a step, the validation loss
// and the state at each evaluation.
class Loop {
 public:
  Loop(const TrainFlags& f, models::GPT& model, const models::CharVocabulary& vocab, train::Trainer& trainer,
       const std::vector<train::RecordedSetting>& settings, app::MetricsLog& metrics, const train::StepLog& last_step,
       dist::Communicator& comm)
      : f_(f),
        model_(model),
        vocab_(vocab),
        trainer_(trainer),
        settings_(settings),
        metrics_(metrics),
        last_step_(last_step),
        comm_(comm),
        group_(f.accum_steps * comm.world_size()),
        profile_(trainer.optimizer().parameters().device()) {}

  // Outside --memory-budget's limit: gathering and writing the state is not the plan's memory.
  void save() {
    if (f_.save.empty()) return;
    const MemoryLimitScope unlimited(allocator_for(trainer_.optimizer().parameters().device()), 0);
    save_run(f_.save, model_, vocab_, trainer_, settings_, comm_.is_root());
  }
  // Rank 0 evaluates (the ranks hold the same weights); every rank takes part in the save.
  void evaluate(int64_t step, const data::TokenWindows& val_windows) {
    if (comm_.is_root()) {
      const double val = models::validation_loss(model_, val_windows, f_.micro_batch, f_.eval_windows);
      say("step %lld: validation loss %.6f\n", static_cast<long long>(step), val);
      metrics_.append(fmt("{\"step\": %.0f, \"val_loss\": %.9g}", double(step), val));
    }
    save();
  }
  // Micro-batches [first, total) of the run, within --memory-budget (what the planner planned
  // within, on every rank). Returns the exit code when the run stopped before its last step (a
  // signal, --stop-after), nothing when it ran to the end.
  std::optional<int> run(int64_t first, int64_t total, const data::TokenWindows& train_windows,
                         const data::TokenWindows& val_windows) {
    const MemoryLimitScope limit(allocator_for(trainer_.optimizer().parameters().device()), budget_bytes(f_));
    const auto started = std::chrono::steady_clock::now();
    const std::optional<int> stopped = run_micro_batches(first, total, train_windows, val_windows);
    seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return stopped;
  }
  double seconds() const { return seconds_; }  // the last run's

  // --op-profile: the table (unless --quiet) and the JSON of the steps profiled so far.
  void report_profile() {
    if (f_.op_profile.empty()) return;
    if (profiled_steps_ == 0) say("op time: no step after the first ran, nothing profiled\n");
    else if (!f_.quiet) say("%s", profile_.table(20, profiled_steps_, "step").c_str());
    try {
      io::write_file_atomic(f_.op_profile, profile_.json(profiled_steps_, "step"), io::OutputLinks::replace);
    } catch (const Error& e) {
      throw Error("--op-profile: " + std::string(e.what()));
    }
  }

 private:
  std::optional<int> run_micro_batches(int64_t first, int64_t total, const data::TokenWindows& train_windows,
                                       const data::TokenWindows& val_windows) {
    trainer_.begin_epoch(0, total, first);
    step_start_ = std::chrono::steady_clock::now();
    for (int64_t i = first; i < total; ++i) {
      // --op-profile: the micro-batches and steps after the run's first step (its warm-up), not
      // the evaluations or the saves.
      const bool profiled = !f_.op_profile.empty() && i >= first + group_;
      std::optional<OpProfileScope> timed;
      if (profiled) timed.emplace(profile_);
      const bool stepped = train_micro_batch(i, train_windows);
      timed.reset();
      if (!stepped) continue;
      profiled_steps_ += profiled ? 1 : 0;
      const int64_t step = (i + 1) / group_;
      log_step(step);
      const bool evaluated = f_.eval_every > 0 && step % f_.eval_every == 0 && step != f_.steps;
      if (evaluated) evaluate(step, val_windows);
      if ((app::stop_requested_on_any_rank(comm_) || step == f_.stop_after) && step != f_.steps) {
        if (!evaluated) save();
        report_profile();
        say("gpt: stopped after step %lld%s\n", static_cast<long long>(step),
            f_.save.empty() ? " (no --save: nothing to resume from)" : ("; resume with --resume " + f_.save).c_str());
        io::check_standard_output();
        return app::stop_requested() ? app::exit_code_for_stop(app::stop_signal()) : 0;
      }
    }
    return std::nullopt;
  }

  // Micro-batch i (this rank's, or another's skipped), then the step if its group is complete.
  bool train_micro_batch(int64_t i, const data::TokenWindows& train_windows) {
    if (dist::owner_of_micro_batch(i, comm_.world_size()) == comm_.rank()) {
      const data::Batch batch = train_windows.random_batch(i, f_.micro_batch);
      trainer_.micro_batch(batch.units, [&] { return model_.loss(batch.x, batch.y, ops::Reduction::Sum); });
    } else {
      trainer_.skip_micro_batch();  // another rank's (Note [Data parallel gpt])
    }
    return trainer_.step_if_ready();
  }

  void log_step(int64_t step) {
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - step_start_).count();
    step_start_ = now;
    const double tokens_per_step = static_cast<double>(f_.micro_batch * group_ * f_.context);
    const double loss = last_step_.loss;
    const float lr = last_step_.lr;
    metrics_.append(
        fmt("{\"step\": %.0f, \"loss\": %.9g, \"lr\": %.9g, \"step_seconds\": %.6f, \"tokens_per_second\": %.1f}",
            double(step), loss, lr, seconds, tokens_per_step / seconds));
    if (!f_.quiet && (step % f_.log_every == 0 || step == 1))
      say("step %5lld/%lld  loss %.4f  lr %.2e  %.0f ms  %.0f tokens/s\n", static_cast<long long>(step),
          static_cast<long long>(f_.steps), loss, lr, seconds * 1e3, tokens_per_step / seconds);
  }

  const TrainFlags& f_;
  models::GPT& model_;
  const models::CharVocabulary& vocab_;
  train::Trainer& trainer_;
  const std::vector<train::RecordedSetting>& settings_;
  app::MetricsLog& metrics_;
  const train::StepLog& last_step_;  // the Trainer's on_step writes it
  dist::Communicator& comm_;
  const int64_t group_;  // micro-batches a step, every rank's
  std::chrono::steady_clock::time_point step_start_;
  double seconds_ = 0.0;
  OpProfile profile_;
  int64_t profiled_steps_ = 0;
};

}  // namespace

int train(const TrainFlags& flags) {
  TrainFlags f = flags;
  check_train_flags(f);
  const std::shared_ptr<dist::Communicator> comm = dist::Communicator::from_environment();
  place_on_ranks(f, *comm);
  const Device device =
      comm->world_size() > 1 && f.device != "cpu" ? dist::device_for_rank(*comm) : parse_device(f.device);
  const Precision precision = checked_precision(f, device);
  const Corpus corpus = locate_corpus(f.data);
  check_train_files(f, corpus);
  f.threads = rank_threads(f, *comm);
  const Text t = read_text(f, corpus);

  const std::unique_ptr<models::GPT> model_ptr = build_model(f, t, device, precision);
  models::GPT& model = *model_ptr;
  const std::shared_ptr<optim::AdamW> optimizer = make_optimizer(f, model);
  const data::TokenWindows train_windows(t.split.train, f.context, static_cast<uint64_t>(f.seed), device);
  const data::TokenWindows val_windows(t.split.validation, f.context, 0, device);
  std::optional<PlanChoice> plan;
  if (f.effective_batch > 0) plan = plan_run(model, *optimizer, train_windows, f, *comm);
  train::StepLog last_step;
  memory::MemoryTracker tracker(device, tracker_options(f));
  if (plan && comm->is_root()) tracker.set_plan_check(plan_check(*plan, f));
  train::Trainer trainer(optimizer, trainer_options(f, precision, tracker, last_step, comm), make_schedule(f));
  TrainFlags recorded = f;
  recorded.accum_steps *= comm->world_size();  // every rank's: resumable in one process
  const int64_t total = f.steps * recorded.accum_steps;
  const std::vector<train::RecordedSetting> settings = run_settings(recorded, t.text);
  const int64_t first =
      f.resume.empty() ? 0 : resume_run(f.resume, model, trainer, settings, total, recorded.accum_steps);
  if (!f.resume.empty() && first == total) {
    say("gpt: --resume %s finished its %lld steps; nothing to do\n", f.resume.c_str(), static_cast<long long>(f.steps));
    return 0;
  }
  // A resumed run keeps the lines up to its checkpoint's step (the micro-batch's, skipped steps
  // included); one line per step, appended.
  app::MetricsLog metrics(f.metrics, "step",
                          f.resume.empty() ? std::nullopt : std::optional<int64_t>(first / recorded.accum_steps),
                          app::MetricsWrites::append);
  if (!f.quiet) print_banner(f, corpus, t, model, device, precision, *comm);
  Loop loop(f, model, t.vocab, trainer, settings, metrics, last_step, *comm);
  // Ctrl-C (SIGINT) or SIGTERM: the step in progress finishes, --save is written, and the run ends
  // with 130 (resume with --resume). A lost standard output stops it the same way, then fails.
  app::install_stop_handlers();
  if (const std::optional<int> stopped = loop.run(first, total, train_windows, val_windows)) return *stopped;
  if (plan && comm->is_root()) check_plan(tracker, loop.seconds());
  if (f.steps == 0) {
    loop.save();
    io::check_standard_output();
    return 0;
  }
  loop.evaluate(f.steps, val_windows);
  loop.report_profile();
  report_memory(tracker, f, comm->is_root());
  io::check_standard_output();
  return 0;
}

}  // namespace gpt
