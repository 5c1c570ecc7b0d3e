// bench_step_vs_accumulate: what a gradient-accumulating micro-batch costs against an optimizer
// step, for the seed MLP (784-512-512-10), on CPU and (when a GPU is usable) on CUDA.
//
// Families (names are <device>/<family>/<variant>, then Google Benchmark's "/manual_time"):
//   micro_batch/{overwrite,accumulate}/B   forward + backward of one micro-batch of B (16, 64, 256,
//       1024) samples. overwrite: the gradients are stale (the first micro-batch after a step, the
//       weight gradient written with beta = 0); accumulate: they hold a gradient (the others,
//       beta = 1). Stale marking happens outside the timed region.
//   optimizer_step/{sgd,sgd_momentum,adamw}   the fused update alone (Optimizer::update); and
//       {sgd_momentum,adamw}_8bit with the state in 8 bits (Note [8-bit optimizer state]).
//   accumulator_step/{sgd,sgd_momentum,adamw} what the app pays at a group boundary (and _8bit)
//       (Trainer::step_if_ready: gradient norm for the non-finite guard, update, mark stale);
//       the micro-batch that fills the group runs untimed before each step.
//   zero_grad/mark_stale   Optimizer::zero_grad(): flags only, host time (no device work at all).
//   zero_grad/write_zeros  the baseline it replaces: writing zeros over the flat gradient buffer.
//   step_of_64/BxN   one optimizer step of 64 samples as N micro-batches of B (64x1, 16x4, 4x16,
//       1x64): what accumulation costs in time for what it saves in memory.
//   micro_batch_graph/..., step_of_64_graph/BxN (CUDA only)   the same work as the app runs it
//       in its steady state: the batch gathered from a u8 dataset by the DataLoader's device
//       cursor, each micro-batch and the step's device part replayed as CUDA graphs
//       (train::Trainer). Extra counters: kernels_per_micro_batch / kernels_per_step
//       (inside the graphs) and host_syncs_per_step (must be 0).
//   micro_batch_fused/..., step_of_64_fused/BxN, and on CUDA micro_batch_graph_fused/...,
//       step_of_64_graph_fused/BxN   the same families on the fused MLP op (ops::mlp_cross_entropy,
//       Note [Fused MLP] in engine/ops/fused_mlp.cpp); the families without "_fused" run the
//       generic ops (one op per layer, cuBLASLt on CUDA), whatever the size.
// Counters: samples_per_s (rate), us_per_micro_batch / us_per_step, activation bytes per
// micro-batch, peak bytes (and without the synthetic dataset), and on CUDA kernel launches per
// micro-batch / per step. Timing and memory method: see rig.h.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <string>

#include "bench/rig.h"
#include "cumulus/data/dataset.h"
#include "cumulus/train/trainer.h"
#include "cumulus/train/trainer.h"

using namespace cumulus;
using namespace cumulus::bench;

namespace {

void set_launch_counter(benchmark::State& state, const Device& device, const char* name, const LaunchCounter& launches,
                        double per) {
  if (device.is_cuda() && state.iterations() > 0)
    state.counters[name] = static_cast<double>(launches.count()) / (static_cast<double>(state.iterations()) * per);
}

// ---- micro_batch -------------------------------------------------------------------------------
void micro_batch(benchmark::State& state, Device device, int64_t b, bool accumulate, models::KernelChoice kernels) {
  const Data d = make_data(device);
  Model m(device, kernels);
  train::Trainer acc(make_optimizer(OptimizerKind::sgd, m.params), never_stepping());
  const MicroBatchMemory mem = measure_micro_batch(m, acc, d, b);
  Cursor cursor(d, b);
  auto one = [&] {
    const int64_t start = cursor.next();
    Tensor loss = micro_batch_loss(m, d, start, b);
    acc.backward(loss, b);
  };
  for (int i = 0; i < kWarmupIterations; ++i) {
    if (!accumulate) acc.optimizer().zero_grad();
    one();
  }
  synchronize(device);
  DeviceTimer timer(device);
  LaunchCounter launches;
  double total_s = 0.0;
  for (auto _ : state) {
    if (!accumulate) acc.optimizer().zero_grad();  // untimed: the flags of a step's end
    timer.start();
    one();
    const double s = timer.seconds();
    state.SetIterationTime(s);
    total_s += s;
  }
  if (!m.params->any_gradient()) state.SkipWithError("no gradient was accumulated");
  const double iters = static_cast<double>(state.iterations());
  state.counters["samples_per_s"] = benchmark::Counter(static_cast<double>(b) * iters, benchmark::Counter::kIsRate);
  state.counters["us_per_micro_batch"] = iters > 0 ? total_s * 1e6 / iters : 0.0;
  state.counters["micro_batch"] = static_cast<double>(b);
  state.counters["beta"] = accumulate ? 1.0 : 0.0;
  set_memory_counters(state, mem);
  set_launch_counter(state, device, "launches_per_micro_batch", launches, 1.0);
}

// ---- optimizer_step / accumulator_step ------------------------------------------------------------
void optimizer_step(benchmark::State& state, Device device, OptimizerKind kind) {
  const Data d = make_data(device);
  Model m(device);
  auto opt = make_optimizer(kind, m.params);
  train::Trainer acc(opt, never_stepping());
  const int64_t b = 64;
  const MicroBatchMemory mem = measure_micro_batch(m, acc, d, b);  // leaves a gradient to apply
  const float scale = 1.0f / static_cast<float>(b);
  for (int i = 0; i < kWarmupIterations; ++i)
    opt->step(scale, opt->lr());  // allocates the state
  synchronize(device);
  DeviceTimer timer(device);
  LaunchCounter launches;
  double total_s = 0.0;
  for (auto _ : state) {
    timer.start();
    opt->step(scale, opt->lr());
    const double s = timer.seconds();
    state.SetIterationTime(s);
    total_s += s;
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["us_per_step"] = iters > 0 ? total_s * 1e6 / iters : 0.0;
  state.counters["parameters"] = static_cast<double>(m.params->num_parameters());
  state.counters["optimizer_state_bytes"] = bytes_counter(opt->state_bytes());
  state.counters["peak_bytes"] = bytes_counter(mem.peak_bytes);
  set_launch_counter(state, device, "launches_per_step", launches, 1.0);
}

void accumulator_step(benchmark::State& state, Device device, OptimizerKind kind) {
  const Data d = make_data(device);
  Model m(device);
  train::TrainerOptions o;  // the app's defaults: normalization by samples, non-finite guard
  o.accum_steps = 1;
  train::Trainer acc(make_optimizer(kind, m.params), o);
  const int64_t b = 16;
  Cursor cursor(d, b);
  auto fill_group = [&] {
    const int64_t start = cursor.next();
    Tensor loss = micro_batch_loss(m, d, start, b);
    acc.backward(loss, b);
  };
  for (int i = 0; i < kWarmupIterations; ++i) {
    fill_group();
    acc.step_if_ready();
  }
  synchronize(device);
  DeviceTimer timer(device);
  LaunchCounter launches;
  int64_t step_launches = 0;
  double total_s = 0.0;
  for (auto _ : state) {
    fill_group();  // untimed (its device work may still run: wait for it first)
    synchronize(device);
    const int64_t before = cuda_kernel_launches();
    timer.start();
    if (!acc.step_if_ready()) {
      state.SkipWithError("the group did not step");
      break;
    }
    const double s = timer.seconds();
    step_launches += cuda_kernel_launches() - before;
    state.SetIterationTime(s);
    total_s += s;
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["us_per_step"] = iters > 0 ? total_s * 1e6 / iters : 0.0;
  state.counters["skipped_steps"] = static_cast<double>(acc.counters().skipped_steps);
  if (device.is_cuda() && iters > 0) state.counters["launches_per_step"] = static_cast<double>(step_launches) / iters;
}

// ---- zero_grad -----------------------------------------------------------------------------------
void zero_grad_mark_stale(benchmark::State& state, Device device) {
  Model m(device);
  auto opt = make_optimizer(OptimizerKind::sgd, m.params);
  LaunchCounter launches;
  for (auto _ : state) {
    opt->zero_grad();
    benchmark::ClobberMemory();
  }
  set_launch_counter(state, device, "launches_per_call", launches, 1.0);
}

void zero_grad_write_zeros(benchmark::State& state, Device device) {
  Model m(device);
  const Tensor grads = m.params->gradients();
  Tensor zeros = Tensor::zeros(grads.shape(), DType::f32, device);
  synchronize(device);
  DeviceTimer timer(device);
  LaunchCounter launches;
  for (auto _ : state) {
    timer.start();
    Tensor(grads).copy_from(zeros);
    state.SetIterationTime(timer.seconds());
  }
  state.counters["bytes_written"] = bytes_counter(static_cast<int64_t>(grads.nbytes()));
  set_launch_counter(state, device, "launches_per_call", launches, 1.0);
}

// ---- step_of_64 ----------------------------------------------------------------------------------
void step_of_64(benchmark::State& state, Device device, int64_t b, int n, models::KernelChoice kernels) {
  const Data d = make_data(device);
  Model m(device, kernels);
  train::TrainerOptions o;
  o.accum_steps = n;
  train::Trainer acc(make_optimizer(OptimizerKind::sgd, m.params), o);
  Cursor cursor(d, b);
  auto one_step = [&] {
    for (int i = 0; i < n; ++i) {
      const int64_t start = cursor.next();
      Tensor loss = micro_batch_loss(m, d, start, b);
      acc.backward(loss, b);
      loss = Tensor();
      acc.step_if_ready();
    }
  };
  // Memory of one whole step (its micro-batches and the update), tracked, untimed.
  MicroBatchMemory mem;
  {
    memory::MemoryTracker::Options to;
    to.model = "seed_mlp";
    to.micro_batch_size = b;
    to.accum_steps = n;
    to.timeline_steps = 0;
    memory::MemoryTracker tracker(device, to);
    for (int i = 0; i < n; ++i) {
      const int64_t start = cursor.next();
      tracker.begin_micro_batch(0, i, b);
      Tensor loss = micro_batch_loss(m, d, start, b);
      tracker.end_forward();
      acc.backward(loss, b);
      loss = Tensor();
      tracker.end_backward();
      if (acc.ready()) {
        tracker.begin_step();
        acc.step_if_ready();
        tracker.end_step(acc.counters().optimizer_steps, acc.optimizer().state_bytes());
      }
    }
    const memory::MemorySummary s = tracker.summary();
    mem.activation_bytes = tracker.micro_batches().front().activation_bytes;
    mem.peak_bytes = s.peak_bytes;
    mem.peak_data_bytes = s.data_bytes;
  }
  for (int i = 0; i < kWarmupIterations; ++i) one_step();
  synchronize(device);
  DeviceTimer timer(device);
  LaunchCounter launches;
  const train::TrainingCounters before = acc.counters();
  const int64_t steps_before = before.optimizer_steps + before.skipped_steps;
  double total_s = 0.0;
  for (auto _ : state) {
    timer.start();
    one_step();
    const double s = timer.seconds();
    state.SetIterationTime(s);
    total_s += s;
  }
  const double iters = static_cast<double>(state.iterations());
  const train::TrainingCounters after = acc.counters();
  if (after.optimizer_steps + after.skipped_steps - steps_before != state.iterations())
    state.SkipWithError("expected exactly one optimizer step per iteration");
  state.counters["samples_per_s"] =
      benchmark::Counter(static_cast<double>(b * n) * iters, benchmark::Counter::kIsRate);
  state.counters["us_per_step"] = iters > 0 ? total_s * 1e6 / iters : 0.0;
  state.counters["us_per_micro_batch"] = iters > 0 ? total_s * 1e6 / (iters * n) : 0.0;
  state.counters["micro_batch"] = static_cast<double>(b);
  state.counters["accum_steps"] = static_cast<double>(n);
  set_memory_counters(state, mem);
  set_launch_counter(state, device, "launches_per_step", launches, 1.0);
  set_launch_counter(state, device, "launches_per_micro_batch", launches, static_cast<double>(n));
}

// ---- graphs (CUDA) --------------------------------------------------------------------------------
// The app's form of the loop: a u8 dataset behind a DataLoader, micro-batches through
// the Trainer. Full micro-batches only: the cursor is rewound before a partial one.
struct GraphLoop {
  GraphLoop(Device device, int64_t b, const train::TrainerOptions& o, models::KernelChoice kernels)
      : m(device, kernels), trainer(make_optimizer(OptimizerKind::sgd, m.params), with_graphs(o)) {
    Generator gen(7);
    std::vector<float> u(static_cast<std::size_t>(kDataRows * models::SeedMLP::kInputs));
    gen.fill_uniform(u.data(), static_cast<int64_t>(u.size()), 0.0f, 256.0f);
    std::vector<uint8_t> px(u.size());
    for (std::size_t i = 0; i < u.size(); ++i) px[i] = static_cast<uint8_t>(std::min(255.0f, u[i]));
    std::vector<int32_t> y(static_cast<std::size_t>(kDataRows));
    for (int64_t i = 0; i < kDataRows; ++i) y[static_cast<std::size_t>(i)] = static_cast<int32_t>(i % 10);
    MemoryCategoryScope scope(MemoryCategory::data);
    data::TensorDataset ds({Tensor::from_vector(px, Shape{kDataRows, models::SeedMLP::kInputs}, device),
                            Tensor::from_vector(y, Shape{kDataRows}, device)},
                           {"images", "labels"});
    ds.to_float(0, 255.0f);  // pixel / 255, as the app's images
    loader = std::make_unique<data::DataLoader>(ds, b);
    trainer.begin_epoch(0, 0);
  }
  static train::TrainerOptions with_graphs(const train::TrainerOptions& o) {
    train::TrainerOptions t = o;
    t.use_graphs = true;
    return t;
  }
  void micro_batch(int64_t b) {
    if ((index + 1) * b > kDataRows) {
      index = 0;
      loader->seek(0);
    }
    const int64_t i = index++;
    trainer.micro_batch(b, [&] {
      const data::Batch batch = loader->next(i);
      return m.net.loss(batch.x, batch.y, ops::Reduction::Sum);
    });
  }
  Model m;
  train::Trainer trainer;
  std::unique_ptr<data::DataLoader> loader;
  int64_t index = 0;  // the next batch (the loader's cursor on the device says the same)
};

void micro_batch_graph(benchmark::State& state, Device device, int64_t b, bool accumulate,
                       models::KernelChoice kernels) {
  GraphLoop g(device, b, never_stepping(), kernels);
  for (int i = 0; i < kWarmupIterations; ++i) {
    if (!accumulate) g.trainer.optimizer().zero_grad();
    g.micro_batch(b);
  }
  synchronize(device);
  DeviceTimer timer(device);
  LaunchCounter launches;
  const int64_t syncs = host_synchronizations();
  double total_s = 0.0;
  for (auto _ : state) {
    if (!accumulate) g.trainer.optimizer().zero_grad();
    timer.start();
    g.micro_batch(b);
    const double s = timer.seconds();  // waits on an event: one synchronization per iteration
    state.SetIterationTime(s);
    total_s += s;
  }
  const double iters = static_cast<double>(state.iterations());
  if (g.trainer.stats().replayed_micro_batches < state.iterations())
    state.SkipWithError("micro-batches were not replayed as graphs");
  state.counters["samples_per_s"] = benchmark::Counter(static_cast<double>(b) * iters, benchmark::Counter::kIsRate);
  state.counters["us_per_micro_batch"] = iters > 0 ? total_s * 1e6 / iters : 0.0;
  state.counters["micro_batch"] = static_cast<double>(b);
  state.counters["beta"] = accumulate ? 1.0 : 0.0;
  state.counters["kernels_per_micro_batch"] = static_cast<double>(g.trainer.stats().kernels_per_micro_batch);
  // The timer's own event wait is the only synchronization: subtract it.
  state.counters["host_syncs_per_micro_batch"] =
      iters > 0 ? static_cast<double>(host_synchronizations() - syncs) / iters - 1.0 : 0.0;
  set_launch_counter(state, device, "launches_per_micro_batch", launches, 1.0);
}

void step_of_64_graph(benchmark::State& state, Device device, int64_t b, int n, models::KernelChoice kernels) {
  train::TrainerOptions o;
  o.accum_steps = n;
  GraphLoop g(device, b, o, kernels);
  auto one_step = [&] {
    for (int i = 0; i < n; ++i) {
      g.micro_batch(b);
      g.trainer.step_if_ready();
    }
  };
  for (int i = 0; i < kWarmupIterations; ++i) one_step();
  synchronize(device);
  DeviceTimer timer(device);
  LaunchCounter launches;
  const int64_t syncs = host_synchronizations();
  const int64_t steps_before = g.trainer.position().attempted_steps;
  double total_s = 0.0;
  for (auto _ : state) {
    timer.start();
    one_step();
    const double s = timer.seconds();
    state.SetIterationTime(s);
    total_s += s;
  }
  const double iters = static_cast<double>(state.iterations());
  const int64_t host_syncs = host_synchronizations() - syncs - state.iterations();  // minus the timer's
  if (g.trainer.position().attempted_steps - steps_before != state.iterations())
    state.SkipWithError("expected exactly one optimizer step per iteration");
  state.counters["samples_per_s"] =
      benchmark::Counter(static_cast<double>(b * n) * iters, benchmark::Counter::kIsRate);
  state.counters["us_per_step"] = iters > 0 ? total_s * 1e6 / iters : 0.0;
  state.counters["us_per_micro_batch"] = iters > 0 ? total_s * 1e6 / (iters * n) : 0.0;
  state.counters["micro_batch"] = static_cast<double>(b);
  state.counters["accum_steps"] = static_cast<double>(n);
  state.counters["kernels_per_micro_batch"] = static_cast<double>(g.trainer.stats().kernels_per_micro_batch);
  state.counters["kernels_per_step"] = static_cast<double>(g.trainer.stats().kernels_per_step);
  state.counters["host_syncs_per_step"] = iters > 0 ? static_cast<double>(host_syncs) / iters : 0.0;
  set_launch_counter(state, device, "launches_per_step", launches, 1.0);
  set_launch_counter(state, device, "launches_per_micro_batch", launches, static_cast<double>(n));
}

// ---- registration --------------------------------------------------------------------------------

// On CPU the reported CPU time is the whole process's (OpenBLAS worker threads included), so a
// run on a busy machine can be judged by it too; on CUDA it is the host thread's.
benchmark::internal::Benchmark* timed(benchmark::internal::Benchmark* b, const Device& device) {
  b->UseManualTime()->Unit(benchmark::kMicrosecond);
  return device.is_cpu() ? b->MeasureProcessCPUTime() : b;
}

void register_device(Device device) {
  const std::string dev = device.is_cpu() ? "cpu" : "cuda";
  using models::KernelChoice;
  // Family name suffix per path: the generic ops keep the families' historical names.
  const std::vector<std::pair<KernelChoice, std::string>> paths = {{KernelChoice::generic, ""},
                                                                   {KernelChoice::fused, "_fused"}};
  for (const auto& [kernels, sfx] : paths)
    for (int64_t b : {16, 64, 256, 1024})
      for (bool accumulate : {false, true})
        timed(add(dev + "/micro_batch" + sfx + "/" + (accumulate ? "accumulate/" : "overwrite/") + std::to_string(b),
                  micro_batch, device, b, accumulate, kernels),
              device);
  for (OptimizerKind k : {OptimizerKind::sgd, OptimizerKind::sgd_momentum, OptimizerKind::adamw,
                          OptimizerKind::sgd_momentum_8bit, OptimizerKind::adamw_8bit}) {
    timed(add(dev + "/optimizer_step/" + optimizer_name(k), optimizer_step, device, k), device);
    timed(add(dev + "/accumulator_step/" + optimizer_name(k), accumulator_step, device, k), device);
  }
  add(dev + "/zero_grad/mark_stale", zero_grad_mark_stale, device)->Unit(benchmark::kNanosecond);
  timed(add(dev + "/zero_grad/write_zeros", zero_grad_write_zeros, device), device);
  for (const auto& [kernels, sfx] : paths)
    for (auto [b, n] : {std::pair<int64_t, int>{64, 1}, {16, 4}, {4, 16}, {1, 64}})
      timed(add(dev + "/step_of_64" + sfx + "/" + std::to_string(b) + "x" + std::to_string(n), step_of_64, device, b,
                n, kernels),
            device);
  if (device.is_cpu()) return;
  for (const auto& [kernels, sfx] : paths) {
    for (int64_t b : {16, 64, 256, 1024})
      for (bool accumulate : {false, true})
        timed(add(dev + "/micro_batch_graph" + sfx + "/" + (accumulate ? "accumulate/" : "overwrite/") +
                      std::to_string(b),
                  micro_batch_graph, device, b, accumulate, kernels),
              device);
    for (auto [b, n] : {std::pair<int64_t, int>{64, 1}, {16, 4}, {4, 16}, {1, 64}})
      timed(add(dev + "/step_of_64_graph" + sfx + "/" + std::to_string(b) + "x" + std::to_string(n), step_of_64_graph,
                device, b, n, kernels),
            device);
  }
}

}  // namespace

int main(int argc, char** argv) {
  return run_benchmarks(argc, argv, "bench_step_vs_accumulate", "seed MLP 784-512-512-10, f32, Reduction::Sum",
                        register_device);
}
