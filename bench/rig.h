// What the benchmarks share: synthetic data held on the device, the seed MLP with flat parameters,
// the optimizers of the comparison, a device timer for manual time, and one tracked micro-batch to
// read the memory figures. Header-only: each benchmark binary includes it once.
//
// Timing (device work timed with CUDA events after warm-up; bench/README.md): every timed
// region is bracketed by two TimePoints on the benchmark's device. On CPU they read the host clock;
// on CUDA they are events on the device's stream, so the time is the device's work (including the
// gaps where the GPU waited for the host to launch, which is what a small MLP really pays). The
// benchmarks report it with state.SetIterationTime() under UseManualTime(). Memory is measured in a
// separate, untimed pass with the engine's MemoryTracker, so no counter read perturbs the timing.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cumulus/core/device.h"
#include "cumulus/core/timer.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/memory/tracker.h"
#include "cumulus/models/mlp.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/ops/loss.h"
#include "cumulus/optim/adamw.h"
#include "cumulus/optim/sgd.h"
#include "cumulus/train/trainer.h"

namespace cumulus::bench {

constexpr int64_t kDataRows = 4096;  // synthetic samples on the device; micro-batches cycle over them
constexpr int kWarmupIterations = 3;  // untimed repetitions of the timed work before timing starts

// x: [n, 784] f32 uniform in [0, 1) from a seeded Generator, y: [n] i32 with y[i] = i % 10, both on
// `device` in category `data` (as the app's device-resident dataset).
struct Data {
  Tensor x, y;
  int64_t rows() const { return x.size(0); }
};

inline Data make_data(Device device, int64_t n = kDataRows) {
  Generator gen(7);
  std::vector<float> x(static_cast<std::size_t>(n * models::SeedMLP::kInputs));
  gen.fill_uniform(x.data(), static_cast<int64_t>(x.size()), 0.0f, 1.0f);
  std::vector<int32_t> y(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) y[static_cast<std::size_t>(i)] = static_cast<int32_t>(i % 10);
  MemoryCategoryScope scope(MemoryCategory::data);
  return {Tensor::from_vector(x, Shape{n, models::SeedMLP::kInputs}, device), Tensor::from_vector(y, Shape{n}, device)};
}

// Consecutive micro-batches of `b` rows, wrapping to the start (as an epoch would, minus the tail).
class Cursor {
 public:
  Cursor(const Data& data, int64_t b) : data_(data), b_(b) {}
  int64_t next() {
    if (start_ + b_ > data_.rows()) start_ = 0;
    const int64_t s = start_;
    start_ += b_;
    return s;
  }

 private:
  const Data& data_;
  int64_t b_;
  int64_t start_ = 0;
};

// The seed model (784-512-512-10, PyTorch's initialization) with its parameters and gradients
// packed into flat buffers, as the app builds it. Its training loss runs on `kernels`: the generic
// ops by default, the fused op (Note [Fused MLP] in engine/ops/fused_mlp.cpp) where a family says so.
struct Model {
  explicit Model(Device device, models::KernelChoice kernels = models::KernelChoice::generic)
      : gen(0), net(gen, device), params(std::make_shared<nn::FlatParameters>(net)) {
    net.set_kernels(kernels);
  }
  Generator gen;
  models::SeedMLP net;
  std::shared_ptr<nn::FlatParameters> params;
};

// Summed cross-entropy of rows [start, start + b): what Trainer::backward expects.
inline Tensor micro_batch_loss(Model& m, const Data& d, int64_t start, int64_t b) {
  return m.net.loss(d.x.narrow_rows(start, b), d.y.narrow_rows(start, b), ops::Reduction::Sum);
}

enum class OptimizerKind { sgd, sgd_momentum, adamw, sgd_momentum_8bit, adamw_8bit };

inline const char* optimizer_name(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::sgd: return "sgd";
    case OptimizerKind::sgd_momentum: return "sgd_momentum";
    case OptimizerKind::adamw: return "adamw";
    case OptimizerKind::sgd_momentum_8bit: return "sgd_momentum_8bit";
    case OptimizerKind::adamw_8bit: return "adamw_8bit";
  }
  return "?";
}

// The seed's SGD (lr 1e-3), SGD with momentum 0.9, AdamW with PyTorch's defaults; the last two
// with their state in 8 bits.
inline std::shared_ptr<optim::Optimizer> make_optimizer(OptimizerKind k, std::shared_ptr<nn::FlatParameters> p) {
  const bool eight = k == OptimizerKind::sgd_momentum_8bit || k == OptimizerKind::adamw_8bit;
  if (k == OptimizerKind::adamw || k == OptimizerKind::adamw_8bit) {
    optim::AdamWOptions a;
    a.state_bits = eight ? 8 : 32;
    return std::make_shared<optim::AdamW>(std::move(p), a);
  }
  optim::SGDOptions o;
  o.lr = 1e-3f;
  o.state_bits = eight ? 8 : 32;
  if (k == OptimizerKind::sgd_momentum || k == OptimizerKind::sgd_momentum_8bit) o.momentum = 0.9f;
  return std::make_shared<optim::SGD>(std::move(p), o);
}

// A Trainer that never reaches a group boundary by itself: for benchmarks that time
// micro-batches only and decide themselves when gradients are stale.
inline train::TrainerOptions never_stepping() {
  train::TrainerOptions o;
  o.accum_steps = 1 << 30;
  return o;
}

// Seconds of device work between start() and seconds() (host clock on CPU, events on CUDA).
class DeviceTimer {
 public:
  explicit DeviceTimer(Device device) : device_(device) {}
  void start() { start_ = TimePoint::now(device_); }
  double seconds() const { return TimePoint::now(device_).ms_since(start_) * 1e-3; }

 private:
  Device device_;
  TimePoint start_;
};

// The timed loop of a benchmark without launch counting: `before` then `work`, kWarmupIterations
// times untimed; then per benchmark iteration `before` untimed and `work` timed on the device.
// Returns the timed seconds in total.
template <typename Before, typename Work>
double timed_loop(benchmark::State& state, const Device& device, Before before, Work work) {
  for (int i = 0; i < kWarmupIterations; ++i) {
    before();
    work();
  }
  synchronize(device);
  DeviceTimer timer(device);
  double total_s = 0.0;
  for (auto _ : state) {
    before();
    timer.start();
    work();
    const double s = timer.seconds();
    state.SetIterationTime(s);
    total_s += s;
  }
  return total_s;
}

// Kernel launches through cumulus since construction (CUDA; always 0 on a CPU-only run).
class LaunchCounter {
 public:
  LaunchCounter() : start_(cuda_kernel_launches()) {}
  int64_t count() const { return cuda_kernel_launches() - start_; }

 private:
  int64_t start_;
};

// Memory of one micro-batch as the MemoryTracker reports it.
struct MicroBatchMemory {
  int64_t activation_bytes = 0;    // held for backward at the end of forward
  int64_t peak_bytes = 0;          // allocated peak during forward + backward, every category
  int64_t peak_data_bytes = 0;     // of which the synthetic dataset (category data)
};

// Runs one micro-batch of `b` samples under a MemoryTracker (untimed); its gradient lands in the
// buffers like any other backward.
inline MicroBatchMemory measure_micro_batch(Model& m, train::Trainer& acc, const Data& d, int64_t b) {
  memory::MemoryTracker::Options o;
  o.model = "seed_mlp";
  o.micro_batch_size = b;
  o.timeline_steps = 0;
  memory::MemoryTracker tracker(m.params->device(), o);
  tracker.begin_micro_batch(0, 0, b);
  Tensor loss = micro_batch_loss(m, d, 0, b);
  tracker.end_forward();
  acc.backward(loss, b);
  loss = Tensor();
  tracker.end_backward();
  const memory::MicroBatchRecord& r = tracker.micro_batches().front();
  return {r.activation_bytes, r.peak_bytes, r.peak_by_category[static_cast<std::size_t>(MemoryCategory::data)]};
}

// ---- counters ----------------------------------------------------------------------------------
inline benchmark::Counter bytes_counter(int64_t bytes) {
  return benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kDefaults,
                            benchmark::Counter::kIs1024);
}

inline void set_memory_counters(benchmark::State& state, const MicroBatchMemory& mem) {
  state.counters["activation_bytes_per_micro_batch"] = bytes_counter(mem.activation_bytes);
  state.counters["peak_bytes"] = bytes_counter(mem.peak_bytes);
  state.counters["peak_bytes_excl_data"] = bytes_counter(mem.peak_bytes - mem.peak_data_bytes);
}

// ---- registration and main -------------------------------------------------------------------
// A cumulus error inside a benchmark marks that benchmark as failed instead of ending the run.
template <typename Fn, typename... Args>
benchmark::internal::Benchmark* add(const std::string& name, Fn fn, Args... args) {
  return benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& state) {
    try {
      fn(state, args...);
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
    }
  });
}

// The main of every benchmark binary: `register_device` for the CPU and, when a GPU is usable, for
// CUDA; the context every record carries (`model` names what is measured); then the run.
inline int run_benchmarks(int argc, char** argv, const char* program, const char* model,
                          void (*register_device)(Device)) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  bool cuda = false;
  try {
    cuda = cuda_available();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: CUDA unusable (%s); CPU only\n", program, e.what());
  }
  register_device(Device::cpu());
  if (cuda) register_device(Device::cuda(0));
  const char* blas_threads = std::getenv("OPENBLAS_NUM_THREADS");
  benchmark::AddCustomContext("cumulus_model", model);
  benchmark::AddCustomContext("cumulus_cuda_compiled", cuda_compiled() ? "yes" : "no");
  benchmark::AddCustomContext("cumulus_cuda_devices", std::to_string(cuda ? cuda_device_count() : 0));
  benchmark::AddCustomContext("cumulus_openblas_num_threads", blas_threads ? blas_threads : "unset (all cores)");
  benchmark::AddCustomContext("cumulus_hardware_threads", std::to_string(std::thread::hardware_concurrency()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace cumulus::bench
