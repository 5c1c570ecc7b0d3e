// batch_norm2d's CUDA kernels (kernels/cuda/batch_norm.cu), the very source nvcc compiles, run on the
// CPU through tests/emulation/cuda_runtime.h, against the CPU kernels (kernels/cpu/batch_norm.cpp):
//  - training mode (bf16's path on CUDA, Note [bf16 on cuDNN]; templated, so f32 and f16 too): the
//    statistics, the running statistics (unbiased variance, momentum), y, and the backward's dx,
//    dgamma and dbeta with their own betas (0 over NaN, 1 adding) or absent;
//  - evaluation mode: the saved running statistics, and the backward (dx bit for bit, the
//    parameter gradients) in f32, bf16 and f16; the num_batches_tracked counter;
//  - NaN and Inf inputs, zero sizes, a variance that one pass over E[x^2] - E[x]^2 would lose.
// Shapes: n * hw of 21 (one partial pass of a 256-thread block), 600 (two full passes and a
// partial one: 600 = 2 * 256 + 88), and 1 (the unbiased variance's fallback); 2 to 4 channels, each
// a block; the element-wise kernels over several blocks (1800 elements). Every emulated CUDA thread
// is a host thread and every barrier wakes 256 of them, so the cases are few and small.
// Tolerances: the CPU sums in double, a block sums in f32 in its own order, so the two agree to
// float rounding, not bit for bit. Per-channel results (statistics, parameter gradients): 1e-5
// relative, plus 1e-6 (statistics) or 2e-5 (gradients: sums of up to 600 terms of order 1, where
// each f32 add may drop 2^-24 of the partial sum) absolute. Per-element results stored as T: one
// rounding of T (unit_rounding<T>) relative, plus 1e-5 absolute for what the statistics' last bits
// move before the rounding. Formulas with no sum in them (y from given statistics, evaluation
// mode's dx) match bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
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

const std::vector<Dims> kShapes = {{3, 2, 7}, {2, 3, 300}, {1, 2, 1}};
constexpr float kEps = 1e-5f, kMomentum = 0.1f;
constexpr double kStatRel = 1e-5, kStatAbs = 1e-6, kSumAbs = 2e-5, kOrderAbs = 1e-5;

// ---- training mode: forward ------------------------------------------------------------------

// A channel constant after rounding to f16 (3000.3 -> 3000), far from 0: its output is exactly
// beta. Folded as x * scale + (beta - mean * scale), with scale about 300, it cancelled to within
// 0.06. Both devices' kernels.
TEST(BatchNormKernelsEmulated, AConstantChannelGivesItsBias) {
  const int64_t n = 2, c = 2, hw = 9;
  auto xv = random_values(n * c * hw, -2.0f, 3.0f, 30);
  for (int64_t i = 0; i < n; ++i) std::fill_n(xv.begin() + (i * c + 1) * hw, hw, 3000.3f);
  const DeviceVector<Half> x = stored_as<Half>(xv);
  const auto gamma = random_values(c, 0.5f, 1.5f, 31), beta = random_values(c, -0.5f, 0.5f, 32);
  for (bool cuda : {false, true}) {
    SCOPED_TRACE(cuda ? "CUDA" : "CPU");
    DeviceVector<Half> y(x.size(), from_f32<Half>(kNaN));
    DeviceVector<float> mean(c), invstd(c);
    if (cuda)
      kernels::batch_norm_forward_training_cuda(x.data(), gamma.data(), beta.data(), n, c, hw, kEps, kMomentum, nullptr,
                                                nullptr, y.data(), mean.data(), invstd.data(), nullptr);
    else
      kernels::batch_norm_forward_training_cpu(x.data(), gamma.data(), beta.data(), n, c, hw, kEps, kMomentum, nullptr,
                                               nullptr, y.data(), mean.data(), invstd.data());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < hw; ++j)
        ASSERT_EQ(to_f32(y[(i * c + 1) * hw + j]), to_f32(from_f32<Half>(beta[1]))) << "element " << j;
  }
}

// The running statistics start at `rm`, `rv`; null running statistics (a recomputed forward) stay
// untouched.
template <typename T>
void check_forward_training(const Dims& d, const DeviceVector<float>& xv, bool running, bool compare_y = true) {
  const DeviceVector<T> x = stored_as<T>(xv);
  const auto gamma = random_values(d.c, 0.5f, 1.5f, 11), beta = random_values(d.c, -0.5f, 0.5f, 12);
  const auto rm = random_values(d.c, -0.2f, 0.2f, 13), rv = random_values(d.c, 0.5f, 1.5f, 14);
  auto cpu_rm = rm, cpu_rv = rv;
  DeviceVector<T> cpu_y(d.size());
  DeviceVector<float> cpu_mean(d.c), cpu_invstd(d.c);
  kernels::batch_norm_forward_training_cpu(x.data(), gamma.data(), beta.data(), d.n, d.c, d.hw, kEps, kMomentum,
                                           running ? cpu_rm.data() : nullptr, running ? cpu_rv.data() : nullptr,
                                           cpu_y.data(), cpu_mean.data(), cpu_invstd.data());
  auto gpu_rm = rm, gpu_rv = rv;
  DeviceVector<T> y(d.size(), from_f32<T>(kNaN));
  DeviceVector<float> mean(d.c, kNaN), invstd(d.c, kNaN);
  kernels::batch_norm_forward_training_cuda(x.data(), gamma.data(), beta.data(), d.n, d.c, d.hw, kEps, kMomentum,
                                            running ? gpu_rm.data() : nullptr, running ? gpu_rv.data() : nullptr,
                                            y.data(), mean.data(), invstd.data(), nullptr);
  expect_within(mean, as_double(cpu_mean), kStatRel, kStatAbs, "save_mean");
  expect_within(invstd, as_double(cpu_invstd), kStatRel, kStatAbs, "save_invstd");
  expect_within(gpu_rm, as_double(cpu_rm), kStatRel, kStatAbs, "running_mean");
  expect_within(gpu_rv, as_double(cpu_rv), kStatRel, kStatAbs, "running_var");
  if (!running) {
    expect_same_bits(gpu_rm, rm, "running_mean left alone");
    expect_same_bits(gpu_rv, rv, "running_var left alone");
  }
  // Contracted, y = (x - mean) scale + beta may be an FMA whose product goes unrounded: y moves by a
  // rounding of the product's size.
  DeviceVector<T> want(d.size());
  std::vector<double> contraction(d.size(), 0.0);
  for (std::size_t i = 0; i < want.size(); ++i) {
    const int64_t ch = static_cast<int64_t>(i) / d.hw % d.c;
    const float scale = gamma[ch] * invstd[ch];
    want[i] = from_f32<T>((to_f32(x[i]) - mean[ch]) * scale + beta[ch]);
    if (!compiled_bitwise("batch_norm.cu"))
      contraction[i] = 2 * unit_rounding<float>() * std::abs((to_f32(x[i]) - mean[ch]) * scale);
  }
  if (compare_y) {
    std::vector<double> slack = contraction;
    for (double& s : slack) s += kOrderAbs;
    expect_within_each(y, as_double(cpu_y), unit_rounding<T>(), slack, "y");
  }
  // y is the CPU's formula applied to the kernel's own statistics: bit for bit unless contracted.
  if (compiled_bitwise("batch_norm.cu")) expect_same_values(y, want, "y from the kernel's statistics");
  else expect_within_each(y, as_double(want), unit_rounding<T>(), contraction, "y from the kernel's statistics");
}

template <typename T>
void forward_training_case(const Dims& d, bool running) {
  SCOPED_TRACE(std::string(dtype_name(dtype_of<T>::value)) + ", " + d.name() +
               (running ? "" : ", no running statistics"));
  check_forward_training<T>(d, random_values(static_cast<int64_t>(d.size()), -1.0f, 3.0f, 10), running);
}

// Every shape in f32 and bf16 (bf16's path on CUDA); f16 and null running statistics once each.
TEST(BatchNormKernelsEmulated, TrainingForwardMatchesTheCpu) {
  for (const Dims& d : kShapes) {
    forward_training_case<float>(d, true);
    forward_training_case<BFloat16>(d, true);
  }
  forward_training_case<Half>(kShapes[1], true);
  forward_training_case<BFloat16>(kShapes[0], false);
}

// x = 1000 + U(-1, 1): E[x^2] and E[x]^2 are 1e6 apart by 1/3, below f32's resolution of them
// (2^-4), so one pass would lose the variance; the second pass over (x - mean)^2 keeps it. y = (x -
// mean) * scale + beta moves with the mean's last bit (6e-5, times a scale of 1.7), so its
// agreement with the CPU is the statistics' (checked above it), and only its formula is compared.
TEST(BatchNormKernelsEmulated, TrainingVarianceTakesASecondPass) {
  const Dims d{2, 3, 300};
  auto xv = random_values(static_cast<int64_t>(d.size()), -1.0f, 1.0f, 15);
  for (float& v : xv) v += 1000.0f;
  check_forward_training<float>(d, xv, true, false);
}

// A NaN in channel 1 and an infinity in channel 2 make those channels' statistics, running
// statistics and outputs NaN, as on the CPU; the other channels are untouched by them.
TEST(BatchNormKernelsEmulated, TrainingForwardPropagatesNaNAndInf) {
  const Dims d{3, 4, 7};
  auto xv = random_values(static_cast<int64_t>(d.size()), -1.0f, 1.0f, 16);
  xv[1 * d.hw + 3] = kNaN;
  xv[(2 * d.c + 2) * d.hw] = kInf;
  check_forward_training<float>(d, xv, true);
  check_forward_training<BFloat16>(d, xv, true);
}

// No channels: nothing launched, nothing written. No values per channel (n = 0): the mean is 0 / 0,
// NaN, with everything after it, as on the CPU.
TEST(BatchNormKernelsEmulated, TrainingForwardOfZeroSize) {
  check_forward_training<BFloat16>(Dims{0, 3, 4}, {}, true);
  float poison = kNaN;
  kernels::batch_norm_forward_training_cuda<BFloat16>(nullptr, nullptr, nullptr, 2, 0, 4, kEps, kMomentum, nullptr,
                                                      nullptr, nullptr, &poison, &poison, nullptr);
  EXPECT_TRUE(std::isnan(poison));
}

// ---- training mode: backward -----------------------------------------------------------------

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
  DeviceVector<float> x, dy, gamma, mean, invstd;
};

// x, dy and gamma random, and the statistics the CPU's forward saves for them (training) or given
// ones (evaluation).
BackwardInputs backward_inputs(const Dims& d, bool training) {
  BackwardInputs in{random_values(static_cast<int64_t>(d.size()), -1.0f, 3.0f, 20),
                    random_values(static_cast<int64_t>(d.size()), -1.0f, 1.0f, 21), random_values(d.c, 0.5f, 1.5f, 22),
                    random_values(d.c, 0.5f, 1.5f, 23), random_values(d.c, 0.5f, 2.0f, 24)};
  if (training && d.size() > 0) {
    DeviceVector<float> beta(d.c, 0.0f), y(d.size());
    kernels::batch_norm_forward_training_cpu(in.x.data(), in.gamma.data(), beta.data(), d.n, d.c, d.hw, kEps, kMomentum,
                                             nullptr, nullptr, y.data(), in.mean.data(), in.invstd.data());
  }
  return in;
}

// The CPU's and the emulated kernel's gradients for the same inputs, each sink starting at NaN
// (beta 0) or a random old value (beta 1).
template <typename T>
void check_backward(const Dims& d, const BackwardInputs& in, bool training, const Sinks& s) {
  SCOPED_TRACE(s.name);
  const DeviceVector<T> x = stored_as<T>(in.x), dy = stored_as<T>(in.dy);
  auto start = [](std::size_t n, float beta, uint64_t seed) {
    return beta == 0.0f ? DeviceVector<float>(n, kNaN) : random_values(static_cast<int64_t>(n), -1.0f, 1.0f, seed);
  };
  const DeviceVector<T> dx0 = stored_as<T>(start(d.size(), s.beta_dx, 25));
  const DeviceVector<float> dgamma0 = start(d.c, s.beta_dgamma, 26), dbeta0 = start(d.c, s.beta_dbeta, 27);
  auto cpu_dx = dx0, gpu_dx = dx0;
  auto cpu_dgamma = dgamma0, gpu_dgamma = dgamma0, cpu_dbeta = dbeta0, gpu_dbeta = dbeta0;
  auto ptr = [](bool wanted, auto& v) { return wanted ? v.data() : nullptr; };
  kernels::batch_norm_backward_cpu(x.data(), dy.data(), in.gamma.data(), in.mean.data(), in.invstd.data(), d.n, d.c,
                                   d.hw, training, s.beta_dx, ptr(s.dx, cpu_dx), s.beta_dgamma,
                                   ptr(s.dgamma, cpu_dgamma), s.beta_dbeta, ptr(s.dbeta, cpu_dbeta));
  if (training)
    kernels::batch_norm_backward_training_cuda(
        x.data(), dy.data(), in.gamma.data(), in.mean.data(), in.invstd.data(), d.n, d.c, d.hw, s.beta_dx,
        ptr(s.dx, gpu_dx), s.beta_dgamma, ptr(s.dgamma, gpu_dgamma), s.beta_dbeta, ptr(s.dbeta, gpu_dbeta), nullptr);
  else
    kernels::batch_norm_backward_inference_cuda(dtype_of<T>::value, x.data(), dy.data(), in.gamma.data(),
                                                in.mean.data(), in.invstd.data(), d.n, d.c, d.hw, s.beta_dx,
                                                ptr(s.dx, gpu_dx), s.beta_dgamma, ptr(s.dgamma, gpu_dgamma),
                                                s.beta_dbeta, ptr(s.dbeta, gpu_dbeta), nullptr);
  // Training's dx uses the sums; evaluation's is gamma * invstd * dy, the CPU's bits.
  if (training) expect_within(gpu_dx, as_double(cpu_dx), unit_rounding<T>(), kOrderAbs, "dx");
  else expect_cpu_parity("batch_norm.cu", gpu_dx, cpu_dx, unit_rounding<T>(), kContractionAbs, "dx", Exact::values);
  expect_within(gpu_dgamma, as_double(cpu_dgamma), kStatRel, kSumAbs, "dgamma");
  expect_within(gpu_dbeta, as_double(cpu_dbeta), kStatRel, kSumAbs, "dbeta");
  if (!s.dx) expect_same_values(gpu_dx, dx0, "dx absent: untouched");
}

// Every sink rule at the small shape, overwriting and accumulating at the one of several passes per
// thread (the third shape adds nothing per channel); with `all` false, only the small shape's
// overwriting and accumulating.
template <typename T>
void backward_cases(bool training, bool all) {
  SCOPED_TRACE(dtype_name(dtype_of<T>::value));
  for (std::size_t k = 0; k < (all ? 2 : 1); ++k) {
    SCOPED_TRACE(kShapes[k].name());
    const BackwardInputs in = backward_inputs(kShapes[k], training);
    for (std::size_t i = 0; i < (all && k == 0 ? kSinks.size() : 2); ++i)
      check_backward<T>(kShapes[k], in, training, kSinks[i]);
  }
}

// Every sink rule in f32 and bf16; f16 overwriting and accumulating at the small shape.
TEST(BatchNormKernelsEmulated, TrainingBackwardMatchesTheCpu) {
  backward_cases<float>(true, true);
  backward_cases<BFloat16>(true, true);
  backward_cases<Half>(true, false);
}

// NaN in dy (channel 0) and x (channel 1) and an infinity in x (channel 2): NaN gradients in those
// channels as on the CPU, the last channel clean.
TEST(BatchNormKernelsEmulated, TrainingBackwardPropagatesNaNAndInf) {
  const Dims d{3, 4, 7};
  BackwardInputs in = backward_inputs(d, true);
  in.dy[2] = kNaN;
  in.x[1 * d.hw + 5] = kNaN;
  in.x[(d.c + 2) * d.hw] = kInf;
  check_backward<float>(d, in, true, kSinks[0]);
  check_backward<BFloat16>(d, in, true, kSinks[1]);
}

// n = 0: the parameter gradients are empty sums, 0 (or the old value with beta 1); no dx to write.
// c = 0: nothing launched.
TEST(BatchNormKernelsEmulated, BackwardOfZeroSize) {
  const Dims d{0, 2, 4};
  const BackwardInputs in = backward_inputs(d, false);
  for (bool training : {true, false})
    for (std::size_t i = 0; i < 2; ++i) check_backward<BFloat16>(d, in, training, kSinks[i]);
  float poison = kNaN;
  kernels::batch_norm_backward_training_cuda<BFloat16>(nullptr, nullptr, nullptr, nullptr, nullptr, 2, 0, 4, 0.0f,
                                                       nullptr, 0.0f, &poison, 0.0f, &poison, nullptr);
  kernels::batch_norm_backward_inference_cuda(DType::bf16, nullptr, nullptr, nullptr, nullptr, nullptr, 2, 0, 4, 0.0f,
                                              nullptr, 0.0f, &poison, 0.0f, &poison, nullptr);
  EXPECT_TRUE(std::isnan(poison));
}

// ---- evaluation mode --------------------------------------------------------------------------

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
    DeviceVector<float> save_mean(c, kNaN), save_invstd(c, kNaN);
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
  backward_cases<BFloat16>(false, true);
  backward_cases<float>(false, false);
  backward_cases<Half>(false, false);
}

// Evaluation mode's dx = gamma * invstd * dy does not depend on x: a NaN or an infinity in x leaves
// it finite (it makes the channel's dgamma NaN), a NaN in dy makes that element's dx NaN.
TEST(BatchNormKernelsEmulated, EvaluationBackwardPropagatesNaNAndInf) {
  const Dims d{3, 4, 7};
  BackwardInputs in = backward_inputs(d, false);
  in.dy[2] = kNaN;
  in.x[1 * d.hw + 5] = kNaN;
  in.x[(d.c + 2) * d.hw] = -kInf;
  check_backward<float>(d, in, false, kSinks[0]);
  check_backward<Half>(d, in, false, kSinks[1]);
  DeviceVector<float> dx(d.size(), kNaN);
  kernels::batch_norm_backward_inference_cuda(DType::f32, in.x.data(), in.dy.data(), in.gamma.data(), in.mean.data(),
                                              in.invstd.data(), d.n, d.c, d.hw, 0.0f, dx.data(), 0.0f, nullptr, 0.0f,
                                              nullptr, nullptr);
  for (std::size_t i = 0; i < dx.size(); ++i) EXPECT_EQ(std::isnan(dx[i]), i == 2) << i;
}

TEST(BatchNormKernelsEmulated, IncrementsTheCounter) {
  DeviceValue<int32_t> counter(41);
  kernels::increment_i32_cuda(counter.get(), nullptr);
  kernels::increment_i32_cuda(counter.get(), nullptr);
  EXPECT_EQ(*counter, 43);
}

}  // namespace
}  // namespace cumulus::testing
