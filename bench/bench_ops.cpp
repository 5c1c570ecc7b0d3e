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
// without a gradient (argmax) gets the forward only.
#include <benchmark/benchmark.h>

#include <string>

#include "bench/rig.h"
#include "cumulus/autograd/grad_mode.h"
#include "cumulus/ops/ops.h"
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
  }
}

}  // namespace
}  // namespace cumulus::bench

int main(int argc, char** argv) {
  using namespace cumulus;
  bench::register_all(Device::cpu());
  if (cuda_available()) bench::register_all(Device::cuda(0));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
