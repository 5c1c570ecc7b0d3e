// The optimizer step's CUDA kernels (kernels/cuda/optim.cu), the very source nvcc compiles, run on the
// CPU through tests/emulation/cuda_runtime.h beside the CPU path the Trainer takes on a CPU device
// (record_micro_batch, prepare_step on sum_squares_cpu, sgd_step_cpu / adamw_step_cpu): the same
// StepState, UpdateScalars and StepConfig on both, step after step.
//
// What must agree, and how closely:
// - The per-element updates share kernels/optim_rules.h with the CPU: given the same decision
//   (grad_scale, lr, update count), the weights and the momentum or Adam moments are the same bits.
// - The squared norm is summed in double on both devices but in different orders (the CPU in eight
//   lanes, the device over 256 blocks of strided slices and then a tree), so it is compared with a
//   reference summed without rounding error to speak of (Neumaier's compensated sum). Every term
//   x*x of a float x is exact in double and non-negative, so any order's sum S' has |S' - S| <=
//   (n - 1) 2^-53 S: about 1e-11 relative at n = 70001, far below a float's half ulp (2^-24). The
//   decision rounds to float once from there, so grad_norm and clip are each within one float ulp
//   of the reference decision (prepare_step on the reference sum), and grad_scale = scale * clip,
//   rounded once more, within two.
// - With dyadic gradients every sum is exact in any order, and then the whole StepState and
//   UpdateScalars are the same bits as the CPU's, as is every partial (which a float accumulation could not give: see
//   dyadic_gradient).
// Each emulated CUDA thread is a host thread: a launch of 256 blocks that each reduce (the norm,
// sum_squares) costs seconds, so there are three in all, each covering as much as it can.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cuda/kernels.h"
#include "kernels/optim_rules.h"
#include "tests/emulated/emulated.h"

namespace cumulus::testing {
namespace {

using kernels::StepBuffers;
using kernels::StepConfig;
using kernels::StepState;
using kernels::UpdateScalars;

constexpr int64_t kThreads = 256;    // cuda_common::kThreads: the threads of every block in optim.cu
constexpr int64_t kGuard = 3;        // elements past n that no launcher may write
constexpr double kUntouched = -1.0;  // a partial the norm launch never wrote

// Neumaier's compensated sum of the squares: the reference, off the exact sum by about one rounding.
// Every term is exact in double and non-negative.
double reference_sum_squares(const DeviceVector<float>& x) {
  double s = 0.0, c = 0.0;
  for (float v : x) {
    const double t = static_cast<double>(v) * v, u = s + t;
    c += s >= t ? (s - u) + t : (t - u) + s;
    s = u;
  }
  return std::isfinite(s) ? s + c : s;  // an infinity or NaN as a plain sum gives it
}

// The elements each block of a grid-stride launch of `blocks` blocks reads.
std::vector<DeviceVector<float>> block_slices(const DeviceVector<float>& x, int64_t blocks) {
  std::vector<DeviceVector<float>> slices(static_cast<std::size_t>(blocks));
  for (std::size_t i = 0; i < x.size(); ++i) slices[i % (blocks * kThreads) / kThreads].push_back(x[i]);
  return slices;
}

// Floats apart on the number line (0 for equal values or two NaNs; huge for NaN against a number).
int64_t ulps_apart(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) ? 0 : INT64_MAX;
  auto key = [](float f) {
    const int64_t magnitude = kernels::f32_bits(f) & 0x7fffffffu;
    return std::signbit(f) ? -magnitude : magnitude;
  };
  return std::abs(key(a) - key(b));
}

// (k / 64) 2^e for k in [-64, 64], and 2^(e - 13) at every 97th element: every square is a multiple of
// 2^(2e - 26) and n of them sum to at most n 2^(2e), 43 bits at n < 2^17, so double sums are exact in
// any order; a float sum of one block's squares (85 2^(2e) or more) would need 33 bits.
DeviceVector<float> dyadic_gradient(int64_t n, int e, uint64_t seed) {
  DeviceVector<float> g = random_values(n, -1, 1, seed);
  for (int64_t i = 0; i < n; ++i)
    g[i] = i % 97 == 50 ? std::ldexp(1.0f, e - 13) : std::ldexp(std::round(g[i] * 64) / 64, e);
  return g;
}

std::string describe(const StepState& s, const UpdateScalars& u) {
  return "{units " + std::to_string(s.epoch.units) + ", loss " + std::to_string(s.epoch.loss) + ", skip " +
         std::to_string(u.skip) + ", updates " + std::to_string(u.updates) + ", skipped " + std::to_string(s.skipped) +
         ", lr " + std::to_string(u.lr) + ", loss scale " + std::to_string(s.loss_scale) + " after " +
         std::to_string(s.loss_scale_clean_steps) + " clean}";
}

struct OptimizerConfig {  // adamw false: SGD
  bool adamw = false;
  float momentum = 0.0f, dampening = 0.0f;
  bool nesterov = false;
  float weight_decay = 0.0f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
};

struct MicroBatch {
  double samples;
  float loss;
};

// One side's flat parameters and optimizer buffers (the momentum, or Adam's m and v), kGuard longer.
struct Params {
  DeviceVector<float> w, m, v;
};

// The Trainer's step sequence on both devices at once: the emulated kernels on `dev`, the CPU
// twins on `cpu` (Trainer::decide_step and Optimizer::apply_update with a CPU device). Each step()
// compares the two and the reference decision.
class StepRun {
 public:
  StepRun(int64_t n, const StepConfig& config, DeviceVector<float> lr_table, const OptimizerConfig& opt,
          float loss_scale = 1.0f, int64_t lr_base = 0)
      : n_(n), config_(config), lr_table_(std::move(lr_table)), opt_(opt) {
    config_.lr_table_size = static_cast<int32_t>(lr_table_.size());
    dev_->state.loss_scale = loss_scale;
    dev_->state.lr_base = lr_base;
    for (double& p : dev_->partials) p = kUntouched;
    cpu_ = dev_->state;
    const auto w = random_values(n + kGuard, -1, 1, 100);
    // SGD's buffer is uninitialized memory in the engine (the first update sets it): NaN here.
    const float m0 = opt.adamw ? 0.0f : kNaN;
    initial_ = {w, DeviceVector<float>(w.size(), m0), DeviceVector<float>(w.size(), 0.0f)};
    dev_params_ = cpu_params_ = initial_;
  }

  // One step: the micro-batches recorded, then the norm and the decision, then the update.
  // exact_norm: the gradient's squared norm sums exactly (dyadic_gradient), so the decision must
  // be the same bits on both devices.
  void step(const std::vector<MicroBatch>& micro_batches, const DeviceVector<float>& grad, bool exact_norm) {
    ASSERT_EQ(static_cast<int64_t>(grad.size()), n_);
    for (const MicroBatch& mb : micro_batches) {
      DeviceValue<float> loss(mb.loss);
      kernels::record_micro_batch_cuda(dev_.get(), loss.get(), mb.samples, nullptr);
      kernels::record_micro_batch(cpu_, mb.samples, mb.loss);
    }
    StepState reference = cpu_;
    UpdateScalars reference_scalars = cpu_scalars_;
    kernels::grad_norm_and_prepare_step_cuda(grad.data(), n_, dev_.get(), dev_scalars_.get(), config_, lr_table_.data(),
                                             nullptr);
    kernels::prepare_step(cpu_, cpu_scalars_, config_.need_norm ? kernels::sum_squares_cpu(grad.data(), n_) : 0.0,
                          config_, lr_table_.data());
    kernels::prepare_step(reference, reference_scalars, config_.need_norm ? reference_sum_squares(grad) : 0.0, config_,
                          lr_table_.data());
    EXPECT_EQ(dev_->blocks_done, 0u) << "the last block resets the arrival counter";
    check_partials(grad, exact_norm);
    check_decision(reference, reference_scalars, exact_norm);
    update_device(grad);
    update_cpu(grad);
    // After several steps: each step's FMAs add a rounding or so per product to what came before.
    const double rel = 16 * unit_rounding<float>(), abs = 4 * kContractionAbs;
    expect_cpu_parity("optim.cu", dev_params_.w, cpu_params_.w, rel, abs, "weights");
    expect_cpu_parity("optim.cu", dev_params_.m, cpu_params_.m, rel, abs, opt_.adamw ? "m" : "momentum");
    expect_cpu_parity("optim.cu", dev_params_.v, cpu_params_.v, rel, abs, "v");
    check_guard(dev_params_);
  }

  const StepBuffers& device() const { return *dev_; }
  const UpdateScalars& device_scalars() const { return *dev_scalars_; }
  const Params& device_params() const { return dev_params_; }
  const Params& initial_params() const { return initial_; }

 private:
  // Each block's partial against the reference sum of its grid-stride slice: exact for dyadic
  // gradients; else within 1e-14 relative (each thread adds at most two squares, then block_sum's
  // eight levels: at most nine roundings of 2^-53 on any path). Left alone when the norm is off.
  void check_partials(const DeviceVector<float>& grad, bool exact) const {
    const std::vector<DeviceVector<float>> slices = block_slices(grad, StepBuffers::kNormPartials);
    for (int b = 0; b < StepBuffers::kNormPartials; ++b) {
      const double got = dev_->partials[b];
      if (!config_.need_norm) {
        ASSERT_EQ(got, kUntouched) << "norm off: partial " << b << " written";
        continue;
      }
      const double want = reference_sum_squares(slices[b]),
                   tolerance = exact || !std::isfinite(want) ? 0.0 : 1e-14 * want;
      ASSERT_TRUE(got == want || std::abs(got - want) <= tolerance || (std::isnan(got) && std::isnan(want)))
          << "partial " << b << ": " << got << " vs " << want;
    }
  }

  // The device's and the CPU's decision against the reference decision (ulps justified at the top of
  // the file; 0 when the sums are exact), then the CPU's floats taken from the device, so that the
  // rest of the state and the updates must match bit for bit.
  void check_decision(const StepState& reference, const UpdateScalars& reference_scalars, bool exact) {
    const StepState& d = dev_->state;
    const UpdateScalars& du = *dev_scalars_;
    for (const StepState* s : {&d, static_cast<const StepState*>(&cpu_)}) {
      const std::string who = s == &d ? "device" : "cpu";
      const UpdateScalars& u = s == &d ? du : cpu_scalars_;
      EXPECT_LE(ulps_apart(s->grad_norm, reference.grad_norm), exact ? 0 : 1)
          << who << " grad_norm " << s->grad_norm << " vs " << reference.grad_norm;
      EXPECT_LE(ulps_apart(s->clip, reference.clip), exact ? 0 : 1) << who << " clip";
      EXPECT_LE(ulps_apart(u.grad_scale, reference_scalars.grad_scale), exact ? 0 : 2) << who << " grad_scale";
    }
    cpu_.grad_norm = d.grad_norm;
    cpu_.clip = d.clip;
    cpu_scalars_.grad_scale = du.grad_scale;
    EXPECT_EQ(std::memcmp(&d, &cpu_, sizeof(StepState)), 0)
        << describe(d, du) << " vs " << describe(cpu_, cpu_scalars_);
    EXPECT_EQ(std::memcmp(&du, &cpu_scalars_, sizeof(UpdateScalars)), 0)
        << describe(d, du) << " vs " << describe(cpu_, cpu_scalars_);
  }

  void update_device(const DeviceVector<float>& grad) {
    Params& p = dev_params_;
    const OptimizerConfig& o = opt_;
    if (o.adamw)
      kernels::adamw_update_cuda(p.w.data(), grad.data(), p.m.data(), p.v.data(), n_, dev_scalars_.get(), o.beta1,
                                 o.beta2, o.eps, o.weight_decay, kernels::FrozenChunks{}, nullptr);
    else
      kernels::sgd_update_cuda(p.w.data(), grad.data(), o.momentum != 0.0f ? p.m.data() : nullptr, n_,
                               dev_scalars_.get(), o.momentum, o.dampening, o.nesterov, o.weight_decay,
                               kernels::FrozenChunks{}, nullptr);
  }

  // Optimizer::apply_update's CPU branch.
  void update_cpu(const DeviceVector<float>& grad) {
    const UpdateScalars& u = cpu_scalars_;
    if (u.skip) return;
    Params& p = cpu_params_;
    const OptimizerConfig& o = opt_;
    if (o.adamw)
      kernels::adamw_step_cpu(p.w.data(), grad.data(), p.m.data(), p.v.data(), n_, u.grad_scale, u.lr, o.beta1, o.beta2,
                              o.eps, o.weight_decay, u.updates, kernels::FrozenChunks{});
    else
      kernels::sgd_step_cpu(p.w.data(), grad.data(), o.momentum != 0.0f ? p.m.data() : nullptr, n_, u.grad_scale, u.lr,
                            o.momentum, o.dampening, o.nesterov, o.weight_decay, u.updates, kernels::FrozenChunks{});
  }

  void check_guard(const Params& p) const {
    auto tail = [&](const DeviceVector<float>& v) { return DeviceVector<float>(v.end() - kGuard, v.end()); };
    expect_same_bits(tail(p.w), tail(initial_.w), "weights past n");
    expect_same_bits(tail(p.m), tail(initial_.m), "m past n");
    expect_same_bits(tail(p.v), tail(initial_.v), "v past n");
  }

  int64_t n_;
  StepConfig config_;
  DeviceVector<float> lr_table_;
  OptimizerConfig opt_;
  DeviceValue<StepBuffers> dev_;
  DeviceValue<UpdateScalars> dev_scalars_;
  StepState cpu_{};
  UpdateScalars cpu_scalars_{};
  Params initial_, dev_params_, cpu_params_;
};

const std::vector<MicroBatch> kGroup = {{16, 2.25f}, {16, 2.0625f}, {5, 1.8125f}};  // 37 samples

StepConfig normalize_and_guard(float clip) {
  StepConfig c{};
  c.divide_by_units = 1;
  c.need_norm = 1;
  c.skip_non_finite = 1;
  c.clip_grad_norm = clip;
  return c;
}

// ---- the step ------------------------------------------------------------------------------------

// The Trainer's sequence with clipping, the non-finite guard and dynamic loss scaling, SGD with
// momentum, Nesterov and weight decay, n = 70001 (the norm's grid-stride loop goes round twice, the
// updates end in a partial block). Two steps, each norm costing seconds: a dyadic gradient with a NaN
// in the loop's second pass and a -Inf in its first (those two partials non-finite, every other one
// exact; skipped: nothing updated, the momentum still unset, the scale backed off), then a random
// one (clipped, the momentum's first step, the scale grown). The lr table starts one update before
// the first (lr_base -1).
TEST(OptimKernelsEmulated, StepSequenceMatchesTheCpuPath) {
  const int64_t n = 70001;
  StepConfig config = normalize_and_guard(0.25f);
  config.dynamic_loss_scale = 1;
  config.loss_scale_growth_interval = 1;
  config.loss_scale_growth = 2.0f;
  config.loss_scale_backoff = 0.5f;
  OptimizerConfig sgd;
  sgd.momentum = 0.9f;
  sgd.nesterov = true;
  sgd.weight_decay = 1e-2f;
  StepRun run(n, config, {0.1f, 0.05f, 0.025f}, sgd, 1024.0f, -1);
  const StepState& st = run.device().state;
  const UpdateScalars& u = run.device_scalars();

  DeviceVector<float> grad = dyadic_gradient(n, 4, 200);
  grad[70000] = kNaN;  // block 17's second slice
  grad[999] = -kInf;   // block 3
  run.step(kGroup, grad, true);
  EXPECT_TRUE(std::isnan(run.device().partials[17]));
  EXPECT_EQ(run.device().partials[3], kInf);
  EXPECT_EQ(u.skip, 1);
  EXPECT_TRUE(std::isnan(st.grad_norm));
  EXPECT_EQ(u.updates, 0);
  EXPECT_EQ(st.skipped, 1);
  EXPECT_EQ(st.loss_scale, 512.0f);
  expect_same_bits(run.device_params().w, run.initial_params().w, "skipped: weights");
  expect_same_bits(run.device_params().m, run.initial_params().m, "skipped: momentum");

  // Random times 2^10: a normalized norm near 8 at loss scale 512, clipped at 0.25.
  run.step(kGroup, random_values(n, -1024, 1024, 201), false);
  EXPECT_EQ(u.skip, 0);
  EXPECT_LT(st.clip, 1.0f) << "norm " << st.grad_norm;
  EXPECT_EQ(u.updates, 1);
  EXPECT_EQ(u.lr, 0.05f) << "update 0 is entry 1 of a table based at -1";
  EXPECT_EQ(st.loss_scale, 1024.0f);
  EXPECT_FALSE(std::isnan(run.device_params().m[0])) << "the first update sets the momentum";
  EXPECT_EQ(st.epoch.units, 2 * 37.0);
  EXPECT_EQ(st.epoch.loss, 2 * (2.25 + 2.0625 + 1.8125));
  EXPECT_EQ(st.group.units, 0.0);
}

// Without clipping or the guard the norm is not computed: one block, no partial written, grad_norm
// NaN. SGD plain, with momentum and dampening, with Nesterov and weight decay, and AdamW, three steps
// each (the momentum's first step sets the buffer; Adam's bias corrections move with t), with and
// without normalization by samples; the third gradient holds NaN and Inf, updated as given (no guard).
TEST(OptimKernelsEmulated, UpdatesWithoutTheNormMatchTheCpuRules) {
  std::vector<OptimizerConfig> optimizers(4);
  optimizers[1].momentum = 0.9f;
  optimizers[1].dampening = 0.5f;
  optimizers[2].momentum = 0.8f;
  optimizers[2].nesterov = true;
  optimizers[2].weight_decay = 1e-3f;
  optimizers[3].adamw = true;
  optimizers[3].weight_decay = 0.01f;
  for (std::size_t k = 0; k < optimizers.size(); ++k) {
    SCOPED_TRACE("optimizer " + std::to_string(k));
    StepConfig config{};
    config.divide_by_units = static_cast<int32_t>(k % 2);
    const int64_t n = 1000;
    StepRun run(n, config, {0.05f, 0.02f}, optimizers[k]);
    for (int i = 0; i < 3; ++i) {
      DeviceVector<float> grad = random_values(n, -1, 1, 400 + 10 * k + i);
      if (i == 2) {
        grad[7] = kNaN;
        grad[998] = kInf;
      }
      run.step(kGroup, grad, true);
      EXPECT_TRUE(std::isnan(run.device().state.grad_norm));
      EXPECT_EQ(run.device_scalars().updates, i + 1);
      EXPECT_EQ(run.device_scalars().lr, i == 0 ? 0.05f : 0.02f) << "the table's last entry held";
    }
    EXPECT_TRUE(std::isnan(run.device_params().w[7])) << "no guard: the NaN reaches the weights";
  }
}

// n = 0: the update launchers return without launching and nothing is written; the step still counts.
TEST(OptimKernelsEmulated, EmptyParametersWriteNothing) {
  for (bool adamw : {false, true}) {
    SCOPED_TRACE(adamw ? "adamw" : "sgd");
    OptimizerConfig opt;
    opt.adamw = adamw;
    opt.momentum = 0.9f;
    StepRun run(0, StepConfig{}, {0.1f}, opt);
    run.step(kGroup, {}, true);
    EXPECT_EQ(run.device_scalars().updates, 1);
    expect_same_bits(run.device_params().w, run.initial_params().w, "weights");
  }
}

// record_micro_batch and set_step on the device give the CPU functions' StepState and
// UpdateScalars, bit for bit.
TEST(OptimKernelsEmulated, RecordMicroBatchAndSetStepMatchTheCpu) {
  DeviceValue<StepBuffers> dev;
  DeviceValue<UpdateScalars> dev_scalars;
  dev->state.group.units = 3;
  dev->state.group.loss = 0.5;
  dev->state.grad_norm = 7.0f;
  dev_scalars->updates = 41;
  dev_scalars->skip = 1;
  StepState cpu = dev->state;
  UpdateScalars cpu_scalars = *dev_scalars;
  for (const MicroBatch& mb : std::vector<MicroBatch>{{16, 2.3f}, {7, 0.1f}, {1, kInf}}) {
    DeviceValue<float> loss(mb.loss);
    kernels::record_micro_batch_cuda(dev.get(), loss.get(), mb.samples, nullptr);
    kernels::record_micro_batch(cpu, mb.samples, mb.loss);
  }
  EXPECT_EQ(std::memcmp(&dev->state, &cpu, sizeof(StepState)), 0);
  EXPECT_EQ(dev->state.group.units, 27.0);
  EXPECT_EQ(dev->state.group.loss, kInf);
  kernels::set_step_cuda(dev_scalars.get(), 0.125f, 3e-4f, nullptr);
  kernels::set_step(cpu_scalars, 0.125f, 3e-4f);
  EXPECT_EQ(std::memcmp(&*dev_scalars, &cpu_scalars, sizeof(UpdateScalars)), 0);
  EXPECT_EQ(dev_scalars->skip, 0);
  EXPECT_EQ(dev_scalars->updates, 42);
  EXPECT_EQ(dev_scalars->grad_scale, 0.125f);
}

// ZeRO stage 2's decision in two launches (grad_sum_squares_cuda, then prepare_step_cuda from
// buffers->sum_squares, which the ranks all-reduce in between) gives the one-launch decision's bits;
// and prepare_step_cuda from a sum the other ranks added to decides as the CPU does from that sum.
TEST(OptimKernelsEmulated, TheTwoLaunchDecisionGivesTheOneLaunchBits) {
  const int64_t n = 3001;
  const DeviceVector<float> grad = random_values(n, -2, 2, 501);
  StepConfig config{};
  config.divide_by_units = 1;
  config.need_norm = 1;
  config.skip_non_finite = 1;
  config.clip_grad_norm = 1.0f;
  config.lr_table_size = 1;
  const DeviceVector<float> lr_table{3e-4f};
  DeviceValue<StepBuffers> one, two;
  DeviceValue<UpdateScalars> one_scalars, two_scalars;
  one->state.group.units = two->state.group.units = 8;
  one->state.group.loss = two->state.group.loss = 5.5;
  kernels::grad_norm_and_prepare_step_cuda(grad.data(), n, one.get(), one_scalars.get(), config, lr_table.data(),
                                           nullptr);
  kernels::grad_sum_squares_cuda(grad.data(), n, two.get(), nullptr);
  EXPECT_EQ(two->blocks_done, 0u);
  const double want = reference_sum_squares(grad);  // summed in double: a few roundings of it
  EXPECT_NEAR(two->sum_squares, want, 1e-13 * want);
  kernels::prepare_step_cuda(two.get(), two_scalars.get(), config, lr_table.data(), nullptr);
  EXPECT_EQ(std::memcmp(&two->state, &one->state, sizeof(StepState)), 0);
  EXPECT_EQ(std::memcmp(&*two_scalars, &*one_scalars, sizeof(UpdateScalars)), 0);
  // Another rank's shard added in (as the all-reduce does): the CPU's decision from the same sum.
  DeviceValue<StepBuffers> ranks;
  DeviceValue<UpdateScalars> ranks_scalars;
  ranks->state = two->state;
  ranks->state.group = {8, 5.5};
  ranks->sum_squares = two->sum_squares + 1234.5;
  StepState cpu = ranks->state;
  UpdateScalars cpu_scalars = *ranks_scalars;
  kernels::prepare_step_cuda(ranks.get(), ranks_scalars.get(), config, lr_table.data(), nullptr);
  kernels::prepare_step(cpu, cpu_scalars, ranks->sum_squares, config, lr_table.data());
  EXPECT_EQ(std::memcmp(&ranks->state, &cpu, sizeof(StepState)), 0);
  EXPECT_EQ(std::memcmp(&*ranks_scalars, &cpu_scalars, sizeof(UpdateScalars)), 0);
}

// ---- sum_squares (FlatParameters' gradient norm) -----------------------------------------------

// Summed in float: each thread at most two squares (n < 2 * 65536), then two trees of eight levels,
// every term non-negative, so the relative error is at most about (1 + 1 + 16) 2^-24 = 1.1e-6, for
// the total and for each block's partial. One launch (256 blocks of emulated threads cost seconds):
// n = 70001, the grid-stride loop round twice.
TEST(OptimKernelsEmulated, SumSquaresMatchesTheReference) {
  const int64_t n = 70001;
  const DeviceVector<float> x = random_values(n, -1, 1, 500);
  DeviceVector<float> partials(kernels::sum_squares_partials(), kNaN);
  DeviceValue<float> out(kNaN);
  kernels::sum_squares_cuda(x.data(), n, partials.data(), out.get(), nullptr);
  expect_close(DeviceVector<float>{*out}, {reference_sum_squares(x)}, "sum of squares", 1.2e-6);
  const std::vector<DeviceVector<float>> slices = block_slices(x, kernels::sum_squares_partials());
  std::vector<double> want(slices.size());
  for (std::size_t b = 0; b < slices.size(); ++b) want[b] = reference_sum_squares(slices[b]);
  expect_close(partials, want, "partials", 1.2e-6);
}

}  // namespace
}  // namespace cumulus::testing
