// bench_optim_update: the CPU optimizer update kernels alone, per parameter, fp32 state beside 8-bit
// state through each code the CPU runs (kernels::CpuCode: the scalar loop, AVX2, AVX-512), in one
// process so that every row shares the machine's moment. The size is the seed MLP's 669,706
// parameters (the optimizer_step cases of bench_step_vs_accumulate.cpp, and
// bench/pytorch/optim_update.py's PyTorch reference), whose last block is partial.
//   cpu/update/{adamw,sgd_momentum}/fp32
//   cpu/update/{adamw,sgd_momentum}/8bit_{scalar,avx2,avx512}
//   cpu/step/adamw/state_on_{device,host}: the library's Optimizer::step() over the seed MLP's flat
//     parameters, the state beside them or placed on the host (Optimizer::place_state: the copies
//     of the weights and gradients included)
// Counters: ns_per_parameter (wall time of one update / parameters) and bytes_per_parameter (state,
// weights and gradient read plus written, the floor of its memory traffic). One thread unless
// --threads=N is given first. Each update continues from the last one's state (t counts up).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cumulus/core/threads.h"
#include "cumulus/nn/activation_layers.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/layers.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/optim/adamw.h"
#include "cumulus/tensor/random.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vec_math.h"

namespace {

using cumulus::kernels::CpuCode;
using cumulus::kernels::QuantizedState;

constexpr int64_t kParameters = 669706;
constexpr int64_t kBlocks = (kParameters + QuantizedState::kBlock - 1) / QuantizedState::kBlock;

// Weights, a gradient and both kinds of state at the sizes of the update, filled at random
// (fp32 moments as a trained run's: small, v positive; 8-bit codes and scales likewise).
struct Buffers {
  std::vector<float> w, g, m, v, absmax_m, absmax_v;
  std::vector<uint8_t> codes_m, codes_v;
  Buffers()
      : w(kParameters),
        g(kParameters),
        m(kParameters),
        v(kParameters),
        absmax_m(kBlocks),
        absmax_v(kBlocks),
        codes_m(kParameters),
        codes_v(kParameters) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    for (int64_t i = 0; i < kParameters; ++i) {
      w[i] = unit(rng);
      g[i] = 0.01f * unit(rng);
      m[i] = 0.001f * unit(rng);
      v[i] = 1e-6f * (1.0f + unit(rng));
      codes_m[i] = static_cast<uint8_t>(rng());
      codes_v[i] = static_cast<uint8_t>(rng() & 0x7f);
    }
    for (int64_t b = 0; b < kBlocks; ++b) {
      absmax_m[b] = 0.003f * (1.5f + unit(rng));
      absmax_v[b] = 4e-6f * (1.5f + unit(rng));
    }
  }
  QuantizedState qm() { return {codes_m.data(), absmax_m.data()}; }
  QuantizedState qv() { return {codes_v.data(), absmax_v.data()}; }
};

enum class Optimizer { adamw, sgd_momentum };
enum class State { fp32, eight_bit };

// One update of `optimizer` at update count t.
void update(Buffers& b, Optimizer optimizer, State state, CpuCode code, int64_t t) {
  namespace k = cumulus::kernels;
  const float scale = 1.0f / 64.0f;
  if (optimizer == Optimizer::adamw && state == State::fp32)
    k::adamw_step_cpu(b.w.data(), b.g.data(), b.m.data(), b.v.data(), kParameters, scale, 1e-3f, 0.9f, 0.999f, 1e-8f,
                      0.01f, t, {});
  else if (optimizer == Optimizer::adamw)
    k::adamw_step_8bit_cpu(b.w.data(), b.g.data(), b.qm(), b.qv(), kParameters, scale, 1e-3f, 0.9f, 0.999f, 1e-8f,
                           0.01f, t, {}, code);
  else if (state == State::fp32)
    k::sgd_step_cpu(b.w.data(), b.g.data(), b.m.data(), kParameters, scale, 1e-2f, 0.9f, 0.0f, false, 0.0f, t, {});
  else
    k::sgd_step_8bit_cpu(b.w.data(), b.g.data(), b.qm(), kParameters, scale, 1e-2f, 0.9f, 0.0f, false, 0.0f, t, {},
                         code);
}

// Bytes an update reads and writes per parameter: weight read + written, gradient read, and each
// state array read + written (4 bytes fp32; 1 + 4/64 for 8-bit codes and their block's scale).
double bytes_per_parameter(Optimizer optimizer, State state) {
  const int states = optimizer == Optimizer::adamw ? 2 : 1;
  const double state_bytes = state == State::fp32 ? 4.0 : 1.0 + 4.0 / QuantizedState::kBlock;
  return 12.0 + 2.0 * states * state_bytes;
}

void optimizer_update(benchmark::State& s, Optimizer optimizer, State state, CpuCode code) {
  Buffers b;
  int64_t t = 1;
  for (int i = 0; i < 3; ++i) update(b, optimizer, state, code, t++);  // warm the caches and the tables
  double seconds = 0.0;
  for (auto _ : s) {
    const auto start = std::chrono::steady_clock::now();
    update(b, optimizer, state, code, t++);
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    s.SetIterationTime(elapsed);
    seconds += elapsed;
  }
  benchmark::DoNotOptimize(b.w.data());
  const double iterations = static_cast<double>(s.iterations());
  s.counters["ns_per_parameter"] = iterations > 0 ? seconds * 1e9 / iterations / kParameters : 0.0;
  s.counters["bytes_per_parameter"] = bytes_per_parameter(optimizer, state);
  s.counters["threads"] = cumulus::cpu_threads();
}

// Optimizer::step() of AdamW over the seed MLP's parameters (784-512-512-10), the state placed at
// `placement`: what a training loop pays per update, the base class's work included.
void optimizer_step(benchmark::State& s, cumulus::optim::StatePlacement placement) {
  using namespace cumulus;
  Generator gen(3);
  nn::Sequential model;
  model.add(std::make_shared<nn::Linear>(784, 512, gen, Device::cpu()));
  model.add(std::make_shared<nn::ReLU>());
  model.add(std::make_shared<nn::Linear>(512, 512, gen, Device::cpu()));
  model.add(std::make_shared<nn::ReLU>());
  model.add(std::make_shared<nn::Linear>(512, 10, gen, Device::cpu()));
  auto flat = std::make_shared<nn::FlatParameters>(model);
  ops::sum(model(Tensor::ones(Shape{1, 784}))).backward();  // every gradient slot current
  const Buffers b;
  std::memcpy(flat->gradients().data<float>(), b.g.data(), sizeof(float) * kParameters);
  optim::AdamWOptions o;
  o.lr = 1e-3f;
  optim::AdamW adamw(flat, o);
  adamw.place_state(placement);
  for (int i = 0; i < 3; ++i) adamw.step(1.0f / 64.0f, o.lr);  // allocates the state, warms the caches
  double seconds = 0.0;
  for (auto _ : s) {
    const auto start = std::chrono::steady_clock::now();
    adamw.step(1.0f / 64.0f, o.lr);
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    s.SetIterationTime(elapsed);
    seconds += elapsed;
  }
  const double iterations = static_cast<double>(s.iterations());
  s.counters["ns_per_parameter"] = iterations > 0 ? seconds * 1e9 / iterations / static_cast<double>(flat->size()) : 0.0;
  s.counters["parameters"] = static_cast<double>(flat->size());
  s.counters["threads"] = cumulus::cpu_threads();
}

void register_cases() {
  struct Code {
    CpuCode code;
    const char* name;
    bool runs;
  };
  const Code codes[] = {{CpuCode::scalar, "8bit_scalar", true},
                        {CpuCode::avx2, "8bit_avx2", cumulus::kernels::vec::available()},
                        {CpuCode::avx512, "8bit_avx512", cumulus::kernels::vec512::available()}};
  for (auto [optimizer, name] :
       {std::pair{Optimizer::adamw, "adamw"}, std::pair{Optimizer::sgd_momentum, "sgd_momentum"}}) {
    const std::string family = std::string("cpu/update/") + name + "/";
    benchmark::RegisterBenchmark((family + "fp32").c_str(), optimizer_update, optimizer, State::fp32, CpuCode::best)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
    for (const Code& c : codes)
      if (c.runs)
        benchmark::RegisterBenchmark((family + c.name).c_str(), optimizer_update, optimizer, State::eight_bit, c.code)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
  }
  using cumulus::optim::StatePlacement;
  for (auto [placement, name] : {std::pair{StatePlacement::device, "device"}, std::pair{StatePlacement::host, "host"}})
    benchmark::RegisterBenchmark((std::string("cpu/step/adamw/state_on_") + name).c_str(), optimizer_step, placement)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1;
  if (argc > 1 && std::strncmp(argv[1], "--threads=", 10) == 0) {
    threads = std::atoi(argv[1] + 10);
    argv[1] = argv[0];
    ++argv;
    --argc;
  }
  cumulus::set_cpu_threads(threads);
  benchmark::AddCustomContext("cumulus_cpu_threads", std::to_string(threads));
  benchmark::Initialize(&argc, argv);
  register_cases();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
