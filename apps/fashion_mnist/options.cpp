#include "run_config.h"

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <tuple>

#include "common/command_line.h"
#include "cumulus/core/error.h"
#include "cumulus/io/run_files.h"
#include "cumulus/plan/planner.h"
#include "cumulus/train/accumulation.h"

namespace fmnist {

namespace fs = std::filesystem;

void require(bool ok, const std::string& message) {
  if (!ok) throw UsageFailure(message);
}

namespace {

// Integers are checked on the text, before CLI11 converts it (cumulus::integer_text_problem).
CLI::Validator integer_in(int64_t lo, int64_t hi) {
  return CLI::Validator([lo, hi](std::string& text) { return cumulus::app::integer_text_problem(text, lo, hi); }, "INT",
                        "integer_in");
}

CLI::Validator unsigned_64() {
  return CLI::Validator([](std::string& text) { return cumulus::app::unsigned_64_text_problem(text); }, "UINT64",
                        "unsigned_64");
}

// "0.9,0.999" -> (0.9, 0.999), each in [0, 1).
std::pair<float, float> parse_betas(const std::string& text) {
  const std::size_t comma = text.find(',');
  auto bad = [&] {
    return UsageFailure("--betas '" + text + "': expected two numbers in [0, 1) as B1,B2, e.g. 0.9,0.999");
  };
  if (comma == std::string::npos) throw bad();
  char* end = nullptr;
  const std::string a = text.substr(0, comma), b = text.substr(comma + 1);
  const float b1 = std::strtof(a.c_str(), &end);
  if (a.empty() || *end != '\0' || !(b1 >= 0 && b1 < 1)) throw bad();
  const float b2 = std::strtof(b.c_str(), &end);
  if (b.empty() || *end != '\0' || !(b2 >= 0 && b2 < 1)) throw bad();
  return {b1, b2};
}

const int64_t kMaxBatch = int64_t{1} << 31;  // far above any batch a device holds; keeps sizes far from overflow
const int64_t kMaxSamples = int64_t{1} << 40;
constexpr std::size_t kDescriptionColumn = 34;

// Flags read as text and converted after parsing.
struct RawText {
  bool show_version = false;
  std::string seed = "0", betas = "0.9,0.999", overrides, optimizer_bits = "32", zero = "0";
};

// The flags, in the order --help lists them: what runs where, and how.
void add_run_flags(CLI::App& app, CommandLine& o, RawText& raw) {
  app.add_flag("--version", raw.show_version, "Print the version, commit, build type and compiled backends, then exit");
  app.add_option("--data", o.data_dir,
                 "Directory with the four Fashion-MNIST IDX files (.gz or plain). Default: $CUMULUS_DATA, "
                 "./data/fashion-mnist, ../shared/data/fashion-mnist, else downloaded into ./data/fashion-mnist "
                 "and verified by SHA-256");
  app.add_option("--device", o.device,
                 "auto (CUDA if a GPU is usable, else CPU), cpu, cuda or cuda:N. Under mpirun, auto and cuda give "
                 "each rank of a node a GPU of its own (more ranks than GPUs on a node is refused); cuda:N is "
                 "taken as given on every rank");
  app.add_option("--model", o.model,
                 "mlp: the seed's 784-512-512-10 MLP; cnn: conv-BN-ReLU-pool x 2, then 3136-128-10. Batch norm "
                 "computes its statistics per micro-batch (as every framework does): with accumulation, "
                 "16 x 4 is four batches of 16 for batch norm, not one of 64");
  app.add_option("--graphs", o.graphs,
                 "auto|on|off. On CUDA, run each micro-batch and optimizer step as a CUDA graph replay after "
                 "the first few steps (auto: on for CUDA; off: launch every kernel from the host). CPU: off")
      ->check(CLI::IsMember(choices_of(GraphsChoice{}).names()));
  app.add_option("--recompute", o.recompute,
                 "off|on|auto. on: recompute activations in backward instead of keeping them (activation "
                 "checkpointing): the [conv, batch norm] pair of each CNN block, the MLP's first two Linear+ReLU "
                 "pairs. The same gradients (bit for bit on the CPU) for less peak memory and more time. auto, "
                 "with the planner: every subset of the model's segments (the CNN's conv1+bn1 and conv2+bn2, the MLP's "
                 "one) predicted for every micro-batch, the fastest plan that fits taken")
      ->check(CLI::IsMember(choices_of(RecomputeChoice{}).names()));
  app.add_option("--precision", o.precision,
                 "fp32|bf16|fp16. bf16 and fp16 store activations and their gradients in 16 bits and run the "
                 "GEMMs on 16-bit copies of the weights with f32 accumulation; weights, gradient buffers, optimizer "
                 "state, the loss and batch-norm statistics stay f32 (mixed precision). fp16 adds dynamic loss "
                 "scaling: a step whose gradients overflow is skipped and halves the scale (it holds at its floor "
                 "of 1, and an epoch that still overflows there is warned about), 2000 clean steps double it. On "
                 "CUDA bf16 needs compute capability 8.0, fp16 7.0. auto, with the planner: fp32 and bf16 both "
                 "predicted, bf16 taken only when it is more than 2% faster or the only one that fits (an opt-in: "
                 "it changes the numbers)")
      ->check(CLI::IsMember(choices_of(cumulus::Precision{}).names("auto")));
  app.add_option("--kernels", o.kernels,
                 "auto|fused|generic: the MLP's training micro-batch. fused: our own kernels, the whole forward, "
                 "loss and backward in a few launches (3 + 3 for the seed MLP) instead of cuBLASLt calls; generic: "
                 "one op per layer (the reference). auto: fused on CUDA in fp32 for micro-batches up to 64 without "
                 "recompute (where a GPU measured it faster), generic otherwise. "
                 "fused needs --model mlp and --precision fp32; on the CPU it computes the generic path's bits")
      ->check(CLI::IsMember(choices_of(cumulus::nn::KernelChoice{}).names()));
  app.add_option("--data-on", o.data_on,
                 "device|host. device: the dataset lives on the training device as uint8 (fastest: each batch is "
                 "one gather there). host: it stays in host memory and each micro-batch is copied through pinned "
                 "memory on a copy stream one micro-batch ahead, overlapped with compute, so the device holds "
                 "only two micro-batches of data. Same results either way. auto, with the planner on CUDA: host "
                 "only when no plan with the data on the device fits. CPU: no difference (auto is device)")
      ->check(CLI::IsMember(choices_of(DataOnChoice{}).names()));
}

// The batch, accumulation and the planner.
void add_batch_flags(CLI::App& app, CommandLine& o) {
  app.add_option("--epochs", o.epochs, "Epochs to train (in total, when resuming)")->check(integer_in(1, 1000000));
  app.add_option("--batch-size", o.batch_size, "Micro-batch size (per rank with mpirun)")
      ->check(integer_in(1, kMaxBatch));
  app.add_option("--accum-steps", o.accum_steps, "Micro-batches per optimizer step (per rank with mpirun)")
      ->check(integer_in(1, 1000000));
  app.add_option("--accum-schedule", o.accum_schedule,
                 "Accumulation steps per epoch, EPOCH:STEPS,... from epoch 0 (e.g. 0:8,4:2); replaces --accum-steps");
  app.add_option("--effective-batch", o.effective_batch,
                 "Samples per optimizer step, all ranks together. With --batch-size: the accumulation steps are "
                 "effective batch / (batch size x ranks), so a job keeps its result on 1, 2 or 8 processes "
                 "(mpirun -np N). With --memory-budget instead: the planner picks the micro-batch (a divisor of it) "
                 "predicted fastest among those that fit the budget (within 2%: the one with less memory), and the "
                 "accumulation steps")
      ->check(integer_in(1, kMaxBatch))
      ->default_str("");  // 0: not given
  app.add_flag("--plan-only", o.plan_only,
               "With --effective-batch: print the planner's prediction for every micro-batch dividing it (size, "
               "recompute, predicted peak in MiB, predicted reserved bytes, whether that fits --memory-budget: '-' "
               "without one, accumulation steps, predicted time an effective batch, of it the collectives under "
               "mpirun, and an epoch), the choice and why, and exit 0 without training");
  app.add_option("--memory-budget", o.memory_budget,
                 "Device memory limit, e.g. 64MiB or 1.5GiB: the device behaves as if it had only that much; "
                 "going over is an out-of-memory error (exit 1)");
}

// The optimizer, its learning-rate schedule and the gradient's normalization.
void add_optimizer_flags(CLI::App& app, CommandLine& o, RawText& raw) {
  app.add_option("--optimizer", o.optimizer, "sgd or adamw");
  app.add_option("--lr", o.lr, "Learning rate (the peak rate with a schedule)");
  app.add_option("--lr-schedule", o.lr_schedule,
                 "constant; step: lr x --lr-gamma every --lr-step-size optimizer steps (PyTorch's StepLR); cosine: "
                 "linear warmup over --warmup-steps, then cosine decay to --min-lr at the run's last step")
      ->check(CLI::IsMember(choices_of(LrScheduleKind{}).names()));
  app.add_option("--lr-step-size", o.lr_step_size, "step schedule: optimizer steps between decays")
      ->check(integer_in(1, kMaxSamples))
      ->default_str("");  // 0: not given
  app.add_option("--lr-gamma", o.lr_gamma, "step schedule: the factor of each decay");
  app.add_option("--warmup-steps", o.warmup_steps, "cosine schedule: optimizer steps of linear warmup")
      ->check(integer_in(0, kMaxSamples));
  app.add_option("--min-lr", o.min_lr, "cosine schedule: the rate at the last step");
  app.add_option("--momentum", o.momentum, "SGD momentum");
  app.add_flag("--nesterov", o.nesterov, "SGD: Nesterov momentum (needs --momentum > 0)");
  app.add_option("--betas", raw.betas, "AdamW: B1,B2, the decay rates of the moment estimates");
  app.add_option("--eps", o.eps, "AdamW: the term added to the denominator");
  const cumulus::app::OptimizerStateHelp state_help = cumulus::app::optimizer_state_help(
      "the optimizer's state arrays (AdamW's moments, SGD's momentum)", ", and --graphs auto runs eagerly");
  app.add_option("--optimizer-bits", raw.optimizer_bits, state_help.bits)->check(CLI::IsMember({"32", "8", "auto"}));
  app.add_option("--optimizer-state", o.optimizer_state, state_help.placement)
      ->check(CLI::IsMember(choices_of(cumulus::optim::StatePlacement{}).names("auto")));
  app.add_option("--zero", raw.zero,
                 state_help.zero + ". auto, with the planner (--effective-batch): 1, then 2, only when no plan fits "
                                   "below it, rank 0 planning for every rank")
      ->check(CLI::IsMember({"0", "1", "2", "auto"}));
  app.add_flag("--reduce-every-micro-batch", o.reduce_every_micro_batch,
               "Under mpirun: reduce each micro-batch's gradient across the ranks as its backward finishes, the "
               "order --zero 2 sums in, instead of once a step (more traffic; --zero 0 and 1 then give --zero 2's "
               "bits). Not with the planner, which does not weigh it");
  app.add_option("--weight-decay", o.weight_decay, "Weight decay (default 0 for sgd, 0.01 for adamw, decoupled)");
  app.add_option("--clip-grad-norm", o.clip_grad_norm,
                 "Clip the global L2 norm of the accumulated, normalized gradient at each step (0: off)");
  app.add_option("--normalize", o.normalize,
                 "samples: divide by the samples in each group (exact for partial groups); micro-batches: the "
                 "classic mean loss / N per micro-batch (inexact for a partial last group)");
}

// Data order, files in and out, limits and output.
void add_file_flags(CLI::App& app, CommandLine& o, RawText& raw) {
  app.add_flag("--shuffle", o.shuffle, "Shuffle the training data each epoch (order from --seed and the epoch)");
  app.add_option("--seed", raw.seed, "Seed of the weight initialization and of the shuffle (0 to 2^64-1)")
      ->check(unsigned_64());
  app.add_option("--init", o.init_path, "Start from these weights (safetensors with PyTorch's state-dict names)");
  app.add_flag("--eval-only", o.eval_only,
               "Run the test pass only (with --init weights, or the seeded initialization) and print its result");
  app.add_option("--save", o.save_path, "Write the final weights here (safetensors, PyTorch's names)");
  app.add_option("--checkpoint", o.checkpoint_path,
                 "Write a checkpoint here at each epoch end and on Ctrl-C / SIGTERM / out of memory "
                 "(weights, optimizer state, counters, every setting that changes the result; atomic)");
  app.add_option("--resume", o.resume_path,
                 "Resume exactly from this checkpoint; every setting it recorded must be given the same "
                 "(may be the --checkpoint file)");
  app.add_option("--override", raw.overrides,
                 "With --resume: settings that may differ from the checkpoint's, comma-separated (" +
                     overridable_settings_text() + "); the banner and --metrics record them");
  app.add_option("--memory-report", o.memory_report_path, "Write the memory report (JSON) here");
  app.add_option("--trace", o.trace_path, "Write a Chrome trace (JSON; open in Perfetto or chrome://tracing) here");
  app.add_option("--memory-plot", o.memory_plot_path,
                 "Write an SVG plot of memory by category over the first steps here");
  app.add_option("--op-profile", o.op_profile_path,
                 "Write each op's time here (JSON: its own time, forward and backward apart, and the optimizer "
                 "step's parts) over the epochs after the first (a one-epoch run's only epoch), and print the "
                 "table (unless --quiet); --graphs auto then runs eagerly");
  app.add_option("--metrics", o.metrics_path,
                 "Write one JSON object per epoch here (epoch, train_loss, test_loss, test_accuracy, samples_per_s, "
                 "optimizer_steps, peak_bytes, ...); with --resume, the file's lines up to the checkpoint are kept");
  app.add_option("--train-limit", o.train_limit, "Use only the first N training samples (0: all)")
      ->check(integer_in(0, kMaxSamples));
  app.add_option("--test-limit", o.test_limit, "Use only the first N test samples (0: all)")
      ->check(integer_in(0, kMaxSamples));
  app.add_option("--eval-batch-size", o.eval_batch_size, "Batch size of the test pass (the seed uses 64)")
      ->check(integer_in(1, kMaxBatch));
  app.add_option("--threads", o.threads,
                 "CPU threads for the matrix products (0: every core; under mpirun, the host's cores shared "
                 "out among its ranks)")
      ->check(integer_in(0, 4096));
  app.add_flag("--quiet", o.quiet, "Print only the per-epoch results, warnings and errors");
}

// The seed, and paths given empty.
void check_texts(const CLI::App& app, CommandLine& o, const RawText& raw) {
  o.seed = std::strtoull(raw.seed.c_str(), nullptr, 10);  // checked by unsigned_64()
  // Paths: an empty value would silently write or read nothing.
  for (const char* flag : {"--data", "--init", "--save", "--checkpoint", "--resume", "--memory-report", "--trace",
                           "--memory-plot", "--metrics"}) {
    const CLI::Option* opt = app.get_option(flag);
    require(opt->count() == 0 || !opt->results().back().empty(), std::string(flag) + " needs a path, got ''");
  }
  // Any other value: an empty one would be read as 0 or as "not given" (issue 30 item 14).
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->get_expected_min() == 0 || opt->count() == 0 || !opt->results().back().empty()) continue;
    throw UsageFailure(opt->get_name() + " needs a value, got ''");
  }
}

// The model, the optimizer and its learning-rate schedule.
void check_optimizer(const CLI::App& app, CommandLine& o, const RawText& raw) {
  parse_choice<ModelKind>(o.model);  // the choices are resolved later (run_config.cpp); checked here, in order
  require(std::isfinite(o.lr) && o.lr > 0, "--lr must be a positive number, got " + std::to_string(o.lr));
  parse_choice<OptimizerKind>(o.optimizer);
  require(std::isfinite(o.momentum) && o.momentum >= 0 && o.momentum < 1,
          "--momentum must be in [0, 1), got " + std::to_string(o.momentum));
  require(o.optimizer == "sgd" || (o.momentum == 0 && !o.nesterov),
          "--momentum and --nesterov apply to --optimizer sgd only");
  require(!o.nesterov || o.momentum > 0, "--nesterov needs --momentum > 0");
  o.zero_by_planner = raw.zero == "auto";
  o.zero_stage = o.zero_by_planner ? 0 : std::stoi(raw.zero);
  o.optimizer_bits_by_planner = raw.optimizer_bits == "auto";
  o.optimizer_bits = o.optimizer_bits_by_planner ? 32 : std::stoi(raw.optimizer_bits);
  require((o.optimizer_bits == 32 && !o.optimizer_bits_by_planner) || o.optimizer == "adamw" || o.momentum > 0,
          "--optimizer-bits " + raw.optimizer_bits +
              " needs optimizer state: --optimizer adamw, or sgd with --momentum > 0");
  require(o.optimizer == "adamw" || (app.count("--betas") == 0 && app.count("--eps") == 0),
          "--betas and --eps apply to --optimizer adamw only");
  std::tie(o.beta1, o.beta2) = parse_betas(raw.betas);
  require(std::isfinite(o.eps) && o.eps > 0, "--eps must be a positive number, got " + std::to_string(o.eps));
  require(!o.weight_decay || (std::isfinite(*o.weight_decay) && *o.weight_decay >= 0), "--weight-decay must be >= 0");
  require(std::isfinite(o.clip_grad_norm) && o.clip_grad_norm >= 0, "--clip-grad-norm must be >= 0");
  parse_choice<cumulus::train::Normalization>(o.normalize);
  if (o.lr_schedule == "step") {
    require(o.lr_step_size > 0, "--lr-schedule step needs --lr-step-size N (optimizer steps between decays)");
    require(std::isfinite(o.lr_gamma) && o.lr_gamma > 0 && o.lr_gamma <= 1, "--lr-gamma must be in (0, 1]");
  } else {
    require(app.count("--lr-step-size") == 0 && app.count("--lr-gamma") == 0,
            "--lr-step-size and --lr-gamma apply to --lr-schedule step only");
  }
  if (o.lr_schedule == "cosine") {
    require(std::isfinite(o.min_lr) && o.min_lr >= 0 && o.min_lr <= o.lr, "--min-lr must be in [0, --lr]");
  } else {
    require(app.count("--warmup-steps") == 0 && app.count("--min-lr") == 0,
            "--warmup-steps and --min-lr apply to --lr-schedule cosine only");
  }
}

// Accumulation, the memory budget, --effective-batch and --recompute auto.
void check_batch(const CLI::App& app, CommandLine& o) {
  if (!o.accum_schedule.empty()) {
    require(app.count("--accum-steps") == 0, "give --accum-steps or --accum-schedule, not both");
    as_usage([&] { o.schedule = cumulus::app::parse_accum_schedule(o.accum_schedule); }, "--accum-schedule ");
  }
  if (!o.memory_budget.empty()) {
    as_usage([&] { o.memory_budget_bytes = cumulus::plan::parse_byte_size(o.memory_budget); }, "--memory-budget: ");
    require(o.memory_budget_bytes > 0, "--memory-budget must be > 0");
  }
  require(!o.plan_only || o.effective_batch > 0,
          "--plan-only needs --effective-batch (its divisors are the candidates)");
  const bool elastic = o.effective_batch > 0 && o.batch_size_given;  // BatchSource::elastic
  if (elastic) {
    require(app.count("--accum-steps") == 0 && o.accum_schedule.empty(),
            "--effective-batch with --batch-size sets the accumulation steps; do not give --accum-steps too");
    require(!o.plan_only, "--plan-only runs the planner: give --effective-batch without --batch-size");
  } else if (o.effective_batch > 0) {
    require(o.memory_budget_bytes > 0 || o.plan_only,
            "--effective-batch needs --batch-size (accumulation steps from it) or --memory-budget (the planner "
            "picks the micro-batch)");
    require(app.count("--accum-steps") == 0 && o.accum_schedule.empty(),
            "--effective-batch chooses --batch-size and --accum-steps; do not give them too");
  }
  const bool planner = o.effective_batch > 0 && !elastic && (o.memory_budget_bytes > 0 || o.plan_only);
  require(!planner || !o.reduce_every_micro_batch,
          "--reduce-every-micro-batch with the planner (--memory-budget or --plan-only): it does not weigh it; give "
          "--batch-size and --accum-steps instead");
  for (const auto& [flag, automatic] : {std::pair<const char*, bool>{"--recompute", o.recompute == "auto"},
                                        {"--data-on", o.data_on == "auto"},
                                        {"--optimizer-state", o.optimizer_state == "auto"},
                                        {"--optimizer-bits", o.optimizer_bits_by_planner},
                                        {"--zero", o.zero_by_planner},
                                        {"--precision", o.precision == "auto"}})
    require(!automatic || planner, std::string(flag) +
                                       " auto lets the planner decide: give --effective-batch and "
                                       "--memory-budget or --plan-only (not --batch-size)");
}

// --override NAME,...: the settings a resumed run may change.
void parse_overrides(CommandLine& o, const RawText& raw) {
  as_usage([&] { o.overrides = settings_table().parse_overrides(raw.overrides, overridable_settings_text()); });
  require(o.overrides.empty() || !o.resume_path.empty(), "--override applies to --resume only");
}

// --data, --init and --resume, and the modes they combine with.
void check_input_files(const CommandLine& o) {
  if (!o.data_dir.empty()) {
    std::error_code ec;
    require(fs::is_directory(o.data_dir, ec), "--data '" + o.data_dir + "': no such directory");
  }
  as_usage([&] { cumulus::io::check_inputs_readable({{"--init", o.init_path}, {"--resume", o.resume_path}}); });
  require(o.init_path.empty() || o.resume_path.empty(), "give --init or --resume, not both");
  require(!o.eval_only || o.resume_path.empty(), "--eval-only evaluates --init weights; give --init, not --resume");
}

}  // namespace

ParseResult parse_command_line(int argc, char** argv) {
  ParseResult result;
  CommandLine& o = result.command_line;
  CLI::App app{
      "fashion_mnist: the seed experiment of cumulus. Trains the 784-512-512-10 MLP (or a small CNN) on "
      "Fashion-MNIST with gradient accumulation (micro-batch x accumulation steps = effective batch), prints the "
      "test accuracy and loss after each epoch in the seed's format, and reports where the memory went. The last "
      "value of a repeated flag wins.\n"
      "Exit codes: 0 done, 1 runtime failure (e.g. out of memory, a damaged file), 2 usage error, 130 interrupted "
      "(Ctrl-C: the current optimizer step finishes and --checkpoint is written), 143 terminated (SIGTERM, same), "
      "141 standard output closed (e.g. piped into head; same).",
      "fashion_mnist"};
  app.get_formatter()->column_width(kDescriptionColumn);
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)->always_capture_default();
  RawText raw;
  add_run_flags(app, o, raw);
  add_batch_flags(app, o);
  add_optimizer_flags(app, o, raw);
  add_file_flags(app, o, raw);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s",
                cumulus::app::wrap_help_text(app.help(), cumulus::app::help_columns() - 1, kDescriptionColumn).c_str());
    return result;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "fashion_mnist: %s (see --help)\n", e.what());
    result.exit_code = 2;
    return result;
  }
  if (raw.show_version) {
    std::printf("%s", cumulus::app::version_text("fashion_mnist").c_str());
    return result;
  }
  o.batch_size_given = app.count("--batch-size") > 0;

  try {
    check_texts(app, o, raw);
    check_optimizer(app, o, raw);
    check_batch(app, o);
    parse_overrides(o, raw);
    check_input_files(o);
  } catch (const UsageFailure& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    result.exit_code = 2;
    return result;
  }
  result.proceed = true;
  return result;
}

}  // namespace fmnist
