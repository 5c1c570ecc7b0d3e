// gpt's command line: the flags of `gpt train` and `gpt sample`, their checks, and the two commands.
// A usage error (a flag's value, a combination of flags, a path that cannot serve) is a UsageError
// naming the flag: exit 2. Everything else (the data, the files' contents, memory) exits 1.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace gpt {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct TrainFlags {
  std::string data, metrics, save, resume, init, memory_report, memory_plot, op_profile,
      device = "cpu", precision = "fp32", recompute = "off";
  int64_t context = 64, width = 128, heads = 4, layers = 4, micro_batch = 8, accum_steps = 4, steps = 200;
  int64_t warmup = 20, eval_every = 50, eval_windows = 64, log_every = 10, stop_after = 0;
  std::string seed_text = "1337";  // parsed by check_train_flags into seed (CLI11 clamps past 2^63 - 1)
  int64_t seed = 1337;
  int64_t effective_batch = 0;  // windows; > 0: the planner chooses --micro-batch and --accum-steps
  std::string memory_budget;
  int threads = 0;
  std::string optimizer_bits_text = "32";  // 32|8|auto, parsed by check_train_flags into:
  int optimizer_bits = 32;  // AdamW's moments: f32, or 8-bit block-wise (optim::AdamWOptions::state_bits)
  std::string optimizer_state = "device";  // device|host|auto: where AdamW's state lives (Optimizer::place_state)
  std::string zero_text = "0";  // 0|1|2|auto, parsed by check_train_flags into:
  int zero = 0;  // under mpirun, the ZeRO stage: 1 AdamW's state sharded over the ranks, 2 the gradients too
  bool reduce_every_micro_batch = false;  // under mpirun, in stage 2's order (AccumulationOptions's)
  double lr = 1e-3, min_lr = 1e-4, weight_decay = 0.1, beta1 = 0.9, beta2 = 0.99, clip = 1.0;
  bool quiet = false;
};

struct SampleFlags {
  std::string load, prompt = "\n", device = "cpu";
  int64_t length = 500, top_k = 0;
  std::string seed_text = "1337";
  int64_t seed = 1337;
  double temperature = 0.8;
  int threads = 0;
};

void add_train_flags(CLI::App& command, TrainFlags& flags);
void add_sample_flags(CLI::App& command, SampleFlags& flags);

// The combinations of flags that no single flag's check refuses, and the seeds; fills `seed`.
void check_train_flags(TrainFlags& flags);
void check_sample_flags(SampleFlags& flags);

// The commands (train.cpp, sample.cpp): each returns the exit code or throws.
int train(const TrainFlags& flags);
int sample(const SampleFlags& flags);

// printf to standard output; a failed write asks the run to stop (request_stop(SIGPIPE)) so that
// it saves and then reports the failure (check_standard_output), instead of training unseen.
void say(const char* format, ...) __attribute__((format(printf, 1, 2)));
// Under mpirun only rank 0 says anything (errors go to standard error from every rank).
void say_only_on_rank(int rank);

}  // namespace gpt
