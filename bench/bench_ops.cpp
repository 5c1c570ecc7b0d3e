// The op-case registry's benchmark mode (tests/op_cases/, Note [Op cases]): for every registered
// case, on the CPU and (when a GPU is usable) on CUDA,
//   ops/<case>/<size>/forward/<device>           the op under NoGradGuard (no node recorded)
//   ops/<case>/<size>/forward_backward/<device>  the op recorded, reduced to a scalar with ops::sum (after
//                                                a cast to f32 for a 16-bit output), and its backward
// (<size>: the first input's shape, 256x784) at the case's benchmark sizes (Note [Benchmark sizes];
// its own small sizes where it gives none). Timed on the device as the other benchmarks (bench/rig.h:
// host clock on CPU, CUDA events on
// CUDA, 3 untimed warm-up iterations). Counters: bytes_per_second from the bytes every input read
// once plus the output written once (forward_backward: plus each input gradient written and the
// output gradient read once; a 16-bit input's backward includes converting its gradient to its
// f32 leaf's), and FLOP/s for the forward where the case gives its FLOPs. An op
// without a gradient (argmax) gets the forward only. Besides, for a case whose output is f32,
//   ops/<case>/<size>/op_forward_backward/<device>  the op recorded and its backward from a given
//                                                upstream gradient, overwriting the leaves' gradients:
//                                                the op's own passes, no sum, fill or accumulation
// and the memory rates that bound them (Note [Memory floor]), and on the CPU the op families that
// bench/ops_vs_pytorch.py times beside PyTorch (families/..., Note [Op families against PyTorch]).
//
// Note [Memory floor]
// An op's memory floor is the bytes it must move over the rate this machine moves bytes at the
// op's sizes: mem/copy (memcpy, 2 bytes moved per byte copied) and mem/triad (a = b + s c, 3 arrays),
// over arrays of 1 MiB (the [512, 512] f32 activations: in the 2 MiB L2) and 256 MiB (from memory:
// past the 300 MiB L3 even for a copy), on one thread and split across two. bytes_per_second
// counts what the op reads plus what it writes, each array once, as the ops' own counters do.
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "bench/op_families.h"
#include "bench/rig.h"
#include "cumulus/autograd/grad_mode.h"
#include "cumulus/autograd/node.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/ops/shape.h"
#include "op_cases/op_case.h"

namespace cumulus::bench {
namespace {

using testing::CaseTensors;
using testing::OpCase;

constexpr uint64_t kSeed = 20261124;

double input_bytes(const CaseTensors& t) {
  double bytes = 0;
  for (const Tensor& x : t.inputs) bytes += static_cast<double>(x.nbytes());
  return bytes;
}

double gradient_bytes(const OpCase& c, const CaseTensors& t) {
  double bytes = 0;
  for (std::size_t i = 0; i < t.inputs.size(); ++i)
    if (is_floating(c.inputs[i].dtype) && c.inputs[i].grad) bytes += static_cast<double>(t.inputs[i].nbytes());
  return bytes;
}

void set_rates(benchmark::State& state, double bytes, double flops) {
  const double n = static_cast<double>(state.iterations());
  state.counters["bytes_per_second"] =
      benchmark::Counter(bytes * n, benchmark::Counter::kIsRate, benchmark::Counter::kIs1024);
  if (flops > 0) state.counters["FLOP/s"] = benchmark::Counter(flops * n, benchmark::Counter::kIsRate);
}

void forward(benchmark::State& state, const OpCase& c, Device device) {
  const CaseTensors t = make_inputs(c, device, kSeed);
  NoGradGuard no_grad;
  double output_bytes = 0;
  timed_loop(
      state, device, [] {}, [&] { output_bytes = static_cast<double>(c.forward(t.inputs).nbytes()); });
  set_rates(state, input_bytes(t) + output_bytes, c.flops);
}

void forward_backward(benchmark::State& state, const OpCase& c, Device device) {
  CaseTensors t = make_inputs(c, device, kSeed);
  double output_bytes = 0;
  // A 16-bit input is its f32 leaf's recorded cast, whose node a backward consumes: cast again,
  // untimed, before each iteration (its backward, the gradient converted to f32, stays timed).
  auto recast = [&] {
    for (std::size_t i = 0; i < t.inputs.size(); ++i)
      if (t.inputs[i].dtype() != t.leaves[i].dtype()) t.inputs[i] = ops::cast(t.leaves[i], t.inputs[i].dtype());
  };
  timed_loop(state, device, recast, [&] {
    const Tensor out = c.forward(t.inputs);
    output_bytes = static_cast<double>(out.nbytes());
    ops::sum(ops::cast(out, DType::f32)).backward();
  });
  set_rates(state, input_bytes(t) + gradient_bytes(c, t) + 2 * output_bytes, 0);
}

// The op and its backward from a fixed upstream gradient (ones), each leaf's gradient overwritten
// (marked stale before each iteration, untimed): exactly the op's forward and backward kernels.
void op_forward_backward(benchmark::State& state, const OpCase& c, Device device) {
  CaseTensors t = make_inputs(c, device, kSeed);
  Tensor dy;
  double output_bytes = 0;
  auto setup = [&] {
    for (std::size_t i = 0; i < t.inputs.size(); ++i) {
      if (t.inputs[i].dtype() != t.leaves[i].dtype()) t.inputs[i] = ops::cast(t.leaves[i], t.inputs[i].dtype());
      if (t.leaves[i].requires_grad()) t.leaves[i].mark_grad_stale();
    }
  };
  timed_loop(state, device, setup, [&] {
    const Tensor out = c.forward(t.inputs);
    if (!dy.defined()) dy = Tensor::full(out.shape(), 1.0f, device);
    output_bytes = static_cast<double>(out.nbytes());
    run_backward(out, dy);
  });
  set_rates(state, input_bytes(t) + gradient_bytes(c, t) + 2 * output_bytes, 0);
}

// Runs fn(part) for part 0 here and, with two threads, part 1 on a worker that waits spinning
// between calls (a thread started per call would cost more than a 1 MiB copy).
class ThreadPair {
 public:
  explicit ThreadPair(int threads) : threads_(threads) {
    if (threads_ == 2) worker_ = std::thread([this] { serve(); });
  }
  ~ThreadPair() {
    if (!worker_.joinable()) return;
    stop_ = true;
    generation_.fetch_add(1);
    worker_.join();
  }
  void run(const std::function<void(int)>& fn) {
    fn_ = &fn;
    if (threads_ == 2) generation_.fetch_add(1, std::memory_order_release);
    fn(0);
    if (threads_ == 2)
      while (done_.load(std::memory_order_acquire) != generation_.load()) std::this_thread::yield();
  }

 private:
  void serve() {
    for (int seen = 0;;) {
      while (generation_.load(std::memory_order_acquire) == seen) std::this_thread::yield();
      seen = generation_.load();
      if (stop_) return;
      (*fn_)(1);
      done_.store(seen, std::memory_order_release);
    }
  }
  int threads_;
  std::thread worker_;
  std::atomic<int> generation_{0}, done_{0};
  std::atomic<bool> stop_{false};
  const std::function<void(int)>* fn_ = nullptr;
};

// mem/<kernel>/<MiB per array>MiB/threads:<k> (Note [Memory floor]).
void memory_rate(benchmark::State& state, bool triad, int64_t mib, int threads) {
  const auto n = static_cast<std::size_t>(mib) << 18;  // floats per array
  std::vector<float> a(n, 0.0f), b(n, 1.0f), c(n, 2.0f);
  ThreadPair pair(threads);
  const std::function<void(int)> part = [&](int k) {
    const std::size_t begin = n * k / threads, end = n * (k + 1) / threads;
    if (!triad) {
      std::memcpy(a.data() + begin, b.data() + begin, (end - begin) * sizeof(float));
      return;
    }
    float *pa = a.data(), *pb = b.data(), *pc = c.data();
    for (std::size_t i = begin; i < end; ++i) pa[i] = pb[i] + 0.5f * pc[i];
  };
  for (int i = 0; i < kWarmupIterations; ++i) pair.run(part);
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    pair.run(part);
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  benchmark::DoNotOptimize(a.data());
  set_rates(state, static_cast<double>(n * sizeof(float)) * (triad ? 3 : 2), 0);
}

void register_memory_rates() {
  for (bool triad : {false, true})
    for (int64_t mib : {1, 256})
      for (int threads : {1, 2}) {
        const std::string name = std::string("mem/") + (triad ? "triad/" : "copy/") + std::to_string(mib) +
                                 "MiB/threads:" + std::to_string(threads);
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) {
          memory_rate(s, triad, mib, threads);
        })->UseManualTime();
      }
}

void register_all(Device device) {
  for (const OpCase& registered : testing::all_op_cases()) {
    const OpCase c = testing::at_bench_sizes(registered);
    std::string size;  // the first input's shape at the benchmark sizes: 256x784
    for (int i = 0; i < c.inputs[0].shape.ndim(); ++i) size += (i ? "x" : "") + std::to_string(c.inputs[0].shape[i]);
    const std::string prefix = "ops/" + c.name + "/" + size + "/";
    benchmark::RegisterBenchmark((prefix + "forward/" + device.str()).c_str(), [c, device](benchmark::State& s) {
      forward(s, c, device);
    })->UseManualTime();
    if (c.differentiable)
      benchmark::RegisterBenchmark((prefix + "forward_backward/" + device.str()).c_str(), [c, device](
                                                                                              benchmark::State& s) {
        forward_backward(s, c, device);
      })->UseManualTime();
    if (c.differentiable && c.inputs[0].dtype == DType::f32)
      benchmark::RegisterBenchmark((prefix + "op_forward_backward/" + device.str()).c_str(), [c, device](
                                                                                                 benchmark::State& s) {
        op_forward_backward(s, c, device);
      })->UseManualTime();
  }
}

// An op family's inputs (Note [Op families against PyTorch]): float ones uniform in [-1, 1) and
// requiring a gradient, integer ones (i32) uniform below f.classes.
std::vector<Tensor> family_inputs(const OpFamily& f, Device device) {
  Generator gen(kSeed);
  std::vector<Tensor> inputs;
  for (std::size_t i = 0; i < f.shapes.size(); ++i) {
    const Shape& shape = f.shapes[i];
    std::vector<float> values(static_cast<std::size_t>(shape.numel()));
    const bool integer = i < f.integer.size() && f.integer[i];
    gen.fill_uniform(values.data(), shape.numel(), integer ? 0.0f : -1.0f,
                     integer ? static_cast<float>(f.classes) : 1.0f);
    if (integer) {
      std::vector<int32_t> ids(values.size());
      for (std::size_t k = 0; k < ids.size(); ++k) ids[k] = static_cast<int32_t>(values[k]);
      inputs.push_back(Tensor::from_vector(ids, shape, device));
    } else {
      inputs.push_back(Tensor::from_vector(values, shape, device).set_requires_grad(true));
    }
  }
  return inputs;
}

void family_forward(benchmark::State& state, const OpFamily& f, Device device) {
  const std::vector<Tensor> inputs = family_inputs(f, device);
  NoGradGuard no_grad;
  timed_loop(state, device, [] {}, [&] { benchmark::DoNotOptimize(f.forward(inputs)); });
}

void family_forward_backward(benchmark::State& state, const OpFamily& f, Device device) {
  const std::vector<Tensor> inputs = family_inputs(f, device);
  Tensor dy;
  auto stale = [&] {
    for (const Tensor& x : inputs)
      if (x.requires_grad()) x.mark_grad_stale();
  };
  timed_loop(state, device, stale, [&] {
    const Tensor out = f.forward(inputs);
    if (!dy.defined()) dy = Tensor::full(out.shape(), 1.0f, device);
    run_backward(out, dy);
  });
}

void register_families(Device device) {
  for (const OpFamily& f : op_families()) {
    const std::string prefix = "families/" + f.name + "/";
    benchmark::RegisterBenchmark((prefix + "forward/" + device.str()).c_str(), [f, device](benchmark::State& s) {
      family_forward(s, f, device);
    })->UseManualTime();
    benchmark::RegisterBenchmark((prefix + "forward_backward/" + device.str()).c_str(),
                                 [f, device](benchmark::State& s) { family_forward_backward(s, f, device); })
        ->UseManualTime();
  }
}

}  // namespace
}  // namespace cumulus::bench

int main(int argc, char** argv) {
  using namespace cumulus;
  bench::register_memory_rates();
  bench::register_all(Device::cpu());
  bench::register_families(Device::cpu());
  if (cuda_available()) bench::register_all(Device::cuda(0));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
