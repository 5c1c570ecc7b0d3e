// bench_fused_kernels: each kernel of the fused MLP path (kernels/cuda/fused_mlp.cu, Note [Fused
// MLP] in engine/ops/fused_mlp.cpp) alone, at the seed MLP's shapes, CUDA only (a CPU-only build
// registers nothing). Per kernel, as a kernel-development harness should: a double-precision CPU
// reference, validation of the kernel's output against it before timing (a kernel that disagrees
// is reported as an error, not timed), then CUDA-event timing, and the bytes and FLOPs it must
// move and do, as achieved GB/s and GFLOP/s.
//
// Families: cuda/<kernel>/<B> for B in 16, 64, 256, 1024, kernels
//   forward_784x512_relu, forward_512x512_relu   fused_linear_forward_cuda (the two hidden layers)
//   head_forward_512x10                           fused_head_forward_cuda (logits, softmax, loss)
//   head_backward_512x10                          fused_head_backward_cuda (dW3, db3 added; dh2 masked)
//   backward_512x512                              fused_linear_backward_cuda (dW2, db2 added; dh1 masked)
//   backward_784x512                              fused_linear_backward_cuda (dW1, db1 added; no dx)
// Counters: us_per_call, GB_per_s (bytes that must move: every input read once, every output written
// once, an accumulated gradient read and written), GFLOP_per_s, max_rel_error (against the
// reference, relative to the output's largest magnitude).
#include <benchmark/benchmark.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "bench/rig.h"

#if CUMULUS_WITH_CUDA
#include "engine/core/cuda_context.h"
#include "kernels/cuda/kernels.h"
#endif

using namespace cumulus;
using namespace cumulus::bench;

namespace {

#if CUMULUS_WITH_CUDA

std::vector<float> random_values(int64_t n, float lo, float hi, uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  Generator gen(seed);
  gen.fill_uniform(v.data(), n, lo, hi);
  return v;
}

// max |got - want| / max |want|.
double max_rel_error(const std::vector<float>& got, const std::vector<double>& want) {
  double worst = 0, largest = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want[i]));
    largest = std::max(largest, std::abs(want[i]));
  }
  return largest > 0 ? worst / largest : worst;
}

// One kernel under test: `run` queues it once; `check` returns its output's error against the
// reference after exactly one run from the initial state (restored by `reset`).
struct Buffers;
struct KernelCase {
  std::shared_ptr<Buffers> buffers;  // the device memory the closures point into
  double bytes = 0, flops = 0;
  std::function<void()> reset, run;
  std::function<double()> check;
};

constexpr double kTolerance = 1e-4;

void bench_kernel(benchmark::State& state, const std::function<KernelCase(int64_t)>& make, int64_t b) {
  const Device device = Device::cuda(0);
  KernelCase k = make(b);
  k.reset();
  k.run();
  const double error = k.check();
  if (!(error <= kTolerance)) {
    state.SkipWithError(("disagrees with the double-precision reference: max relative error " +
                         std::to_string(error)).c_str());
    return;
  }
  const double total_s = timed_loop(state, device, [] {}, k.run);
  const double iters = static_cast<double>(state.iterations());
  const double per_call = iters > 0 ? total_s / iters : 0.0;
  state.counters["us_per_call"] = per_call * 1e6;
  state.counters["GB_per_s"] = per_call > 0 ? k.bytes / per_call / 1e9 : 0.0;
  state.counters["GFLOP_per_s"] = per_call > 0 ? k.flops / per_call / 1e9 : 0.0;
  state.counters["max_rel_error"] = error;
  state.counters["micro_batch"] = static_cast<double>(b);
}

// Device copies of host vectors, kept alive by the case.
struct Buffers {
  std::vector<Tensor> held;
  float* put(const std::vector<float>& v) {
    held.push_back(Tensor::from_vector(v, Shape{static_cast<int64_t>(v.size())}, Device::cuda(0)));
    return held.back().data<float>();
  }
  int32_t* put(const std::vector<int32_t>& v) {
    held.push_back(Tensor::from_vector(v, Shape{static_cast<int64_t>(v.size())}, Device::cuda(0)));
    return held.back().data<int32_t>();
  }
  static std::vector<float> get(const float* p, std::size_t n) {
    std::vector<float> v(n);
    copy_bytes(v.data(), Device::cpu(), p, Device::cuda(0), n * sizeof(float));
    return v;
  }
};

cudaStream_t stream() { return cuda::context(0).stream(); }

// A hidden layer's forward: y = relu(x W^T + b).
KernelCase forward_case(int64_t b, int64_t in, int64_t out) {
  auto buf = std::make_shared<Buffers>();
  const auto x = random_values(b * in, 0.0f, 1.0f, 1), w = random_values(out * in, -0.05f, 0.05f, 2),
             bias = random_values(out, -0.05f, 0.05f, 3);
  const float *xp = buf->put(x), *wp = buf->put(w), *bp = buf->put(bias);
  float* yp = buf->put(std::vector<float>(static_cast<std::size_t>(b * out)));
  KernelCase k;
  k.buffers = buf;
  k.bytes = 4.0 * (b * in + out * in + out + b * out);
  k.flops = 2.0 * b * in * out;
  k.reset = [] {};
  k.run = [=] { kernels::fused_linear_forward_cuda(xp, wp, bp, b, in, out, true, yp, stream()); };
  k.check = [=] {
    std::vector<double> want(static_cast<std::size_t>(b * out));
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < out; ++j) {
        double s = bias[j];
        for (int64_t q = 0; q < in; ++q) s += static_cast<double>(x[i * in + q]) * w[j * in + q];
        want[i * out + j] = std::max(s, 0.0);
      }
    return max_rel_error(Buffers::get(yp, want.size()), want);
  };
  return k;
}

// The head's forward: logits, softmax (checked) and the loss (checked).
KernelCase head_forward_case(int64_t b, int64_t in, int64_t classes) {
  auto buf = std::make_shared<Buffers>();
  const auto h = random_values(b * in, 0.0f, 1.0f, 4), w = random_values(classes * in, -0.05f, 0.05f, 5),
             bias = random_values(classes, -0.05f, 0.05f, 6);
  std::vector<int32_t> labels(static_cast<std::size_t>(b));
  for (int64_t i = 0; i < b; ++i) labels[i] = static_cast<int32_t>(i % classes);
  const float *hp = buf->put(h), *wp = buf->put(w), *bp = buf->put(bias);
  const int32_t* yp = buf->put(labels);
  float* probs = buf->put(std::vector<float>(static_cast<std::size_t>(b * classes)));
  float* rows = buf->put(std::vector<float>(static_cast<std::size_t>(b)));
  float* loss = buf->put(std::vector<float>(1));
  unsigned* counter = cuda::context(0).arrival_counter();
  KernelCase k;
  k.buffers = buf;
  k.bytes = 4.0 * (b * in + classes * in + classes + b + b * classes + 1);
  k.flops = 2.0 * b * in * classes;
  k.reset = [] {};
  k.run = [=] {
    kernels::fused_head_forward_cuda(hp, wp, bp, yp, b, in, classes, 1.0f, probs, rows, loss, counter, stream());
  };
  k.check = [=] {
    std::vector<double> want_p(static_cast<std::size_t>(b * classes));
    double want_loss = 0;
    for (int64_t i = 0; i < b; ++i) {
      std::vector<double> z(static_cast<std::size_t>(classes));
      double m = -1e300;
      for (int64_t c = 0; c < classes; ++c) {
        double s = bias[c];
        for (int64_t q = 0; q < in; ++q) s += static_cast<double>(h[i * in + q]) * w[c * in + q];
        z[c] = s;
        m = std::max(m, s);
      }
      double sum = 0;
      for (double v : z) sum += std::exp(v - m);
      for (int64_t c = 0; c < classes; ++c) want_p[i * classes + c] = std::exp(z[c] - m) / sum;
      want_loss += m + std::log(sum) - z[labels[i]];
    }
    const double loss_error = std::abs(Buffers::get(loss, 1)[0] - want_loss) / std::abs(want_loss);
    return std::max(max_rel_error(Buffers::get(probs, want_p.size()), want_p), loss_error);
  };
  return k;
}

// A backward into gradients that already hold values (accumulate, beta 1): the head's (head true:
// dz formed from the softmax and labels) or a hidden layer's (dz given). dx is masked by x > 0
// when with_dx; the first layer has none.
KernelCase backward_case(int64_t b, int64_t in, int64_t out, bool head, bool with_dx) {
  auto buf = std::make_shared<Buffers>();
  const auto x = random_values(b * in, -0.5f, 1.0f, 7), w = random_values(out * in, -0.05f, 0.05f, 8);
  const auto dw0 = random_values(out * in, -0.01f, 0.01f, 9), db0 = random_values(out, -0.01f, 0.01f, 10);
  // head: softmax rows (normalized) and labels; hidden: dz.
  std::vector<float> dz_or_p = random_values(b * out, head ? 0.0f : -0.1f, head ? 1.0f : 0.1f, 11);
  std::vector<int32_t> labels(static_cast<std::size_t>(b));
  for (int64_t i = 0; i < b; ++i) {
    labels[i] = static_cast<int32_t>((i * 3) % out);
    if (!head) continue;
    double s = 0;
    for (int64_t c = 0; c < out; ++c) s += dz_or_p[i * out + c];
    for (int64_t c = 0; c < out; ++c) dz_or_p[i * out + c] = static_cast<float>(dz_or_p[i * out + c] / s);
  }
  const float *xp = buf->put(x), *wp = buf->put(w), *dzp = buf->put(dz_or_p);
  const int32_t* yp = buf->put(labels);
  const float* seed = buf->put(std::vector<float>{1.0f});
  float* dwp = buf->put(dw0);
  float* dbp = buf->put(db0);
  float* dxp = with_dx ? buf->put(std::vector<float>(static_cast<std::size_t>(b * in))) : nullptr;
  kernels::FusedGradients g;
  g.dw = dwp;
  g.beta_w = 1.0f;
  g.db = dbp;
  g.beta_b = 1.0f;
  g.dx = dxp;
  g.mask_relu = with_dx;
  KernelCase k;
  k.buffers = buf;
  k.bytes = 4.0 * (b * out + b * in + 2.0 * out * in + 2.0 * out + (with_dx ? out * in + b * in : 0));
  k.flops = 2.0 * b * in * out * (with_dx ? 2 : 1);
  k.reset = [=] {  // the accumulated gradients back to their initial values
    copy_bytes(dwp, Device::cuda(0), dw0.data(), Device::cpu(), dw0.size() * sizeof(float));
    copy_bytes(dbp, Device::cuda(0), db0.data(), Device::cpu(), db0.size() * sizeof(float));
  };
  k.run = [=] {
    if (head)
      kernels::fused_head_backward_cuda(dzp, yp, seed, 1.0f, xp, wp, b, in, out, g, stream());
    else
      kernels::fused_linear_backward_cuda(dzp, xp, wp, b, in, out, g, stream());
  };
  k.check = [=] {
    std::vector<double> dz(dz_or_p.begin(), dz_or_p.end());
    if (head)
      for (int64_t i = 0; i < b; ++i) dz[i * out + labels[i]] -= 1.0;
    std::vector<double> dw(dw0.begin(), dw0.end()), db(db0.begin(), db0.end()), dx(static_cast<std::size_t>(b * in));
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < out; ++j) {
        db[j] += dz[i * out + j];
        for (int64_t q = 0; q < in; ++q) {
          dw[j * in + q] += dz[i * out + j] * x[i * in + q];
          dx[i * in + q] += dz[i * out + j] * w[j * in + q];
        }
      }
    for (std::size_t q = 0; q < dx.size(); ++q)
      if (x[q] <= 0) dx[q] = 0;
    double e = std::max(max_rel_error(Buffers::get(dwp, dw.size()), dw), max_rel_error(Buffers::get(dbp, db.size()), db));
    if (with_dx) e = std::max(e, max_rel_error(Buffers::get(dxp, dx.size()), dx));
    return e;
  };
  return k;
}

void register_device(Device device) {
  if (device.is_cpu()) return;  // the kernels are CUDA's
  const std::vector<std::pair<std::string, std::function<KernelCase(int64_t)>>> kernels = {
      {"forward_784x512_relu", [](int64_t b) { return forward_case(b, 784, 512); }},
      {"forward_512x512_relu", [](int64_t b) { return forward_case(b, 512, 512); }},
      {"head_forward_512x10", [](int64_t b) { return head_forward_case(b, 512, 10); }},
      {"head_backward_512x10", [](int64_t b) { return backward_case(b, 512, 10, true, true); }},
      {"backward_512x512", [](int64_t b) { return backward_case(b, 512, 512, false, true); }},
      {"backward_784x512", [](int64_t b) { return backward_case(b, 784, 512, false, false); }},
  };
  for (const auto& [name, make] : kernels)
    for (int64_t b : {16, 64, 256, 1024})
      add("cuda/" + name + "/" + std::to_string(b), bench_kernel, make, b)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
}

#else

void register_device(Device) {}  // built without CUDA: nothing to measure

#endif

}  // namespace

int main(int argc, char** argv) {
  return run_benchmarks(argc, argv, "bench_fused_kernels", "the fused MLP path's kernels at the seed MLP's shapes",
                        register_device);
}
