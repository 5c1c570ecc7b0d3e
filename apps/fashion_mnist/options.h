// Command-line options of fashion_mnist, parsed and checked with CLI11. Usage errors (bad values,
// unknown device, unreadable paths) are reported in one line and give exit code 2 before any work.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

#include "cumulus/core/device.h"
#include "cumulus/optim/accumulator.h"

namespace fmnist {

struct Options {
  std::string data_dir;  // empty: search (see data_files.h)
  std::string device = "auto";
  std::string model = "mlp";
  int epochs = 20;
  int64_t batch_size = 64;  // the micro-batch
  int accum_steps = 1;
  std::string accum_schedule;  // "0:8,4:2"
  std::map<int, int> schedule;
  int64_t effective_batch = 0;  // with memory_budget: the planner picks batch_size and accum_steps
  std::string memory_budget;
  int64_t memory_budget_bytes = 0;
  float lr = 1e-3f;
  std::string optimizer = "sgd";
  float momentum = 0.0f;
  std::optional<float> weight_decay;  // default: 0 for SGD, 0.01 for AdamW (PyTorch's defaults)
  float clip_grad_norm = 0.0f;
  std::string normalize = "samples";
  bool shuffle = false;
  uint64_t seed = 0;
  std::string init_path, save_path, checkpoint_path, resume_path;
  std::string memory_report_path, trace_path, memory_plot_path, metrics_path;
  int64_t train_limit = 0, test_limit = 0;
  int64_t eval_batch_size = 64;
  bool quiet = false;
  std::string graphs = "auto";  // auto|on|off: CUDA graphs for the steady state (CUDA only)

  cumulus::Device resolved_device;
  bool use_graphs = false;  // resolved from `graphs` and the device
  cumulus::optim::Normalization normalization() const;
  float resolved_weight_decay() const { return weight_decay.value_or(optimizer == "adamw" ? 0.01f : 0.0f); }
};

// A usage error found after parsing (e.g. --data holds no dataset): main prints it, exit code 2.
struct UsageFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct ParseResult {
  bool proceed = false;  // false: exit with `exit_code` (0 after --help)
  int exit_code = 0;
};

ParseResult parse_options(int argc, char** argv, Options& options);

// "0:8,4:2" -> {{0, 8}, {4, 2}}; throws cumulus::InvalidArgument naming the text.
std::map<int, int> parse_accum_schedule(const std::string& text);

}  // namespace fmnist
