// The command line, parsed and checked with CLI11 (Note [The app as a pipeline] in main.cpp): each
// flag's value as given, checked alone and against the others. A usage error is one line and exit
// code 2 before any work. As with argparse, the last value of a repeated flag wins.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>

namespace fmnist {

// The flags whose values the run's configuration takes as they are (RunConfig derives from it too).
struct FlagValues {
  std::string data_dir;  // empty: search (locate_fashion_mnist)
  int epochs = 20;
  int64_t batch_size = 64;  // the micro-batch (of each rank)
  int64_t effective_batch = 0;  // with memory_budget: the planner picks batch_size and accum_steps;
                                // with batch_size: accum_steps = effective / (batch x ranks)
  std::string memory_budget;    // as given, for messages
  int64_t memory_budget_bytes = 0;
  bool plan_only = false;  // --plan-only: print the planner's table of candidates and exit
  float lr = 1e-3f;
  int64_t lr_step_size = 0;  // step: multiply by lr_gamma every lr_step_size steps
  float lr_gamma = 0.1f;
  int64_t warmup_steps = 0;  // cosine: linear warmup, then cosine decay to min_lr at the last step
  float min_lr = 0.0f;
  float momentum = 0.0f;
  bool nesterov = false;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // AdamW
  float clip_grad_norm = 0.0f;
  bool shuffle = false;
  uint64_t seed = 0;
  std::string init_path, save_path, checkpoint_path, resume_path;
  std::string memory_report_path, trace_path, memory_plot_path, metrics_path;
  std::set<std::string> overrides;  // --override: settings a resumed run may change, e.g. {"lr"}
  int64_t train_limit = 0, test_limit = 0;
  int64_t eval_batch_size = 64;
  int threads = 0;  // CPU BLAS threads; 0: every core
  bool eval_only = false;
  bool quiet = false;
};

// The command line: the values above, and the choices as given (resolved by run_config.cpp).
struct CommandLine : FlagValues {
  std::string device = "auto";
  std::string model = "mlp";
  bool batch_size_given = false;
  int accum_steps = 1;
  std::string accum_schedule;  // "0:8,4:2"
  std::map<int, int> schedule;
  std::string lr_schedule = "constant";  // constant | step | cosine, per optimizer step
  std::string optimizer = "sgd";
  std::optional<float> weight_decay;  // default: 0 for SGD, 0.01 for AdamW (PyTorch's defaults)
  std::string normalize = "samples";
  std::string graphs = "auto";     // auto|on|off: CUDA graphs for the steady state (CUDA only)
  std::string recompute = "off";   // off|on|auto (the planner decides): activation checkpointing
  std::string data_on = "device";  // device|host|auto: where the dataset lives (host: staged batch by batch)
  std::string precision = "fp32";  // fp32|bf16|fp16|auto: the compute type of activations
  std::string kernels = "auto";    // auto|fused|generic: the MLP's training kernels (Note [Fused MLP])
};

// A usage error found after parsing (e.g. --data holds no dataset): main prints it, exit code 2.
struct UsageFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Throws UsageFailure(message) unless `ok`.
void require(bool ok, const std::string& message);

struct ParseResult {
  bool proceed = false;  // false: exit with `exit_code` (0 after --help or --version)
  int exit_code = 0;
  CommandLine command_line;
};

ParseResult parse_command_line(int argc, char** argv);

}  // namespace fmnist
