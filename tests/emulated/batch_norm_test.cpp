// batch_norm2d's CUDA kernels (kernels/cuda/batch_norm.cu), the very source nvcc compiles, run on the
// CPU through tests/emulation/cuda_runtime.h, against the CPU kernels (kernels/cpu/batch_norm.cpp):
// evaluation mode's saved running statistics and its backward (dx bit for bit, the parameter
// gradients) in f32, bf16 and f16 with their own betas (0 over NaN, 1 adding) or absent, NaN and Inf
// inputs, zero sizes; the num_batches_tracked counter.
// Shapes: n * hw of 21 (one partial pass of a 256-thread block) and 600 (two full passes and a
// partial one: 600 = 2 * 256 + 88); 2 to 4 channels, each a block; the element-wise kernel over
// several blocks (1800 elements). Every emulated CUDA thread is a host thread and every barrier
// wakes 256 of them, so the cases are few and small.
// Tolerances: the CPU sums in double, a block sums in f32 in its own order, so the parameter
// gradients agree to 1e-5 relative plus 2e-5 absolute (sums of up to 600 terms of order 1, where
// each f32 add may drop 2^-24 of the partial sum), not bit for bit; dx = gamma * invstd * dy has no
// sum in it and matches bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/conv_kernels.h"
#include "kernels/cuda/kernels.h"
#include "tests/emulated/emulated.h"

namespace cumulus::testing {
namespace {

using kernels::from_f32;
using kernels::to_f32;

struct Dims {
  int64_t n, c, hw;
  std::size_t size() const { return static_cast<std::size_t>(n * c * hw); }
  std::string name() const { return std::to_string(n) + " x " + std::to_string(c) + " x " + std::to_string(hw); }
};

const std::vector<Dims> kShapes = {{3, 2, 7}, {2, 3, 300}};
constexpr float kEps = 1e-5f;
constexpr double kStatRel = 1e-5, kSumAbs = 2e-5;
// ---- evaluation mode: backward ----------------------------------------------------------------

// Where the backward writes and with which betas; a null sink is skipped.
struct Sinks {
  const char* name;
  bool dx, dgamma, dbeta;
  float beta_dx, beta_dgamma, beta_dbeta;
};
const std::vector<Sinks> kSinks = {{"all overwrite NaN", true, true, true, 0, 0, 0},
                                   {"all accumulate", true, true, true, 1, 1, 1},
                                   {"dx alone", true, false, false, 0, 0, 0},
                                   {"dgamma accumulates, dbeta overwrites, no dx", false, true, true, 0, 1, 0}};

struct BackwardInputs {
  std::vector<float> x, dy, gamma, mean, invstd;
};

// x, dy, gamma and the saved statistics random.
BackwardInputs backward_inputs(const Dims& d) {
  return BackwardInputs{random_values(static_cast<int64_t>(d.size()), -1.0f, 3.0f, 20),
                        random_values(static_cast<int64_t>(d.size()), -1.0f, 1.0f, 21),
                        random_values(d.c, 0.5f, 1.5f, 22), random_values(d.c, 0.5f, 1.5f, 23),
                        random_values(d.c, 0.5f, 2.0f, 24)};
}

// The CPU's and the emulated kernel's gradients for the same inputs, each sink starting at NaN
// (beta 0) or a random old value (beta 1).
template <typename T>
void check_backward(const Dims& d, const BackwardInputs& in, const Sinks& s) {
  SCOPED_TRACE(s.name);
  const std::vector<T> x = stored_as<T>(in.x), dy = stored_as<T>(in.dy);
  auto start = [](std::size_t n, float beta, uint64_t seed) {
    return beta == 0.0f ? std::vector<float>(n, kNaN) : random_values(static_cast<int64_t>(n), -1.0f, 1.0f, seed);
  };
  const std::vector<T> dx0 = stored_as<T>(start(d.size(), s.beta_dx, 25));
  const std::vector<float> dgamma0 = start(d.c, s.beta_dgamma, 26), dbeta0 = start(d.c, s.beta_dbeta, 27);
  auto cpu_dx = dx0, gpu_dx = dx0;
  auto cpu_dgamma = dgamma0, gpu_dgamma = dgamma0, cpu_dbeta = dbeta0, gpu_dbeta = dbeta0;
  auto ptr = [](bool wanted, auto& v) { return wanted ? v.data() : nullptr; };
  kernels::batch_norm_backward_cpu(x.data(), dy.data(), in.gamma.data(), in.mean.data(), in.invstd.data(), d.n, d.c,
                                   d.hw, false, s.beta_dx, ptr(s.dx, cpu_dx), s.beta_dgamma, ptr(s.dgamma, cpu_dgamma),
                                   s.beta_dbeta, ptr(s.dbeta, cpu_dbeta));
  kernels::batch_norm_backward_inference_cuda(dtype_of<T>::value, x.data(), dy.data(), in.gamma.data(), in.mean.data(),
                                              in.invstd.data(), d.n, d.c, d.hw, s.beta_dx, ptr(s.dx, gpu_dx),
                                              s.beta_dgamma, ptr(s.dgamma, gpu_dgamma), s.beta_dbeta,
                                              ptr(s.dbeta, gpu_dbeta), nullptr);
  expect_same_values(gpu_dx, cpu_dx, "dx");
  expect_within(gpu_dgamma, as_double(cpu_dgamma), kStatRel, kSumAbs, "dgamma");
  expect_within(gpu_dbeta, as_double(cpu_dbeta), kStatRel, kSumAbs, "dbeta");
  if (!s.dx) expect_same_values(gpu_dx, dx0, "dx absent: untouched");
}

// Every sink rule at the small shape, overwriting and accumulating at the one of several passes per
// thread; with `all` false, only the small shape's overwriting and accumulating.
template <typename T>
void backward_cases(bool all) {
  SCOPED_TRACE(dtype_name(dtype_of<T>::value));
  for (std::size_t k = 0; k < (all ? 2 : 1); ++k) {
    SCOPED_TRACE(kShapes[k].name());
    const BackwardInputs in = backward_inputs(kShapes[k]);
    for (std::size_t i = 0; i < (all && k == 0 ? kSinks.size() : 2); ++i) check_backward<T>(kShapes[k], in, kSinks[i]);
  }
}

// n = 0: the parameter gradients are empty sums, 0 (or the old value with beta 1); no dx to write.
// c = 0: nothing launched.
TEST(BatchNormKernelsEmulated, BackwardOfZeroSize) {
  const Dims d{0, 2, 4};
  const BackwardInputs in = backward_inputs(d);
  for (std::size_t i = 0; i < 2; ++i) check_backward<BFloat16>(d, in, kSinks[i]);
  float poison = kNaN;
  kernels::batch_norm_backward_inference_cuda(DType::bf16, nullptr, nullptr, nullptr, nullptr, nullptr, 2, 0, 4, 0.0f,
                                              nullptr, 0.0f, &poison, 0.0f, &poison, nullptr);
  EXPECT_TRUE(std::isnan(poison));
}

// save_mean = running_mean (bits), save_invstd = 1 / sqrt(running_var + eps) within 2 units in the
// last place (the device's rsqrtf: CUDA's documented bound), NaN for a NaN variance, 0 for an
// infinite one. 300 channels: two blocks of 256 threads, the second partial; 1 channel: one thread.
TEST(BatchNormKernelsEmulated, SavesTheRunningStatistics) {
  for (int64_t c : {300, 1}) {
    SCOPED_TRACE(std::to_string(c) + " channels");
    const auto mean = random_values(c, -2.0f, 2.0f, 30);
    auto var = random_values(c, 0.0f, 3.0f, 31);
    var[0] = 0.0f;  // 1 / sqrt(eps)
    if (c > 2) var[1] = kNaN, var[2] = kInf;
    std::vector<float> save_mean(c, kNaN), save_invstd(c, kNaN);
    kernels::batch_norm_save_running_stats_cuda(mean.data(), var.data(), c, kEps, save_mean.data(), save_invstd.data(),
                                                nullptr);
    expect_same_bits(save_mean, mean, "save_mean");
    std::vector<double> want(c);
    for (int64_t i = 0; i < c; ++i) want[i] = 1.0 / std::sqrt(static_cast<double>(var[i]) + kEps);
    expect_within(save_invstd, want, 2.0 / (1 << 23), 0.0, "save_invstd");
  }
  kernels::batch_norm_save_running_stats_cuda(nullptr, nullptr, 0, kEps, nullptr, nullptr, nullptr);  // no launch
}

// Every sink rule in bf16; f32 and f16 overwriting and accumulating at the small shape.
TEST(BatchNormKernelsEmulated, EvaluationBackwardMatchesTheCpu) {
  backward_cases<BFloat16>(true);
  backward_cases<float>(false);
  backward_cases<Half>(false);
}

// Evaluation mode's dx = gamma * invstd * dy does not depend on x: a NaN or an infinity in x leaves
// it finite (it makes the channel's dgamma NaN), a NaN in dy makes that element's dx NaN.
TEST(BatchNormKernelsEmulated, EvaluationBackwardPropagatesNaNAndInf) {
  const Dims d{3, 4, 7};
  BackwardInputs in = backward_inputs(d);
  in.dy[2] = kNaN;
  in.x[1 * d.hw + 5] = kNaN;
  in.x[(d.c + 2) * d.hw] = -kInf;
  check_backward<float>(d, in, kSinks[0]);
  check_backward<Half>(d, in, kSinks[1]);
  std::vector<float> dx(d.size(), kNaN);
  kernels::batch_norm_backward_inference_cuda(DType::f32, in.x.data(), in.dy.data(), in.gamma.data(), in.mean.data(),
                                              in.invstd.data(), d.n, d.c, d.hw, 0.0f, dx.data(), 0.0f, nullptr, 0.0f,
                                              nullptr, nullptr);
  for (std::size_t i = 0; i < dx.size(); ++i) EXPECT_EQ(std::isnan(dx[i]), i == 2) << i;
}

TEST(BatchNormKernelsEmulated, IncrementsTheCounter) {
  int32_t counter = 41;
  kernels::increment_i32_cuda(&counter, nullptr);
  kernels::increment_i32_cuda(&counter, nullptr);
  EXPECT_EQ(counter, 43);
}

}  // namespace
}  // namespace cumulus::testing
