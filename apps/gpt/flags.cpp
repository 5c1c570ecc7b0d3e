#include "flags.h"

#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "common/command_line.h"
#include "common/stop_signal.h"

namespace gpt {
namespace {

constexpr const char* kThreadsHelp =
    "CPU threads (0: every core this process may run on, or OPENBLAS_NUM_THREADS / OMP_NUM_THREADS where set)";

// CLI11's number checks pass NaN (every comparison with it is false), and infinities reach the
// optimizer; a number flag is finite first.
const CLI::Validator kFinite(
    [](std::string& text) {
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      return end != text.c_str() && *end == '\0' && std::isfinite(v) ? std::string() : "not a finite number: " + text;
    },
    "FINITE");

// Sampling divides the logits by the temperature: below this a float logit overflows to infinity.
constexpr double kMinTemperature = 1e-4, kMaxTemperature = 1e4;

// A seed: decimal digits, at most 2^63 - 1 (what the run records and the generator takes).
int64_t parse_seed(const std::string& text) {
  const bool digits = !text.empty() && text.size() <= 19 && text.find_first_not_of("0123456789") == std::string::npos;
  errno = 0;
  const unsigned long long v = digits ? std::strtoull(text.c_str(), nullptr, 10) : 0;
  if (!digits || errno == ERANGE || v > static_cast<unsigned long long>(INT64_MAX))
    throw UsageError("--seed " + text + ": expected an integer in [0, 9223372036854775807]");
  return static_cast<int64_t>(v);
}

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// The data, the model's shape, the batch and its split, the run's length.
void add_model_and_batch_flags(CLI::App& c, TrainFlags& f) {
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
}

// AdamW, its schedule and state, sharding and clipping.
void add_optimizer_flags(CLI::App& c, TrainFlags& f) {
  c.add_option("--lr", f.lr, "peak learning rate")->check(kFinite)->check(CLI::PositiveNumber);
  c.add_option("--min-lr", f.min_lr, "learning rate at the end of the cosine decay")
      ->check(kFinite)
      ->check(CLI::NonNegativeNumber);
  c.add_option("--warmup", f.warmup, "linear warmup steps")->check(CLI::Range(0, 1 << 30));
  c.add_option("--weight-decay", f.weight_decay, "AdamW decoupled weight decay, on 2-D weights only")
      ->check(kFinite)
      ->check(CLI::NonNegativeNumber);
  c.add_option("--beta1", f.beta1, "AdamW beta1")->check(kFinite)->check(CLI::Range(0.0, 1.0));
  c.add_option("--beta2", f.beta2, "AdamW beta2")->check(kFinite)->check(CLI::Range(0.0, 1.0));
  const cumulus::app::OptimizerStateHelp state_help = cumulus::app::optimizer_state_help("AdamW's moments");
  c.add_option("--optimizer-bits", f.optimizer_bits_text, state_help.bits)->check(CLI::IsMember({"32", "8", "auto"}));
  c.add_option("--optimizer-state", f.optimizer_state, state_help.placement)
      ->check(CLI::IsMember({"device", "host", "auto"}));
  c.add_option("--zero", f.zero_text,
               state_help.zero +
                   ". auto, with the planner (--effective-batch): 1, then 2, only when no plan fits "
                   "below it, the prediction rank 0's")
      ->check(CLI::IsMember({"0", "1", "2", "auto"}));
  c.add_flag("--reduce-every-micro-batch", f.reduce_every_micro_batch,
             "under mpirun: reduce each micro-batch's gradient across the ranks as its backward finishes, the "
             "order --zero 2 sums in, instead of once a step (more traffic; --zero 0 and 1 then give --zero 2's "
             "bits). Not with --effective-batch (the planner does not weigh it)");
  c.add_option("--clip", f.clip, "clip the gradient's global L2 norm to this (0: off)")
      ->check(kFinite)
      ->check(CLI::NonNegativeNumber);
}

// Where and how the steps run: seed, threads, device, precision, recompute, evaluation, progress.
void add_execution_flags(CLI::App& c, TrainFlags& f) {
  c.add_option("--seed", f.seed_text, "initialization and window seed, in [0, 2^63 - 1]");
  c.add_option("--threads", f.threads, kThreadsHelp)->check(CLI::Range(0, 1024));
  c.add_option("--device", f.device, "cpu, cuda[:N] or auto (a GPU where one is usable, else the CPU)");
  c.add_option("--precision", f.precision,
               "the activations' type: fp32, bf16 or fp16 (weights, gradients and AdamW stay fp32; fp16 with "
               "dynamic loss scaling). On CUDA, bf16 and fp16 attention runs on cuDNN's fused SDPA where the build "
               "has it, CUMULUS_CUDA_ATTENTION=own on our own kernels (the banner says which; fp32 always runs ours)")
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
}

// What the run writes and reads (metrics, reports, weights, the resume) and how much it prints.
void add_output_flags(CLI::App& c, TrainFlags& f) {
  c.add_option("--metrics", f.metrics, "JSON lines: one per step, one per evaluation");
  c.add_option("--memory-report", f.memory_report, "the memory tracker's report (JSON) at the end");
  c.add_option("--memory-plot", f.memory_plot, "the memory timeline of the first steps (SVG) at the end");
  c.add_option("--op-profile", f.op_profile,
               "each op's time (its own, forward and backward apart, and the optimizer step's parts) over the "
               "steps after the first, as JSON at the end; the table is printed (unless --quiet)");
  c.add_option("--save", f.save,
               "weights (safetensors, nanoGPT's names: PyTorch loads them strictly) at each evaluation, at the end, "
               "and on Ctrl-C or --stop-after; the training state (AdamW's moments, counters) goes beside them in "
               "FILE.state");
  c.add_option("--resume", f.resume, "continue the run a --save of the same flags and data left (FILE and FILE.state)");
  c.add_option("--init", f.init,
               "initial weights (safetensors with nanoGPT's names) instead of the seeded ones; a file cumulus "
               "wrote must be of this model's size, heads and vocabulary");
  c.add_flag("--quiet", f.quiet, "only evaluations, warnings and errors");
}

}  // namespace

void add_train_flags(CLI::App& c, TrainFlags& f) {
  c.option_defaults()->always_capture_default()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  add_model_and_batch_flags(c, f);
  add_optimizer_flags(c, f);
  add_execution_flags(c, f);
  add_output_flags(c, f);
}

void add_sample_flags(CLI::App& c, SampleFlags& f) {
  c.option_defaults()->always_capture_default()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  c.add_option("--load", f.load, "weights written by gpt train --save")->required();
  // The default, a newline, would print as a line break in --help: the help says it instead.
  c.add_option("--prompt", f.prompt, "text to continue (default: a newline)")->capture_default_str()->default_str("");
  c.add_option("--length", f.length, "new characters")->check(CLI::Range(0, 1 << 24));
  c.add_option("--temperature", f.temperature,
               "softmax temperature (0: the most likely character; else in [1e-4, 1e4])")
      ->check(kFinite)
      ->check(CLI::NonNegativeNumber);
  c.add_option("--top-k", f.top_k, "sample among the K most likely (0: all)")->check(CLI::Range(0, 1 << 20));
  c.add_option("--seed", f.seed_text, "sampling seed, in [0, 2^63 - 1]");
  c.add_option("--device", f.device, "cpu, cuda[:N] or auto (a GPU where one is usable, else the CPU)");
  c.add_option("--threads", f.threads, kThreadsHelp)->check(CLI::Range(0, 1024));
}

void check_train_flags(TrainFlags& f) {
  f.seed = parse_seed(f.seed_text);
  f.optimizer_bits = f.optimizer_bits_text == "8" ? 8 : 32;  // auto: 32 until the planner decides
  f.zero = f.zero_text == "auto" ? 0 : std::stoi(f.zero_text);
  const std::pair<const char*, bool> planned[] = {{"--memory-budget", !f.memory_budget.empty()},
                                                  {"--recompute auto", f.recompute == "auto"},
                                                  {"--optimizer-state auto", f.optimizer_state == "auto"},
                                                  {"--optimizer-bits auto", f.optimizer_bits_text == "auto"},
                                                  {"--zero auto", f.zero_text == "auto"}};
  for (const auto& [flag, given] : planned)
    if (f.effective_batch == 0 && given)
      throw UsageError(std::string(flag) + " needs --effective-batch (the planner decides)");
  if (f.reduce_every_micro_batch && f.effective_batch > 0)
    throw UsageError(
        "--reduce-every-micro-batch with --effective-batch: the planner does not weigh it; give "
        "--micro-batch and --accum-steps instead");
  if (f.steps > 0 && f.warmup >= f.steps)
    throw UsageError("--warmup " + std::to_string(f.warmup) + " must be less than --steps " + std::to_string(f.steps));
  if (!f.init.empty() && !f.resume.empty())
    throw UsageError("--init " + f.init + " with --resume " + f.resume +
                     ": a resumed run continues from its own weights; give one of them");
}

void check_sample_flags(SampleFlags& f) {
  f.seed = parse_seed(f.seed_text);
  if (f.temperature != 0.0 && (f.temperature < kMinTemperature || f.temperature > kMaxTemperature))
    throw UsageError("--temperature " + number_text(f.temperature) +
                     ": expected 0 (the most likely character) or a value in [1e-4, 1e4]");
}

namespace {
bool g_silent = false;  // a rank other than 0
}  // namespace

void say_only_on_rank(int rank) { g_silent = rank != 0; }

void say(const char* format, ...) {
  if (g_silent) return;
  std::va_list args;
  va_start(args, format);
  std::vprintf(format, args);
  va_end(args);
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) cumulus::app::request_stop(SIGPIPE);
}

}  // namespace gpt
