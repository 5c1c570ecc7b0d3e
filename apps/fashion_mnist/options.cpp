#include "options.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "cumulus/core/error.h"
#include "cumulus/memory/planner.h"

namespace fmnist {

using cumulus::InvalidArgument;
namespace fs = std::filesystem;

cumulus::optim::Normalization Options::normalization() const {
  return normalize == "micro-batches" ? cumulus::optim::Normalization::micro_batches
                                      : cumulus::optim::Normalization::samples;
}

std::map<int, int> parse_accum_schedule(const std::string& text) {
  std::map<int, int> out;
  std::size_t pos = 0;
  auto bad = [&](const std::string& why) {
    return InvalidArgument("--accum-schedule '" + text + "': " + why + " (expected EPOCH:STEPS,... starting at 0, e.g. 0:8,4:2)");
  };
  while (pos <= text.size()) {
    const std::size_t comma = text.find(',', pos);
    const std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    const std::size_t colon = item.find(':');
    if (colon == std::string::npos) throw bad("'" + item + "' has no ':'");
    char* end = nullptr;
    const long epoch = std::strtol(item.c_str(), &end, 10);
    if (end != item.c_str() + colon || epoch < 0 || epoch > 1000000) throw bad("bad epoch in '" + item + "'");
    const char* steps_text = item.c_str() + colon + 1;
    const long steps = std::strtol(steps_text, &end, 10);
    if (*steps_text == '\0' || *end != '\0' || steps <= 0 || steps > 1000000) throw bad("bad steps in '" + item + "'");
    if (!out.emplace(static_cast<int>(epoch), static_cast<int>(steps)).second) throw bad("epoch " + std::to_string(epoch) + " given twice");
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (out.empty() || out.begin()->first != 0) throw bad("the schedule must start at epoch 0");
  return out;
}

namespace {

// A usage error: one line on stderr, exit code 2.
struct UsageError {
  std::string message;
};

void require(bool ok, const std::string& message) {
  if (!ok) throw UsageError{message};
}

void check_readable_file(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  std::error_code ec;
  require(fs::is_regular_file(path, ec), flag + " '" + path + "': no such file");
  require(::access(path.c_str(), R_OK) == 0, flag + " '" + path + "': not readable");
}

void check_writable_target(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  std::error_code ec;
  require(!fs::is_directory(path, ec), flag + " '" + path + "' is a directory; give a file name");
  fs::path parent = fs::path(path).parent_path();
  if (parent.empty()) parent = ".";
  require(fs::is_directory(parent, ec), flag + " '" + path + "': directory '" + parent.string() + "' does not exist");
  require(::access(parent.c_str(), W_OK) == 0, flag + " '" + path + "': directory '" + parent.string() + "' is not writable");
}

}  // namespace

ParseResult parse_options(int argc, char** argv, Options& o) {
  CLI::App app{
      "fashion_mnist: the seed experiment of cumulus. Trains the 784-512-512-10 MLP on Fashion-MNIST with\n"
      "gradient accumulation (micro-batch x accumulation steps = effective batch), prints the test accuracy\n"
      "and loss after each epoch in the seed's format, and reports where the memory went.\n"
      "Exit codes: 0 done, 1 runtime failure (e.g. out of memory), 2 usage error, 130 interrupted (Ctrl-C,\n"
      "after finishing the current optimizer step and writing --checkpoint), 143 terminated (SIGTERM, same).",
      "fashion_mnist"};
  app.get_formatter()->column_width(34);

  app.add_option("--data", o.data_dir,
                 "Directory with the four Fashion-MNIST IDX files (.gz or plain). Default: $CUMULUS_DATA, "
                 "./data/fashion-mnist, ../shared/data/fashion-mnist, else downloaded into ./data/fashion-mnist "
                 "and verified by SHA-256");
  app.add_option("--device", o.device, "auto (CUDA if a GPU is usable, else CPU), cpu, cuda or cuda:N")->capture_default_str();
  app.add_option("--model", o.model,
                 "mlp: the seed's 784-512-512-10 MLP; cnn: conv-BN-ReLU-pool x 2, then 3136-128-10. Batch norm "
                 "computes its statistics per micro-batch (as every framework does): with accumulation, "
                 "16 x 4 is four batches of 16 for batch norm, not one of 64")
      ->capture_default_str();
  app.add_option("--graphs", o.graphs,
                 "auto|on|off. On CUDA, run each micro-batch and optimizer step as a CUDA graph replay after "
                 "the first few steps (auto: on for CUDA; off: launch every kernel from the host). CPU: off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_option("--epochs", o.epochs, "Epochs to train (in total, when resuming)")->capture_default_str();
  app.add_option("--batch-size", o.batch_size, "Micro-batch size")->capture_default_str();
  app.add_option("--accum-steps", o.accum_steps, "Micro-batches per optimizer step")->capture_default_str();
  app.add_option("--accum-schedule", o.accum_schedule,
                 "Accumulation steps per epoch, EPOCH:STEPS,... from epoch 0 (e.g. 0:8,4:2); replaces --accum-steps");
  app.add_option("--effective-batch", o.effective_batch,
                 "With --memory-budget: the samples per optimizer step; the planner probes a micro-batch and picks "
                 "the largest micro-batch (a divisor of it) that fits the budget, and the accumulation steps");
  app.add_option("--memory-budget", o.memory_budget,
                 "Device memory limit, e.g. 64MiB or 1.5GiB: the device behaves as if it had only that much; "
                 "going over is an out-of-memory error (exit 1)");
  app.add_option("--lr", o.lr, "Learning rate")->capture_default_str();
  app.add_option("--optimizer", o.optimizer, "sgd or adamw")->capture_default_str();
  app.add_option("--momentum", o.momentum, "SGD momentum")->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "Weight decay (default 0 for sgd, 0.01 for adamw, decoupled)");
  app.add_option("--clip-grad-norm", o.clip_grad_norm,
                 "Clip the global L2 norm of the accumulated, normalized gradient at each step (0: off)")
      ->capture_default_str();
  app.add_option("--normalize", o.normalize,
                 "samples: divide by the samples in each group (exact for partial groups); micro-batches: the "
                 "classic mean loss / N per micro-batch (inexact for a partial last group)")
      ->capture_default_str();
  app.add_flag("--shuffle", o.shuffle, "Shuffle the training data each epoch (order from --seed and the epoch)");
  app.add_option("--seed", o.seed, "Seed of the weight initialization and of the shuffle")->capture_default_str();
  app.add_option("--init", o.init_path, "Start from these weights (safetensors with PyTorch's state-dict names)");
  app.add_option("--save", o.save_path, "Write the final weights here (safetensors, PyTorch's names)");
  app.add_option("--checkpoint", o.checkpoint_path,
                 "Write a checkpoint here at each epoch end and on Ctrl-C / SIGTERM / out of memory "
                 "(weights, optimizer state, counters; atomic)");
  app.add_option("--resume", o.resume_path, "Resume exactly from this checkpoint");
  app.add_option("--memory-report", o.memory_report_path, "Write the memory report (JSON) here");
  app.add_option("--trace", o.trace_path, "Write a Chrome trace (JSON; open in Perfetto or chrome://tracing) here");
  app.add_option("--memory-plot", o.memory_plot_path, "Write an SVG plot of memory by category over the first steps here");
  app.add_option("--metrics", o.metrics_path,
                 "Write one JSON object per epoch here (epoch, train_loss, test_loss, test_accuracy, samples_per_s, "
                 "optimizer_steps, peak_bytes, ...); with --resume, appended");
  app.add_option("--train-limit", o.train_limit, "Use only the first N training samples (0: all)")->capture_default_str();
  app.add_option("--test-limit", o.test_limit, "Use only the first N test samples (0: all)")->capture_default_str();
  app.add_option("--eval-batch-size", o.eval_batch_size, "Batch size of the test pass (the seed uses 64)")->capture_default_str();
  app.add_flag("--quiet", o.quiet, "No banner and no progress; the per-epoch results and errors only");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return {false, 0};
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "fashion_mnist: %s (see --help)\n", e.what());
    return {false, 2};
  }

  try {
    require(o.model == "mlp" || o.model == "cnn", "--model '" + o.model + "': unknown model (expected mlp or cnn)");
    require(o.epochs > 0, "--epochs must be > 0, got " + std::to_string(o.epochs));
    require(o.batch_size > 0, "--batch-size must be > 0, got " + std::to_string(o.batch_size));
    require(o.accum_steps > 0, "--accum-steps must be > 0, got " + std::to_string(o.accum_steps));
    require(o.eval_batch_size > 0, "--eval-batch-size must be > 0, got " + std::to_string(o.eval_batch_size));
    require(o.train_limit >= 0, "--train-limit must be >= 0, got " + std::to_string(o.train_limit));
    require(o.test_limit >= 0, "--test-limit must be >= 0, got " + std::to_string(o.test_limit));
    require(std::isfinite(o.lr) && o.lr > 0, "--lr must be a positive number, got " + std::to_string(o.lr));
    require(o.optimizer == "sgd" || o.optimizer == "adamw", "--optimizer '" + o.optimizer + "': expected sgd or adamw");
    require(std::isfinite(o.momentum) && o.momentum >= 0 && o.momentum < 1,
            "--momentum must be in [0, 1), got " + std::to_string(o.momentum));
    require(o.optimizer == "sgd" || o.momentum == 0, "--momentum applies to --optimizer sgd only");
    require(!o.weight_decay || (std::isfinite(*o.weight_decay) && *o.weight_decay >= 0),
            "--weight-decay must be >= 0");
    require(std::isfinite(o.clip_grad_norm) && o.clip_grad_norm >= 0, "--clip-grad-norm must be >= 0");
    require(o.normalize == "samples" || o.normalize == "micro-batches",
            "--normalize '" + o.normalize + "': expected samples or micro-batches");
    if (!o.accum_schedule.empty()) {
      require(app.count("--accum-steps") == 0, "give --accum-steps or --accum-schedule, not both");
      try {
        o.schedule = parse_accum_schedule(o.accum_schedule);
      } catch (const InvalidArgument& e) {
        throw UsageError{e.what()};
      }
    }
    if (!o.memory_budget.empty()) {
      try {
        o.memory_budget_bytes = cumulus::parse_byte_size(o.memory_budget);
      } catch (const InvalidArgument& e) {
        throw UsageError{std::string("--memory-budget: ") + e.what()};
      }
      require(o.memory_budget_bytes > 0, "--memory-budget must be > 0");
    }
    require(o.effective_batch >= 0, "--effective-batch must be > 0");
    if (o.effective_batch > 0) {
      require(o.memory_budget_bytes > 0, "--effective-batch needs --memory-budget (the planner fits the batch to it)");
      require(app.count("--batch-size") == 0 && app.count("--accum-steps") == 0 && o.accum_schedule.empty(),
              "--effective-batch chooses --batch-size and --accum-steps; do not give them too");
    }
    if (!o.data_dir.empty()) {
      std::error_code ec;
      require(fs::is_directory(o.data_dir, ec), "--data '" + o.data_dir + "': no such directory");
    }
    check_readable_file("--init", o.init_path);
    check_readable_file("--resume", o.resume_path);
    require(o.init_path.empty() || o.resume_path.empty(), "give --init or --resume, not both");
    check_writable_target("--save", o.save_path);
    check_writable_target("--checkpoint", o.checkpoint_path);
    check_writable_target("--memory-report", o.memory_report_path);
    check_writable_target("--trace", o.trace_path);
    check_writable_target("--memory-plot", o.memory_plot_path);
    check_writable_target("--metrics", o.metrics_path);

    if (o.device == "auto") {
      o.resolved_device = cumulus::cuda_available() ? cumulus::Device::cuda(0) : cumulus::Device::cpu();
    } else {
      try {
        o.resolved_device = cumulus::Device::parse(o.device);
        cumulus::check_device_available(o.resolved_device);
      } catch (const cumulus::Error& e) {
        throw UsageError{"--device: " + std::string(e.what())};
      }
    }
    require(o.graphs != "on" || o.resolved_device.is_cuda(),
            "--graphs on needs a CUDA device (the device is " + o.resolved_device.str() + ")");
    o.use_graphs = o.resolved_device.is_cuda() && o.graphs != "off";
  } catch (const UsageError& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.message.c_str());
    return {false, 2};
  }
  return {true, 0};
}

}  // namespace fmnist
