// Optimizers and gradient accumulation: flat parameter buffers, SGD (momentum, Nesterov, weight
// decay) and AdamW against hand computations in double, exact normalization (16 x 4 == 64 x 1 up to
// rounding, with a partial last group), the documented inexactness of Normalization::micro_batches,
// clipping of the accumulated gradient (never per micro-batch), LR and accumulation schedules
// counted in optimizer steps, the non-finite guard, the counters, and optimizer-state memory.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cumulus/core/threads.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/models/mlp.h"
#include "cumulus/nn/clip_grad.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/layers.h"
#include "cumulus/ops/fused_mlp.h"
#include "cumulus/ops/linear.h"
#include "cumulus/ops/loss.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/ops/shape.h"
#include "cumulus/optim/adamw.h"
#include "cumulus/optim/lr_schedule.h"
#include "cumulus/optim/sgd.h"
#include "cumulus/train/trainer.h"
#include "cumulus/tensor/random.h"
#include "cumulus/train/trainer.h"
#include "kernels/cpu/kernels.h"
#include "kernels/optim_rules.h"
#include "test_util.h"

namespace cumulus {
namespace {

using train::Trainer;
using train::TrainerOptions;
using train::LossScaling;
using train::Normalization;
using testing::DeviceTest;
using testing::max_rel_diff;
using Weights = std::vector<std::vector<float>>;

// ---- helpers -----------------------------------------------------------------------------------

constexpr double kPi = 3.141592653589793;
constexpr int64_t kSamples = 1000;  // 15 groups of 64 and one of 40
constexpr uint64_t kModelSeed = 42;

struct Dataset {
  Tensor x;  // [kSamples, 784] f32 in [0, 1)
  Tensor y;  // [kSamples] i32, i % 10
};

// A deterministic synthetic dataset, made once per device.
const Dataset& synthetic_dataset(Device device) {
  static std::map<std::string, Dataset> cache;
  auto it = cache.find(device.str());
  if (it != cache.end()) return it->second;
  Generator gen(2024);
  Dataset d;
  d.x = uniform({kSamples, models::SeedMLP::kInputs}, 0.0f, 1.0f, gen, device);
  std::vector<int32_t> labels(kSamples);
  for (int64_t i = 0; i < kSamples; ++i) labels[i] = static_cast<int32_t>(i % 10);
  d.y = Tensor::from_vector(labels, {kSamples}, device);
  return cache.emplace(device.str(), d).first->second;
}

Weights snapshot(const nn::Module& m) {
  Weights out;
  for (const auto& [name, t] : m.named_parameters()) out.push_back(t.to_vector<float>());
  return out;
}

std::vector<std::string> names_of(const nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& [name, t] : m.named_parameters()) out.push_back(name);
  return out;
}

// Micro-batch sizes cycling through `cycle`, the last one cut short to end at `total`.
std::vector<int64_t> micro_batch_plan(const std::vector<int64_t>& cycle, int64_t total) {
  std::vector<int64_t> sizes;
  for (int64_t done = 0, k = 0; done < total; ++k) {
    const int64_t b = std::min(cycle[k % cycle.size()], total - done);
    sizes.push_back(b);
    done += b;
  }
  return sizes;
}

enum class OptKind { sgd, momentum, adamw };
constexpr float kSgdLr = 0.05f;
constexpr float kAdamLr = 1e-4f;  // equivalence runs; see below
// Conditioning of the equivalence runs (the normalization under test is exact either way):
// - Momentum accumulates ~10 steps of updates, so at lr 0.05 a 1e-7 rounding difference can flip a
//   ReLU input across zero within one epoch and the runs part; lr 0.01 keeps every unit's side.
// - AdamW's step is ~ g / (|g| + eps): at eps 1e-8 a gradient of 1e-8 that is itself the rounding
//   residue of cancelling terms is magnified by lr / eps = 1e5. eps 1e-6 bounds that gain, and
//   lr 1e-4 (every weight moves ~lr per step) keeps ReLU inputs from crossing zero in one run only.
//   Measured on CPU: worst 1.7e-6 with these, 4.9e-5 at (1e-4, 1e-8), 0.15 at (1e-3, 1e-6).
constexpr float kMomentumLr = 0.01f;
constexpr float kAdamEps = 1e-6f;

std::shared_ptr<optim::Optimizer> make_optimizer(OptKind kind, std::shared_ptr<nn::FlatParameters> flat) {
  if (kind == OptKind::adamw) {
    optim::AdamWOptions o;
    o.lr = kAdamLr;
    o.eps = kAdamEps;
    return std::make_shared<optim::AdamW>(flat, o);
  }
  optim::SGDOptions o;
  o.lr = kind == OptKind::momentum ? kMomentumLr : kSgdLr;
  o.momentum = kind == OptKind::momentum ? 0.9f : 0.0f;
  return std::make_shared<optim::SGD>(flat, o);
}

// The summed loss through the model's training loss (the fused op or the generic ops, as its
// KernelChoice says).
Tensor sum_loss(models::SeedMLP& model, const Dataset& d, int64_t start, int64_t length) {
  return model.loss(d.x.narrow_rows(start, length), d.y.narrow_rows(start, length), ops::Reduction::Sum);
}

struct TrainRun {
  std::vector<std::string> names;
  Weights initial, final;
  int64_t steps = 0;
  float loss_scale = 1.0f;
};

// One epoch of the seed MLP over the synthetic dataset, micro-batches of sizes `cycle` (cycling),
// grouped by `accum`; the epoch length is announced so the partial last group is stepped.
TrainRun train_epoch(Device device, OptKind kind, const std::vector<int64_t>& cycle, int accum,
                     Normalization normalization = Normalization::units, const LossScaling& loss_scaling = {},
                     models::KernelChoice kernels = models::KernelChoice::generic) {
  const Dataset& data = synthetic_dataset(device);
  Generator gen(kModelSeed);
  models::SeedMLP model(gen, device);
  model.set_kernels(kernels);
  auto flat = std::make_shared<nn::FlatParameters>(model);
  TrainerOptions options;
  options.accum_steps = accum;
  options.normalization = normalization;
  options.loss_scaling = loss_scaling;
  Trainer acc(make_optimizer(kind, flat), options);
  TrainRun run;
  run.names = names_of(model);
  run.initial = snapshot(model);
  const std::vector<int64_t> sizes = micro_batch_plan(cycle, kSamples);
  acc.begin_epoch(0, static_cast<int64_t>(sizes.size()));
  int64_t start = 0;
  for (int64_t b : sizes) {
    acc.backward(sum_loss(model, data, start, b), b);
    acc.step_if_ready();
    start += b;
  }
  EXPECT_EQ(acc.position().micro_batches_in_group, 0) << "the partial last group was not stepped";
  EXPECT_EQ(acc.counters().skipped_steps, 0);
  run.steps = acc.counters().optimizer_steps;
  run.final = snapshot(model);
  run.loss_scale = acc.counters().loss_scale;
  return run;
}

bool all_finite(const Weights& w) {
  for (const auto& t : w)
    for (float v : t)
      if (!std::isfinite(v)) return false;
  return true;
}

// ---- FlatParameters ---------------------------------------------------------------------------

class FlatParametersTest : public DeviceTest {};

TEST_P(FlatParametersTest, PacksSeedMLPIntoViewsAtStableAddresses) {
  Generator gen(3);
  models::SeedMLP model(gen, device());
  const Weights before = snapshot(model);
  const Dataset& data = synthetic_dataset(device());
  const auto logits_before = model(data.x.narrow_rows(0, 8)).to_vector<float>();

  auto flat = std::make_shared<nn::FlatParameters>(model);
  EXPECT_EQ(flat->num_parameters(), 669706);
  EXPECT_EQ(flat->values().memory_category(), MemoryCategory::parameters);
  EXPECT_EQ(flat->gradients().memory_category(), MemoryCategory::gradients);
  EXPECT_EQ(flat->gradients().numel(), flat->size());
  EXPECT_EQ(flat->device(), device());

  const auto named = model.named_parameters();
  const auto& slots = flat->slots();
  ASSERT_EQ(slots.size(), named.size());
  char* const values_base = static_cast<char*>(flat->values().raw_data());
  char* const grads_base = static_cast<char*>(flat->gradients().raw_data());
  int64_t next_free = 0;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const auto& s = slots[i];
    SCOPED_TRACE(s.name);
    EXPECT_EQ(s.name, named[i].first);
    EXPECT_EQ(s.numel, named[i].second.numel());
    EXPECT_EQ(s.offset % nn::FlatParameters::kAlignElements, 0) << "offset " << s.offset;
    EXPECT_GE(s.offset, next_free) << "slots overlap";
    next_free = s.offset + s.numel;
    EXPECT_LE(next_free, flat->size());
    // The model's own handle is the view: same address as the slot's.
    EXPECT_EQ(named[i].second.raw_data(), static_cast<void*>(values_base + s.offset * sizeof(float)));
    EXPECT_EQ(s.param.raw_data(), static_cast<void*>(values_base + s.offset * sizeof(float)));
    ASSERT_TRUE(named[i].second.grad_buffer().defined());
    EXPECT_EQ(named[i].second.grad_buffer().raw_data(), static_cast<void*>(grads_base + s.offset * sizeof(float)));
    EXPECT_EQ(named[i].second.shape(), named[i].second.grad_buffer().shape());
    EXPECT_TRUE(named[i].second.grad_stale());
    // Values are unchanged by packing, read through the handle and through values().
    EXPECT_EQ(named[i].second.to_vector<float>(), before[i]);
  }
  const auto flat_values = flat->values().to_vector<float>();
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const std::vector<float> seg(flat_values.begin() + slots[i].offset,
                                 flat_values.begin() + slots[i].offset + slots[i].numel);
    EXPECT_EQ(seg, before[i]) << slots[i].name;
  }
  EXPECT_EQ(model(data.x.narrow_rows(0, 8)).to_vector<float>(), logits_before) << "forward changed by packing";

  // Backward and step: the gradient buffers stay where they are, hold the gradient, and padding
  // stays zero.
  std::vector<void*> grad_addresses;
  for (const auto& [n, t] : named) grad_addresses.push_back(t.grad_buffer().raw_data());
  TrainerOptions options;
  options.accum_steps = 2;
  Trainer acc(make_optimizer(OptKind::momentum, flat), options);
  for (int mb = 0; mb < 4; ++mb) {
    acc.backward(sum_loss(model, data, mb * 16, 16), 16);
    for (std::size_t i = 0; i < named.size(); ++i) {
      EXPECT_EQ(named[i].second.grad_buffer().raw_data(), grad_addresses[i]) << named[i].first;
      ASSERT_TRUE(named[i].second.grad().defined()) << named[i].first;
      EXPECT_EQ(named[i].second.grad().raw_data(), grad_addresses[i]);
    }
    const auto g = flat->gradients().to_vector<float>();
    double sum_sq = 0;
    for (std::size_t i = 0; i < slots.size(); ++i) {
      const auto gi = named[i].second.grad().to_vector<float>();
      EXPECT_TRUE(std::equal(gi.begin(), gi.end(), g.begin() + slots[i].offset)) << slots[i].name;
      for (float v : gi) sum_sq += double(v) * v;
      const int64_t pad_end = i + 1 < slots.size() ? slots[i + 1].offset : flat->size();
      for (int64_t k = slots[i].offset + slots[i].numel; k < pad_end; ++k)
        ASSERT_EQ(g[k], 0.0f) << "padding after " << slots[i].name << " at " << k;
    }
    EXPECT_GT(sum_sq, 0.0);
    EXPECT_NEAR(flat->gradient_sum_of_squares(), sum_sq, 1e-5 * sum_sq);
    const bool stepped = acc.step_if_ready();
    EXPECT_EQ(stepped, mb % 2 == 1);
    if (stepped) {
      EXPECT_FALSE(flat->any_gradient());
      for (const auto& [n, t] : named) EXPECT_FALSE(t.grad().defined()) << n << " not marked stale";
    }
    EXPECT_EQ(flat->gradients().raw_data(), static_cast<void*>(grads_base));
    EXPECT_EQ(flat->values().raw_data(), static_cast<void*>(values_base));
  }
  EXPECT_EQ(acc.counters().optimizer_steps, 2);
  EXPECT_NE(snapshot(model), before) << "the steps did not move the weights";
}

CUMULUS_INSTANTIATE_DEVICES(FlatParametersTest);

// ---- optimizer math against hand computations --------------------------------------------------

// A tiny problem: logits = x W^T + b, x: [2, 4], W: [3, 4], b: [3], labels {0, 2}, mean
// cross-entropy. The gradient is computed in double here.
struct Tiny {
  static constexpr int B = 2, I = 4, O = 3;
  std::vector<float> x, w0, b0;
  std::vector<int32_t> y{0, 2};
  Tiny() {
    for (int s = 0; s < B; ++s)
      for (int i = 0; i < I; ++i) x.push_back(static_cast<float>(1.5 * std::cos(1.0 + 4 * s + i)));
    for (int o = 0; o < O; ++o)
      for (int i = 0; i < I; ++i) w0.push_back(static_cast<float>(0.6 * std::sin(2.0 + 4 * o + i)));
    b0 = {0.1f, -0.2f, 0.05f};
  }
  // theta = [W (12), b (3)] -> gradient of the mean cross-entropy over the B samples.
  std::vector<double> grad(const std::vector<double>& theta, int first = 0, int count = B) const {
    std::vector<double> g(theta.size(), 0.0);
    for (int s = first; s < first + count; ++s) {
      double z[O], zmax = -1e300, sum = 0;
      for (int o = 0; o < O; ++o) {
        z[o] = theta[O * I + o];
        for (int i = 0; i < I; ++i) z[o] += double(x[s * I + i]) * theta[o * I + i];
        zmax = std::max(zmax, z[o]);
      }
      for (int o = 0; o < O; ++o) sum += std::exp(z[o] - zmax);
      for (int o = 0; o < O; ++o) {
        const double d = (std::exp(z[o] - zmax) / sum - (o == y[s] ? 1.0 : 0.0)) / count;
        for (int i = 0; i < I; ++i) g[o * I + i] += d * x[s * I + i];
        g[O * I + o] += d;
      }
    }
    return g;
  }
  std::vector<double> theta0() const {
    std::vector<double> t(w0.begin(), w0.end());
    t.insert(t.end(), b0.begin(), b0.end());
    return t;
  }
};

struct TinyModel {
  Tensor w, b, x, y;
  std::shared_ptr<nn::FlatParameters> flat;
  TinyModel(const Tiny& p, Device device) {
    w = Tensor::from_vector(p.w0, {Tiny::O, Tiny::I}, device);
    w.set_requires_grad(true);
    b = Tensor::from_vector(p.b0, {Tiny::O}, device);
    b.set_requires_grad(true);
    x = Tensor::from_vector(p.x, {Tiny::B, Tiny::I}, device);
    y = Tensor::from_vector(p.y, {Tiny::B}, device);
    flat = std::make_shared<nn::FlatParameters>(std::vector<std::pair<std::string, Tensor>>{{"w", w}, {"b", b}});
  }
  Tensor loss(ops::Reduction r, int64_t first = 0, int64_t count = Tiny::B) const {
    return ops::cross_entropy(ops::linear(x.narrow_rows(first, count), w, b), y.narrow_rows(first, count), r);
  }
  std::vector<float> theta() const {
    auto t = w.to_vector<float>();
    const auto bv = b.to_vector<float>();
    t.insert(t.end(), bv.begin(), bv.end());
    return t;
  }
  // A flat state buffer (momentum, exp_avg) read back at the slots' offsets, in theta's order.
  std::vector<float> gather(const Tensor& state) const {
    const auto all = state.to_vector<float>();
    std::vector<float> out;
    for (const auto& s : flat->slots()) out.insert(out.end(), all.begin() + s.offset, all.begin() + s.offset + s.numel);
    return out;
  }
};

// The Tiny model trained by SGD (momentum 0.9) through a Trainer.
struct TinyTrainer {
  TinyModel m;
  std::shared_ptr<optim::SGD> opt;
  std::unique_ptr<Trainer> acc;
  TinyTrainer(const Tiny& p, Device device, float lr, const TrainerOptions& options) : m(p, device) {
    optim::SGDOptions so;
    so.lr = lr;
    so.momentum = 0.9f;
    opt = std::make_shared<optim::SGD>(m.flat, so);
    acc = std::make_unique<Trainer>(opt, options);
  }
};

std::vector<float> to_float(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

// How the gradient reaches the optimizer: a mean loss and Optimizer::step(), or summed losses of
// one-sample micro-batches through a Trainer with 2 accumulation steps (grad_scale 1/2).
enum class Path { mean_loss_step, accumulator_two_micro_batches };

void take_step(TinyModel& m, optim::Optimizer& opt, Trainer* acc, Path path) {
  if (path == Path::mean_loss_step) {
    m.loss(ops::Reduction::Mean).backward();
    opt.step();
    opt.zero_grad();
  } else {
    acc->backward(m.loss(ops::Reduction::Sum, 0, 1), 1);
    EXPECT_FALSE(acc->step_if_ready());
    acc->backward(m.loss(ops::Reduction::Sum, 1, 1), 1);
    EXPECT_TRUE(acc->step_if_ready());
  }
}

struct SgdCase {
  const char* name;
  float lr, momentum, dampening;
  bool nesterov;
  float weight_decay;
};

class OptimizerMathTest : public DeviceTest {};

TEST_P(OptimizerMathTest, SgdTwoStepsMatchHandComputation) {
  const Tiny p;
  const std::vector<SgdCase> cases = {
      {"plain", 0.1f, 0.0f, 0.0f, false, 0.0f},
      {"plain+wd", 0.1f, 0.0f, 0.0f, false, 0.1f},
      {"momentum", 0.1f, 0.9f, 0.0f, false, 0.0f},
      {"momentum+wd", 0.1f, 0.9f, 0.0f, false, 0.1f},
      {"momentum+dampening", 0.1f, 0.9f, 0.3f, false, 0.0f},
      {"nesterov", 0.1f, 0.9f, 0.0f, true, 0.0f},
      {"nesterov+wd", 0.1f, 0.9f, 0.0f, true, 0.1f},
  };
  for (const SgdCase& c : cases) {
    for (Path path : {Path::mean_loss_step, Path::accumulator_two_micro_batches}) {
      SCOPED_TRACE(std::string(c.name) + (path == Path::mean_loss_step ? " (step)" : " (accumulator)"));
      TinyModel m(p, device());
      optim::SGDOptions o;
      o.lr = c.lr;
      o.momentum = c.momentum;
      o.dampening = c.dampening;
      o.nesterov = c.nesterov;
      o.weight_decay = c.weight_decay;
      auto opt = std::make_shared<optim::SGD>(m.flat, o);
      TrainerOptions ao;
      ao.accum_steps = 2;
      Trainer acc(opt, ao);

      // torch.optim.SGD in double.
      std::vector<double> theta = p.theta0(), buf(theta.size(), 0.0);
      for (int t = 0; t < 2; ++t) {
        std::vector<double> g = p.grad(theta);
        for (std::size_t k = 0; k < theta.size(); ++k) {
          double gk = g[k] + c.weight_decay * theta[k];
          if (c.momentum != 0.0f) {
            buf[k] = t == 0 ? gk : c.momentum * buf[k] + (1.0 - c.dampening) * gk;
            gk = c.nesterov ? gk + c.momentum * buf[k] : buf[k];
          }
          theta[k] -= c.lr * gk;
        }
        take_step(m, *opt, &acc, path);
        const auto got = m.theta();
        EXPECT_LT(max_rel_diff(got, to_float(theta)), 1e-6) << "after step " << t + 1;
      }
      // The weights moved by a meaningful amount (so the comparison above can fail).
      std::vector<float> init(p.w0);
      init.insert(init.end(), p.b0.begin(), p.b0.end());
      EXPECT_GT(max_rel_diff(m.theta(), init), 1e-2);
      EXPECT_EQ(opt->updates(), 2);
      if (c.momentum != 0.0f) {
        ASSERT_TRUE(opt->momentum_buffer().defined());
        EXPECT_LT(max_rel_diff(m.gather(opt->momentum_buffer()), to_float(buf)), 1e-6) << "momentum buffer";
      } else {
        EXPECT_FALSE(opt->momentum_buffer().defined()) << "plain SGD needs no state";
      }
    }
  }
}

TEST_P(OptimizerMathTest, AdamWTwoStepsMatchHandComputation) {
  const Tiny p;
  for (float wd : {0.0f, 0.1f}) {
    for (Path path : {Path::mean_loss_step, Path::accumulator_two_micro_batches}) {
      SCOPED_TRACE("weight_decay " + std::to_string(wd) + (path == Path::mean_loss_step ? " (step)" : " (accumulator)"));
      TinyModel m(p, device());
      optim::AdamWOptions o;
      o.lr = 0.05f;
      o.weight_decay = wd;
      auto opt = std::make_shared<optim::AdamW>(m.flat, o);
      TrainerOptions ao;
      ao.accum_steps = 2;
      Trainer acc(opt, ao);

      // torch.optim.AdamW in double.
      std::vector<double> theta = p.theta0(), mom(theta.size(), 0.0), var(theta.size(), 0.0);
      const double b1 = o.beta1, b2 = o.beta2, eps = o.eps, lr = o.lr;
      for (int t = 1; t <= 2; ++t) {
        std::vector<double> g = p.grad(theta);
        for (std::size_t k = 0; k < theta.size(); ++k) {
          theta[k] *= 1.0 - lr * wd;
          mom[k] = b1 * mom[k] + (1 - b1) * g[k];
          var[k] = b2 * var[k] + (1 - b2) * g[k] * g[k];
          const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
          theta[k] -= lr / bc1 * mom[k] / (std::sqrt(var[k]) / std::sqrt(bc2) + eps);
        }
        take_step(m, *opt, &acc, path);
        EXPECT_LT(max_rel_diff(m.theta(), to_float(theta)), 1e-6) << "after step " << t;
      }
      std::vector<float> init(p.w0);
      init.insert(init.end(), p.b0.begin(), p.b0.end());
      EXPECT_GT(max_rel_diff(m.theta(), init), 1e-2);
      EXPECT_EQ(opt->updates(), 2);
      EXPECT_LT(max_rel_diff(m.gather(opt->exp_avg()), to_float(mom)), 1e-6) << "exp_avg";
      EXPECT_LT(max_rel_diff(m.gather(opt->exp_avg_sq()), to_float(var)), 1e-6) << "exp_avg_sq";
    }
  }
}

// ---- frozen parameters (issue 28; Note [Frozen parameters] in kernels/optim_rules.h) -----------

// torch.optim's rules in double for the Tiny problem, with state and update count per parameter
// (W: the first 12 coordinates, b: the last 3); a frozen parameter is skipped whole, as PyTorch
// skips a parameter without a gradient.
struct PerParameterReference {
  const Tiny& p;
  OptKind kind;
  float lr, wd;
  std::vector<double> theta = p.theta0(), m = std::vector<double>(15, 0.0), v = std::vector<double>(15, 0.0);
  int t[2] = {0, 0};  // own updates of W, b
  void step(bool w_frozen) {
    const std::vector<double> g = p.grad(theta);
    for (int param = w_frozen ? 1 : 0; param < 2; ++param) {
      const int own = ++t[param];
      for (int k = param == 0 ? 0 : Tiny::O * Tiny::I; k < (param == 0 ? Tiny::O * Tiny::I : 15); ++k) {
        if (kind == OptKind::adamw) {
          const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
          theta[k] *= 1.0 - lr * wd;
          m[k] = b1 * m[k] + (1 - b1) * g[k];
          v[k] = b2 * v[k] + (1 - b2) * g[k] * g[k];
          theta[k] -= lr / (1 - std::pow(b1, own)) * m[k] / (std::sqrt(v[k]) / std::sqrt(1 - std::pow(b2, own)) + eps);
        } else {  // momentum 0.9, dampening 0.5: the first update sets the buffer to g undamped
          const double gk = g[k] + wd * theta[k];
          m[k] = own == 1 ? gk : 0.9 * m[k] + 0.5 * gk;
          theta[k] -= lr * m[k];
        }
      }
    }
  }
};

std::vector<float> w_part(const std::vector<float>& theta) {
  return std::vector<float>(theta.begin(), theta.begin() + Tiny::O * Tiny::I);
}

// A parameter frozen after the optimizer exists is left bit-identical (no decay, no momentum, no
// Adam step, its state untouched), and unfrozen it resumes its own state and update count. SGD's
// W is frozen before its first update (its momentum buffer then starts from the gradient), AdamW's
// after it (its bias corrections continue from its own count, not the optimizer's).
TEST_P(OptimizerMathTest, FrozenParameterIsLeftAloneAndResumesItsOwnState) {
  const Tiny p;
  for (OptKind kind : {OptKind::momentum, OptKind::adamw}) {
    SCOPED_TRACE(kind == OptKind::adamw ? "AdamW" : "SGD momentum");
    TinyModel m(p, device());
    const float lr = kind == OptKind::adamw ? 0.05f : 0.1f, wd = 0.1f;
    std::shared_ptr<optim::Optimizer> opt;
    if (kind == OptKind::adamw) {
      optim::AdamWOptions o;
      o.lr = lr;
      o.weight_decay = wd;
      opt = std::make_shared<optim::AdamW>(m.flat, o);
    } else {
      optim::SGDOptions o;
      o.lr = lr;
      o.momentum = 0.9f;
      o.dampening = 0.5f;
      o.weight_decay = wd;
      opt = std::make_shared<optim::SGD>(m.flat, o);
    }
    TrainerOptions ao;
    ao.accum_steps = 2;
    Trainer acc(opt, ao);
    // The optimizer's f32 state tensors (momentum, exp_avg, exp_avg_sq) in theta's order.
    auto float_state = [&] {
      std::vector<std::vector<float>> out;
      for (const auto& [name, t] : opt->state())
        if (t.dtype() == DType::f32) out.push_back(m.gather(t));
      return out;
    };
    PerParameterReference ref{p, kind, lr, wd};
    // SGD: W frozen from the start for two steps; AdamW: one step, then W frozen for two.
    const int first_frozen = kind == OptKind::adamw ? 1 : 0;
    for (int step = 0; step < 4; ++step) {
      SCOPED_TRACE("step " + std::to_string(step + 1));
      const bool frozen = step >= first_frozen && step < first_frozen + 2;
      m.w.set_requires_grad(!frozen);
      const std::vector<float> w_before = m.w.to_vector<float>();
      const std::vector<std::vector<float>> state_before = float_state();
      take_step(m, *opt, &acc, Path::accumulator_two_micro_batches);
      ref.step(frozen);
      if (frozen) {
        EXPECT_EQ(m.w.to_vector<float>(), w_before) << "a frozen parameter moved";
        const std::vector<std::vector<float>> state_after = float_state();
        for (std::size_t i = 0; i < state_before.size(); ++i)  // none before the first update
          EXPECT_EQ(w_part(state_after[i]), w_part(state_before[i])) << "its optimizer state moved";
      }
      EXPECT_LT(max_rel_diff(m.theta(), to_float(ref.theta)), 1e-6);
    }
    EXPECT_EQ(opt->updates(), 4);
    EXPECT_GT(max_rel_diff(w_part(m.theta()), p.w0), 1e-2) << "W never trained: the test would be vacuous";
  }
}

// The counts of missed updates are optimizer state: a checkpoint taken while a parameter is frozen
// resumes to the same bits.
TEST_P(OptimizerMathTest, FrozenStateSurvivesACheckpoint) {
  const Tiny p;
  auto make = [&](TinyModel& model) {
    optim::AdamWOptions o;
    o.lr = 0.05f;
    return std::make_shared<optim::AdamW>(model.flat, o);
  };
  TrainerOptions ao;
  ao.accum_steps = 2;
  TinyModel a(p, device());
  auto opt_a = make(a);
  Trainer acc_a(opt_a, ao);
  take_step(a, *opt_a, &acc_a, Path::accumulator_two_micro_batches);
  a.w.set_requires_grad(false);
  take_step(a, *opt_a, &acc_a, Path::accumulator_two_micro_batches);
  std::vector<std::pair<std::string, Tensor>> saved;
  for (const auto& [name, t] : opt_a->state()) saved.emplace_back(name, t.clone());
  ASSERT_EQ(saved.size(), 3u) << "exp_avg, exp_avg_sq and the missed updates";

  TinyModel b(p, device());
  b.w.copy_from(a.w);
  b.b.copy_from(a.b);
  b.w.set_requires_grad(false);
  auto opt_b = make(b);
  opt_b->load_state(saved, opt_a->updates());
  Trainer acc_b(opt_b, ao);
  for (TinyModel* model : {&a, &b}) model->w.set_requires_grad(true);
  take_step(a, *opt_a, &acc_a, Path::accumulator_two_micro_batches);
  take_step(b, *opt_b, &acc_b, Path::accumulator_two_micro_batches);
  EXPECT_EQ(b.theta(), a.theta());
}

CUMULUS_INSTANTIATE_DEVICES(OptimizerMathTest);

// ---- exact normalization: micro-batch splits reproduce 64 x 1 ----------------------------------

// The bar is 1e-5 relative per tensor after one epoch (16 optimizer steps). Float summation order
// differs between the splits, so the runs are not bit-identical; anything that amplifies rounding
// (a ReLU whose input crosses zero on one side only, AdamW's m / (sqrt(v) + eps) for gradients near
// zero) shows up here as well as a wrong normalization would.
class EquivalenceTest : public DeviceTest {
 protected:
  void check(OptKind kind, models::KernelChoice kernels = models::KernelChoice::generic) {
    const TrainRun ref = train_epoch(device(), kind, {64}, 1, Normalization::units, {}, kernels);
    ASSERT_EQ(ref.steps, 16) << "15 groups of 64 and one of 40";
    ASSERT_TRUE(all_finite(ref.final));
    for (std::size_t i = 0; i < ref.final.size(); ++i) {
      const double moved = max_rel_diff(ref.final[i], ref.initial[i]);
      EXPECT_GT(moved, 1e-3) << ref.names[i] << " hardly moved: the comparison would be vacuous";
    }
    struct Split {
      const char* name;
      std::vector<int64_t> cycle;
      int accum;
    };
    // The uneven cycle 8, 24, 16, 16 in groups of 4 covers the same 64 samples per group; its last
    // group is 8 + 24 + 8 = 40 samples.
    const std::vector<Split> splits = {
        {"16x4", {16}, 4}, {"8x8", {8}, 8}, {"32x2", {32}, 2}, {"8+24+16+16", {8, 24, 16, 16}, 4}};
    for (const Split& s : splits) {
      SCOPED_TRACE(s.name);
      const TrainRun run = train_epoch(device(), kind, s.cycle, s.accum, Normalization::units, {}, kernels);
      EXPECT_EQ(run.steps, 16);
      ASSERT_EQ(run.initial, ref.initial) << "runs must start from the same weights";
      double worst = 0;
      for (std::size_t i = 0; i < ref.final.size(); ++i) {
        const double d = max_rel_diff(run.final[i], ref.final[i]);
        worst = std::max(worst, d);
        EXPECT_LT(d, 1e-5) << ref.names[i];
      }
      std::printf("    [%s, %s kernels] %s vs 64x1: worst max_rel_diff %.3g\n", device().str().c_str(),
                  models::kernel_choice_name(kernels), s.name, worst);
    }
  }
};

TEST_P(EquivalenceTest, Sgd) { check(OptKind::sgd); }
TEST_P(EquivalenceTest, SgdMomentum) { check(OptKind::momentum); }
TEST_P(EquivalenceTest, AdamW) { check(OptKind::adamw); }
// The same splits on the fused MLP op (Note [Fused MLP] in engine/ops/fused_mlp.cpp).
TEST_P(EquivalenceTest, FusedSgd) { check(OptKind::sgd, models::KernelChoice::fused); }
TEST_P(EquivalenceTest, FusedSgdMomentum) { check(OptKind::momentum, models::KernelChoice::fused); }
TEST_P(EquivalenceTest, FusedAdamW) { check(OptKind::adamw, models::KernelChoice::fused); }

CUMULUS_INSTANTIATE_DEVICES(EquivalenceTest);

// ---- Normalization::micro_batches on a partial group -------------------------------------------

class AccumulationTest : public DeviceTest {};

// With 1000 samples in micro-batches of 16 and N = 4, the last group holds 16 + 16 + 8 = 40
// samples. Normalization::units weights each of them 1/40. Normalization::micro_batches scales
// micro-batch j by 1/(B_j N): per-sample weights 1/64, 1/64 and 1/32, total weight 3/4.
TEST_P(AccumulationTest, MicroBatchNormalizationDiffersOnlyOnThePartialGroup) {
  const Dataset& data = synthetic_dataset(device());
  const std::vector<int64_t> sizes = micro_batch_plan({16}, kSamples);
  ASSERT_EQ(sizes.size(), 63u);
  struct Side {
    std::unique_ptr<models::SeedMLP> model;
    std::unique_ptr<Trainer> acc;
  };
  auto make_side = [&](Normalization n) {
    Side s;
    Generator gen(kModelSeed);
    s.model = std::make_unique<models::SeedMLP>(gen, device());
    auto flat = std::make_shared<nn::FlatParameters>(*s.model);
    TrainerOptions o;
    o.accum_steps = 4;
    o.normalization = n;
    s.acc = std::make_unique<Trainer>(make_optimizer(OptKind::sgd, flat), o);
    s.acc->begin_epoch(0, static_cast<int64_t>(sizes.size()));
    return s;
  };
  Side a = make_side(Normalization::units), b = make_side(Normalization::micro_batches);
  const Weights initial = snapshot(*a.model);
  const auto names = names_of(*a.model);

  // The 15 full groups: identical (every B_j N = 64 = samples in the group).
  int64_t start = 0;
  for (int k = 0; k < 60; ++k) {
    for (Side* s : {&a, &b}) {
      s->acc->backward(sum_loss(*s->model, data, start, sizes[k]), sizes[k]);
      s->acc->step_if_ready();
    }
    start += sizes[k];
  }
  ASSERT_EQ(start, 960);
  ASSERT_EQ(a.acc->counters().optimizer_steps, 15);
  ASSERT_EQ(b.acc->counters().optimizer_steps, 15);
  const Weights wa = snapshot(*a.model), wb = snapshot(*b.model);
  for (std::size_t i = 0; i < wa.size(); ++i) {
    EXPECT_LT(max_rel_diff(wb[i], wa[i]), 1e-6) << names[i] << " after the full groups";
    EXPECT_GT(max_rel_diff(wa[i], initial[i]), 1e-3) << names[i] << " did not move";
  }

  // Per-micro-batch gradients of the summed losses of the last group, at each side's weights
  // (read, then discarded, so the weights and the accumulator are untouched).
  auto micro_batch_grads = [&](Side& s) {
    std::vector<Weights> grads;
    int64_t st = start;
    for (int k = 60; k < 63; ++k) {
      sum_loss(*s.model, data, st, sizes[k]).backward();
      Weights g;
      for (const auto& [n, t] : s.model->named_parameters()) g.push_back(t.grad().to_vector<float>());
      grads.push_back(g);
      s.model->zero_grad();
      st += sizes[k];
    }
    return grads;
  };
  const std::vector<Weights> ga = micro_batch_grads(a), gb = micro_batch_grads(b);
  EXPECT_EQ(snapshot(*a.model), wa);

  for (int k = 60; k < 63; ++k) {
    for (Side* s : {&a, &b}) {
      s->acc->backward(sum_loss(*s->model, data, start, sizes[k]), sizes[k]);
      if (k == 62) {
        EXPECT_EQ(s->acc->position().units_in_group, 40);
        EXPECT_EQ(s->acc->position().micro_batches_in_group, 3);
      }
      EXPECT_EQ(s->acc->step_if_ready(), k == 62) << "the epoch's last micro-batch steps the partial group";
    }
    start += sizes[k];
  }
  ASSERT_EQ(start, kSamples);
  ASSERT_EQ(a.acc->counters().optimizer_steps, 16);
  ASSERT_EQ(b.acc->counters().optimizer_steps, 16);
  const Weights fa = snapshot(*a.model), fb = snapshot(*b.model);

  // Weights per micro-batch of the last group (sizes 16, 16, 8).
  const double samples_w[3] = {1.0 / 40, 1.0 / 40, 1.0 / 40};
  const double micro_w[3] = {1.0 / 64, 1.0 / 64, 1.0 / 32};
  EXPECT_DOUBLE_EQ(16 * micro_w[0] + 16 * micro_w[1] + 8 * micro_w[2], 3.0 / 4.0);
  double worst_fit_a = 0, worst_fit_b = 0, worst_gap = 0;
  for (std::size_t i = 0; i < fa.size(); ++i) {
    SCOPED_TRACE(names[i]);
    std::vector<double> da(fa[i].size()), db(fa[i].size()), ea(fa[i].size()), eb(fa[i].size());
    double max_ea = 0, max_eb = 0, err_a = 0, err_b = 0, gap = 0, ulp = 0;
    for (std::size_t k = 0; k < fa[i].size(); ++k) {
      da[k] = double(fa[i][k]) - wa[i][k];
      db[k] = double(fb[i][k]) - wb[i][k];
      ea[k] = eb[k] = 0;
      for (int j = 0; j < 3; ++j) {
        ea[k] -= kSgdLr * samples_w[j] * ga[j][i][k];
        eb[k] -= kSgdLr * micro_w[j] * gb[j][i][k];
      }
      max_ea = std::max(max_ea, std::fabs(ea[k]));
      max_eb = std::max(max_eb, std::fabs(eb[k]));
      err_a = std::max(err_a, std::fabs(da[k] - ea[k]));
      err_b = std::max(err_b, std::fabs(db[k] - eb[k]));
      gap = std::max(gap, std::fabs(db[k] - da[k]));
      ulp = std::max(ulp, double(std::fabs(wa[i][k])));
    }
    ulp *= std::numeric_limits<float>::epsilon();  // rounding of w - lr*g in float
    ASSERT_GT(max_ea, 0.0);
    // Each side's last update is its hand computation from the per-micro-batch gradients.
    EXPECT_LT(err_a, 1e-4 * max_ea + ulp) << "samples: update != -lr * (G1 + G2 + G3) / 40";
    EXPECT_LT(err_b, 1e-4 * max_eb + ulp) << "micro_batches: update != -lr * (G1/64 + G2/64 + G3/32)";
    // And the two differ by far more than rounding.
    EXPECT_GT(gap, 0.05 * max_ea) << "micro_batches normalization should differ on the partial group";
    EXPECT_GT(max_rel_diff(fb[i], fa[i]), 1e-5);
    worst_fit_a = std::max(worst_fit_a, err_a / max_ea);
    worst_fit_b = std::max(worst_fit_b, err_b / max_eb);
    worst_gap = std::max(worst_gap, gap / max_ea);
  }
  std::printf("    last update: samples fit %.3g, micro_batches fit %.3g (relative), gap %.3g of the update\n",
              worst_fit_a, worst_fit_b, worst_gap);
}

// ---- clipping ----------------------------------------------------------------------------------

// nn::clip_grad_norm in a loop written by hand (backward, clip, AdamW's step) against an
// Trainer clipping the same gradients (normalization none, no non-finite guard): the same norm
// and the same weights, bit for bit, over steps that clip and steps below the threshold; parameters
// of sizes off the flat buffer's alignment (5, 70, 130), so the padding and the norm's lanes count.
TEST_P(AccumulationTest, ClipGradNormInAManualLoopGivesTheTrainersBits) {
  const std::vector<Shape> shapes = {{5}, {7, 10}, {130}};
  auto make = [&](uint64_t seed) {
    Generator gen(seed);
    std::vector<std::pair<std::string, Tensor>> named;
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      std::vector<float> v(static_cast<std::size_t>(shapes[i].numel()));
      gen.fill_uniform(v.data(), static_cast<int64_t>(v.size()), -1.0f, 1.0f);
      named.emplace_back("p" + std::to_string(i), Tensor::from_vector(v, shapes[i], device()).set_requires_grad(true));
    }
    return named;
  };
  const auto trained = make(1), manual = make(1);
  optim::AdamWOptions adam;
  adam.lr = 0.01f;
  TrainerOptions ao;
  ao.normalization = Normalization::none;
  ao.skip_non_finite = false;
  ao.clip_grad_norm = 1.0f;
  Trainer acc(std::make_shared<optim::AdamW>(std::make_shared<nn::FlatParameters>(trained), adam), ao);
  auto flat = std::make_shared<nn::FlatParameters>(manual);
  optim::AdamW opt(flat, adam);
  // loss = sum_i scale * sum(p_i^2 * c_i): gradients 2 scale c_i p_i, of norm above 1 for scale 3
  // and below it for scale 0.01.
  auto loss = [&](const std::vector<std::pair<std::string, Tensor>>& params, float scale) {
    Tensor total;
    for (const auto& [name, p] : params) {
      const Tensor term = ops::sum(ops::mul(ops::mul(p, p), Tensor::full(p.shape(), 0.5f, DType::f32, device())));
      total = total.defined() ? ops::add(total, term) : term;
    }
    return ops::mul(total, scale);
  };
  for (float scale : {3.0f, 0.01f, 5.0f}) {
    SCOPED_TRACE("scale " + std::to_string(scale));
    acc.backward(loss(trained, scale), 1);
    ASSERT_TRUE(acc.step_if_ready());
    loss(manual, scale).backward();
    const float norm = nn::clip_grad_norm(*flat, 1.0f);
    EXPECT_EQ(norm, acc.counters().last_grad_norm);
    EXPECT_EQ(scale < 1.0f, acc.counters().last_clip_factor == 1.0f) << "the test's scales clip, then not, then again";
    opt.step();
    opt.zero_grad();
    for (std::size_t i = 0; i < shapes.size(); ++i)
      EXPECT_EQ(manual[i].second.to(Device::cpu()).to_vector<float>(),
                trained[i].second.to(Device::cpu()).to_vector<float>())
          << manual[i].first;
  }
  EXPECT_THROW(nn::clip_grad_norm(*flat, 0.0f), InvalidArgument);
}

// nn::clip_grad_norm returns PyTorch's total norm and scales by max_norm / (norm + 1e-6) above it;
// below it, the gradients are left as they are.
TEST_P(AccumulationTest, ClipGradNormScalesAsPyTorch) {
  Tensor w = Tensor::from_vector(std::vector<float>{0.0f, 0.0f}, {1, 2}, device()).set_requires_grad(true);
  nn::FlatParameters flat({{"w", w}});
  auto backward = [&](float a, float b) {
    ops::sum(ops::linear(Tensor::from_vector(std::vector<float>{a, b}, {1, 2}, device()), w, Tensor())).backward();
  };
  backward(3.0f, 4.0f);
  EXPECT_FLOAT_EQ(nn::clip_grad_norm(flat, 1.0f), 5.0f);
  const float clip = static_cast<float>(1.0 / (5.0 + 1e-6));
  EXPECT_EQ(w.grad().to(Device::cpu()).to_vector<float>(), (std::vector<float>{3.0f * clip, 4.0f * clip}));
  flat.mark_gradients_stale();
  backward(0.3f, 0.4f);
  EXPECT_FLOAT_EQ(nn::clip_grad_norm(flat, 1.0f), 0.5f);
  EXPECT_EQ(w.grad().to(Device::cpu()).to_vector<float>(), (std::vector<float>{0.3f, 0.4f}));
}

// W: [1, 2]; loss = sum(x W^T) has gradient x. Two one-sample micro-batches with opposite
// gradients (3, 4) and (-1.5, -2): the normalized accumulated gradient is (0.75, 1) of norm 1.25,
// clipped to 1: (0.6, 0.8). Clipping each micro-batch first would give (0.6, 0.8) + (-0.6, -0.8)
// = 0: no update at all.
TEST_P(AccumulationTest, ClipsTheAccumulatedGradientNotEachMicroBatch) {
  Tensor w = Tensor::from_vector(std::vector<float>{0.5f, -0.25f}, {1, 2}, device());
  w.set_requires_grad(true);
  auto flat = std::make_shared<nn::FlatParameters>(std::vector<std::pair<std::string, Tensor>>{{"w", w}});
  optim::SGDOptions so;
  so.lr = 0.1f;
  TrainerOptions ao;
  ao.accum_steps = 2;
  ao.clip_grad_norm = 1.0f;
  Trainer acc(std::make_shared<optim::SGD>(flat, so), ao);
  auto micro_batch = [&](float a, float b) {
    Tensor x = Tensor::from_vector(std::vector<float>{a, b}, {1, 2}, device());
    acc.backward(ops::sum(ops::linear(x, w, Tensor())), 1);
  };

  micro_batch(3.0f, 4.0f);
  EXPECT_FALSE(acc.step_if_ready());
  micro_batch(-1.5f, -2.0f);
  EXPECT_TRUE(acc.step_if_ready());
  EXPECT_NEAR(acc.counters().last_grad_norm, 1.25, 1.25e-6) << "norm of the normalized accumulated gradient";
  EXPECT_NEAR(acc.counters().last_clip_factor, 0.8, 1e-5);
  const double clip = 1.0 / 1.25;
  const std::vector<float> expected = {float(0.5 - 0.1 * 0.75 * clip), float(-0.25 - 0.1 * 1.0 * clip)};
  const std::vector<float> per_micro_batch = {0.5f, -0.25f};  // (0.6, 0.8) + (-0.6, -0.8) = 0
  const std::vector<float> unclipped = {float(0.5 - 0.1 * 0.75), float(-0.25 - 0.1 * 1.0)};
  const auto got = w.to_vector<float>();
  EXPECT_LT(max_rel_diff(got, expected), 1e-5);
  EXPECT_GT(max_rel_diff(got, per_micro_batch), 0.1) << "clipping was applied per micro-batch";
  EXPECT_GT(max_rel_diff(got, unclipped), 0.02) << "no clipping was applied";

  // Below the threshold: factor exactly 1, norm still reported.
  micro_batch(0.3f, 0.4f);
  micro_batch(0.3f, 0.4f);
  EXPECT_TRUE(acc.step_if_ready());
  EXPECT_NEAR(acc.counters().last_grad_norm, 0.5, 0.5e-6);
  EXPECT_EQ(acc.counters().last_clip_factor, 1.0f);
  const std::vector<float> expected2 = {float(expected[0] - 0.1 * 0.3), float(expected[1] - 0.1 * 0.4)};
  EXPECT_LT(max_rel_diff(w.to_vector<float>(), expected2), 1e-5);
  EXPECT_EQ(acc.counters().optimizer_steps, 2);

  // Norms that differ strongly: a large micro-batch gradient and a small one of 3 samples.
  // normalized = ((30, 40) + (0.3, 0.4)) / 4 = (7.575, 10.1), norm 12.625 -> clipped to 1.
  micro_batch(30.0f, 40.0f);
  Tensor x3 = Tensor::from_vector(std::vector<float>{0.1f, 0.4f / 3, 0.1f, 0.4f / 3, 0.1f, 0.4f / 3}, {3, 2}, device());
  acc.backward(ops::sum(ops::linear(x3, w, Tensor())), 3);
  EXPECT_EQ(acc.position().units_in_group, 4);
  EXPECT_TRUE(acc.step_if_ready());
  EXPECT_NEAR(acc.counters().last_grad_norm, 12.625, 12.625e-6);
  EXPECT_NEAR(acc.counters().last_clip_factor, 1.0 / 12.625, 1e-6);
  const std::vector<float> expected3 = {float(expected2[0] - 0.1 * 0.6), float(expected2[1] - 0.1 * 0.8)};
  EXPECT_LT(max_rel_diff(w.to_vector<float>(), expected3), 1e-5);
}

// ---- LR schedules ------------------------------------------------------------------------------

TEST(LRScheduleTest, StepLRValues) {
  optim::StepLR s(0.1f, 3, 0.5f);
  const double expected[] = {0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025, 0.0125};
  for (int k = 0; k < 10; ++k) EXPECT_NEAR(s.lr_at(k), expected[k], 1e-6 * expected[k]) << "step " << k;
  EXPECT_NEAR(optim::StepLR(1.0f, 1, 0.1f).lr_at(4), 1e-4, 1e-10);
  EXPECT_THROW(optim::StepLR(0.1f, 0, 0.5f), InvalidArgument);
  EXPECT_EQ(optim::ConstantLR(0.25f).lr_at(1000), 0.25f);
}

// nanoGPT's schedule (get_lr, in Python floats) at its defaults, rounded once: every rate is the
// float nearest the double computation from the same (float) inputs, not a sum of float roundings.
TEST(LRScheduleTest, CosineWarmupIsTheDoubleRateRoundedOnce) {
  const float lr = 6e-4f, min_lr = 6e-5f;
  const int64_t warmup = 20, total = 200;
  const optim::CosineWarmupLR s(lr, warmup, total, min_lr);
  for (int64_t k = 0; k < total; ++k) {
    double expected;
    if (k < warmup) {
      expected = double(lr) * double(k + 1) / double(warmup);
    } else {
      const double progress = double(k - warmup) / double(total - warmup);
      expected = double(min_lr) + (double(lr) - double(min_lr)) * 0.5 * (1.0 + std::cos(kPi * progress));
    }
    EXPECT_EQ(s.lr_at(k), static_cast<float>(expected)) << "step " << k;
  }
}

TEST(LRScheduleTest, CosineWarmupValues) {
  const double lr = 1.0, min_lr = 0.1;
  const int warmup = 4, total = 10;
  optim::CosineWarmupLR s(1.0f, warmup, total, 0.1f);
  // Warmup: linear from lr/warmup to lr.
  EXPECT_NEAR(s.lr_at(0), 0.25, 1e-6);
  EXPECT_NEAR(s.lr_at(1), 0.5, 1e-6);
  EXPECT_NEAR(s.lr_at(2), 0.75, 1e-6);
  EXPECT_NEAR(s.lr_at(3), 1.0, 1e-6);
  // Cosine from lr at the end of warmup to min_lr at total.
  for (int k = warmup; k <= total; ++k) {
    const double progress = double(k - warmup) / (total - warmup);
    const double expected = min_lr + (lr - min_lr) * 0.5 * (1 + std::cos(kPi * progress));
    EXPECT_NEAR(s.lr_at(k), expected, 1e-6) << "step " << k;
  }
  EXPECT_NEAR(s.lr_at(4), 1.0, 1e-6);
  EXPECT_NEAR(s.lr_at(7), 0.55, 1e-6);
  EXPECT_NEAR(s.lr_at(10), 0.1, 1e-6);
  // Held at min_lr after.
  EXPECT_NEAR(s.lr_at(11), 0.1, 1e-7);
  EXPECT_NEAR(s.lr_at(1000), 0.1, 1e-7);
  // Monotone: up during warmup, down after.
  for (int k = 1; k < warmup; ++k) EXPECT_GT(s.lr_at(k), s.lr_at(k - 1));
  for (int k = warmup + 1; k <= total; ++k) EXPECT_LT(s.lr_at(k), s.lr_at(k - 1));
  // No warmup: the first step is at lr.
  optim::CosineWarmupLR nw(0.5f, 0, 4);
  EXPECT_NEAR(nw.lr_at(0), 0.5, 1e-7);
  EXPECT_NEAR(nw.lr_at(2), 0.25, 1e-7);
  EXPECT_NEAR(nw.lr_at(4), 0.0, 1e-7);
  EXPECT_THROW(optim::CosineWarmupLR(0.1f, 5, 5), InvalidArgument);
  EXPECT_THROW(optim::CosineWarmupLR(0.1f, -1, 5), InvalidArgument);
}

// With 4 accumulation steps, the schedule advances once per optimizer step: check last_lr() and
// the update actually applied (w -= lr * x, x the per-sample gradient) after each step.
TEST_P(AccumulationTest, LRScheduleCountsOptimizerStepsNotMicroBatches) {
  struct Case {
    const char* name;
    std::shared_ptr<const optim::LRSchedule> schedule;
    std::vector<double> expected;  // lr of optimizer steps 0, 1, ...
  };
  const double c = 0.05 + 0.05 * std::cos(kPi * 0.5);  // cosine halfway from 0.1 to 0
  const std::vector<Case> cases = {
      {"StepLR(0.1, 2, 0.1)", std::make_shared<optim::StepLR>(0.1f, 2, 0.1f), {0.1, 0.1, 0.01, 0.01, 0.001, 0.001}},
      {"CosineWarmupLR(0.1, 2, 4)", std::make_shared<optim::CosineWarmupLR>(0.1f, 2, 4),
       {0.05, 0.1, 0.1, c, 0.0, 0.0}},
  };
  for (const Case& cs : cases) {
    SCOPED_TRACE(cs.name);
    Tensor w = Tensor::from_vector(std::vector<float>{1.0f, -1.0f}, {1, 2}, device());
    w.set_requires_grad(true);
    auto flat = std::make_shared<nn::FlatParameters>(std::vector<std::pair<std::string, Tensor>>{{"w", w}});
    optim::SGDOptions so;
    so.lr = 0.7f;  // the schedule overrides it
    TrainerOptions ao;
    ao.accum_steps = 4;
    Trainer acc(std::make_shared<optim::SGD>(flat, so), ao, cs.schedule);
    const Tensor x = Tensor::from_vector(std::vector<float>{0.5f, 2.0f}, {1, 2}, device());
    std::vector<double> expected_w = {1.0, -1.0};
    float lr_seen = acc.counters().last_lr;
    int64_t steps = 0;
    for (int mb = 0; mb < 4 * static_cast<int>(cs.expected.size()); ++mb) {
      acc.backward(ops::sum(ops::linear(x, w, Tensor())), 1);
      const bool stepped = acc.step_if_ready();
      EXPECT_EQ(stepped, mb % 4 == 3) << "micro-batch " << mb;
      if (!stepped) {
        EXPECT_EQ(acc.counters().last_lr, lr_seen) << "lr changed without an optimizer step";
        continue;
      }
      ++steps;
      ASSERT_EQ(acc.counters().optimizer_steps, steps);
      const double lr = cs.expected[steps - 1];
      EXPECT_NEAR(acc.counters().last_lr, lr, 1e-6 * 0.1) << "optimizer step " << steps - 1;
      EXPECT_EQ(acc.counters().last_lr, cs.schedule->lr_at(acc.counters().optimizer_steps - 1));
      lr_seen = acc.counters().last_lr;
      expected_w[0] -= lr * 0.5;
      expected_w[1] -= lr * 2.0;
      const auto got = w.to_vector<float>();
      EXPECT_NEAR(got[0], expected_w[0], 1e-6) << "after optimizer step " << steps - 1;
      EXPECT_NEAR(got[1], expected_w[1], 1e-6) << "after optimizer step " << steps - 1;
    }
    EXPECT_EQ(acc.counters().optimizer_steps, static_cast<int64_t>(cs.expected.size()));
    EXPECT_EQ(acc.position().micro_batches_total, 4 * static_cast<int64_t>(cs.expected.size()));
  }
}

// ---- accumulation schedule ---------------------------------------------------------------------

TEST(AccumulationScheduleTest, StepsForEpoch) {
  const std::map<int, int> s = {{0, 8}, {4, 2}};
  for (int e = 0; e < 4; ++e) EXPECT_EQ(train::accum_steps_for_epoch(s, e), 8) << "epoch " << e;
  for (int e : {4, 5, 9, 100}) EXPECT_EQ(train::accum_steps_for_epoch(s, e), 2) << "epoch " << e;
  const std::map<int, int> t = {{0, 1}, {2, 4}, {5, 3}};
  const int expected[] = {1, 1, 4, 4, 4, 3, 3};
  for (int e = 0; e < 7; ++e) EXPECT_EQ(train::accum_steps_for_epoch(t, e), expected[e]) << "epoch " << e;
}

TEST_P(AccumulationTest, ScheduleSetsStepsPerEpoch) {
  Tensor w = Tensor::from_vector(std::vector<float>{0.0f, 0.0f}, {1, 2}, device());
  w.set_requires_grad(true);
  auto flat = std::make_shared<nn::FlatParameters>(std::vector<std::pair<std::string, Tensor>>{{"w", w}});
  optim::SGDOptions so;
  so.lr = 0.01f;
  TrainerOptions ao;
  ao.accum_steps = 5;  // overridden by the schedule
  ao.schedule = {{0, 8}, {4, 2}};
  Trainer acc(std::make_shared<optim::SGD>(flat, so), ao);
  const Tensor x = Tensor::from_vector(std::vector<float>{1.0f, 1.0f}, {1, 2}, device());
  constexpr int kMicroBatches = 20;
  for (int epoch = 0; epoch < 6; ++epoch) {
    SCOPED_TRACE("epoch " + std::to_string(epoch));
    acc.begin_epoch(epoch, kMicroBatches);
    EXPECT_EQ(acc.position().epoch, epoch);
    const int n = epoch < 4 ? 8 : 2;
    EXPECT_EQ(acc.position().accum_steps, n);
    const int64_t steps_before = acc.counters().optimizer_steps;
    std::vector<int> groups;
    for (int mb = 0; mb < kMicroBatches; ++mb) {
      acc.backward(ops::sum(ops::linear(x, w, Tensor())), 1);
      const int in_group = acc.position().micro_batches_in_group;
      if (acc.step_if_ready()) groups.push_back(in_group);
    }
    const std::vector<int> expected_groups =
        epoch < 4 ? std::vector<int>{8, 8, 4} : std::vector<int>(10, 2);
    EXPECT_EQ(groups, expected_groups);
    EXPECT_EQ(acc.counters().optimizer_steps - steps_before, epoch < 4 ? 3 : 10);
    EXPECT_EQ(acc.position().micro_batches_in_group, 0);
  }
  EXPECT_EQ(acc.counters().optimizer_steps, 4 * 3 + 2 * 10);
  EXPECT_EQ(acc.position().micro_batches_total, 6 * kMicroBatches);

  // Unknown epoch length: the partial group waits for flush().
  acc.begin_epoch(6, 0);
  for (int mb = 0; mb < 5; ++mb) {
    acc.backward(ops::sum(ops::linear(x, w, Tensor())), 1);
    acc.step_if_ready();
  }
  EXPECT_EQ(acc.position().micro_batches_in_group, 1);
  EXPECT_THROW(acc.begin_epoch(7, 0), InvalidArgument) << "a pending group must be flushed first";
  const int64_t before = acc.counters().optimizer_steps;
  EXPECT_TRUE(acc.flush());
  EXPECT_EQ(acc.counters().optimizer_steps, before + 1);
  EXPECT_FALSE(acc.flush()) << "nothing left to step";
  EXPECT_EQ(acc.counters().optimizer_steps, before + 1);

  // More micro-batches than announced is an error.
  acc.begin_epoch(7, 1);
  acc.backward(ops::sum(ops::linear(x, w, Tensor())), 1);
  EXPECT_TRUE(acc.step_if_ready());
  EXPECT_THROW(acc.backward(ops::sum(ops::linear(x, w, Tensor())), 1), InvalidArgument);
}

// ---- non-finite guard --------------------------------------------------------------------------

TEST_P(AccumulationTest, NonFiniteGradientSkipsTheStepAndTrainingContinues) {
  const Tiny p;
  Generator gen(11);
  std::vector<std::vector<float>> xs;  // six micro-batches of 2 samples
  for (int k = 0; k < 6; ++k) {
    std::vector<float> v(2 * Tiny::I);
    gen.fill_uniform(v.data(), static_cast<int64_t>(v.size()), -1.0f, 1.0f);
    xs.push_back(v);
  }
  std::vector<float> poisoned = xs[3];
  poisoned[1] = std::numeric_limits<float>::quiet_NaN();
  const Tensor y = Tensor::from_vector(std::vector<int32_t>{1, 2}, {2}, device());

  auto make = [&]() {
    TrainerOptions ao;
    ao.accum_steps = 2;
    return TinyTrainer(p, device(), 0.2f, ao);
  };
  auto feed = [&](TinyTrainer& t, const std::vector<float>& xv) {
    const Tensor x = Tensor::from_vector(xv, {2, Tiny::I}, device());
    t.acc->backward(ops::cross_entropy(ops::linear(x, t.m.w, t.m.b), y, ops::Reduction::Sum), 2);
    return t.acc->step_if_ready();
  };

  TinyTrainer t = make();
  feed(t, xs[0]);
  ASSERT_TRUE(feed(t, xs[1]));
  const auto after_first = t.m.theta();
  ASSERT_EQ(t.acc->counters().optimizer_steps, 1);

  // A group with one clean micro-batch and one whose input holds a NaN.
  EXPECT_FALSE(feed(t, xs[2]));
  EXPECT_TRUE(feed(t, poisoned)) << "a skipped step still counts as attempted";
  EXPECT_EQ(t.acc->counters().skipped_steps, 1);
  EXPECT_EQ(t.acc->counters().optimizer_steps, 1);
  EXPECT_EQ(t.opt->updates(), 1) << "the optimizer must not run (its momentum would change)";
  EXPECT_EQ(t.m.theta(), after_first) << "weights changed by a non-finite step";
  EXPECT_FALSE(std::isfinite(t.acc->counters().last_grad_norm));
  EXPECT_FALSE(t.m.w.grad().defined()) << "the poisoned gradient must be discarded";
  EXPECT_EQ(t.acc->position().micro_batches_in_group, 0);
  EXPECT_EQ(t.acc->position().units_in_group, 0);

  // The next group trains normally: the same result as a run that never saw the bad group.
  feed(t, xs[4]);
  EXPECT_TRUE(feed(t, xs[5]));
  EXPECT_EQ(t.acc->counters().optimizer_steps, 2);
  EXPECT_EQ(t.acc->counters().skipped_steps, 1);
  const auto got = t.m.theta();
  for (float v : got) ASSERT_TRUE(std::isfinite(v));
  EXPECT_TRUE(std::isfinite(t.acc->counters().last_grad_norm));

  TinyTrainer ref = make();
  feed(ref, xs[0]);
  feed(ref, xs[1]);
  feed(ref, xs[4]);
  feed(ref, xs[5]);
  ASSERT_EQ(ref.acc->counters().optimizer_steps, 2);
  const auto expected = ref.m.theta();
  EXPECT_LT(max_rel_diff(got, expected), 1e-6);
  EXPECT_GT(max_rel_diff(got, after_first), 1e-3) << "the step after the skip did not move the weights";
  EXPECT_LT(max_rel_diff(t.m.gather(t.opt->momentum_buffer()), ref.m.gather(ref.opt->momentum_buffer())), 1e-6);
}

// ---- loss scaling (Note [Loss scaling]) -----------------------------------------------------------

// Powers of two scale exactly: in f32, away from overflow, training with dynamic loss scaling gives
// the same bits as without, while the scale grows every growth_interval steps.
TEST_P(AccumulationTest, LossScalingIsExactAwayFromOverflow) {
  LossScaling ls;
  ls.dynamic = true;
  ls.initial_scale = 1024.0f;
  ls.growth_interval = 3;
  for (OptKind kind : {OptKind::momentum, OptKind::adamw}) {
    const TrainRun plain = train_epoch(device(), kind, {16}, 4);
    const TrainRun scaled = train_epoch(device(), kind, {16}, 4, Normalization::units, ls);
    ASSERT_EQ(scaled.steps, 16);  // 15 groups of 64 and one of 40
    EXPECT_EQ(scaled.loss_scale, 1024.0f * 32.0f) << "16 clean steps, growth every 3rd: 5 doublings";
    for (std::size_t i = 0; i < plain.final.size(); ++i)
      EXPECT_EQ(0, std::memcmp(plain.final[i].data(), scaled.final[i].data(), plain.final[i].size() * sizeof(float)))
          << plain.names[i] << " differs with loss scaling";
  }
}

// The case: an overflow in the third micro-batch of a group of four skips exactly that
// group, halves the scale once, and leaves weights and optimizer state untouched; growth_interval
// clean groups later the scale is back; the counters carry the scale through restore().
TEST_P(AccumulationTest, LossScalingSkipsAnOverflowingGroupAndHalvesTheScaleOnce) {
  const Tiny p;
  LossScaling ls;
  ls.dynamic = true;  // 2^16 to start
  ls.growth_interval = 2;
  TrainerOptions ao;
  ao.accum_steps = 4;
  ao.loss_scaling = ls;
  auto make = [&] { return TinyTrainer(p, device(), 0.1f, ao); };
  // One sample per micro-batch; `huge` makes the input's first feature 1e36: the softmax saturates
  // on the wrong class for sample 1 (label 2, class 0 wins), so its weight gradient is ~1e36, finite
  // unscaled but past the f32 range once multiplied by 2^16.
  auto feed = [&](TinyTrainer& t, int sample, bool huge = false) {
    std::vector<float> xv(p.x.begin() + sample * Tiny::I, p.x.begin() + (sample + 1) * Tiny::I);
    if (huge) xv[0] = 1e36f;
    const Tensor x = Tensor::from_vector(xv, {1, Tiny::I}, device());
    const Tensor y = Tensor::from_vector(std::vector<int32_t>{p.y[sample]}, {1}, device());
    t.acc->backward(ops::cross_entropy(ops::linear(x, t.m.w, t.m.b), y, ops::Reduction::Sum), 1);
    return t.acc->step_if_ready();
  };
  auto clean_group = [&](TinyTrainer& t) {
    for (int k = 0; k < 4; ++k) feed(t, k % 2);
  };

  TinyTrainer t = make();
  EXPECT_EQ(t.acc->counters().loss_scale, 65536.0f);
  clean_group(t);
  ASSERT_EQ(t.acc->counters().optimizer_steps, 1);
  const auto weights = t.m.theta();
  const auto momentum = t.m.gather(t.opt->momentum_buffer());

  feed(t, 0);
  feed(t, 1);
  feed(t, 1, /*huge=*/true);  // the third micro-batch overflows
  EXPECT_TRUE(feed(t, 1));
  EXPECT_EQ(t.acc->counters().skipped_steps, 1);
  EXPECT_EQ(t.acc->counters().optimizer_steps, 1);
  EXPECT_EQ(t.opt->updates(), 1);
  EXPECT_EQ(t.m.theta(), weights) << "weights changed by the skipped group";
  EXPECT_EQ(t.m.gather(t.opt->momentum_buffer()), momentum) << "momentum changed by the skipped group";
  EXPECT_EQ(t.acc->counters().loss_scale, 32768.0f) << "halved once";
  {  // the control: without loss scaling the same group is finite and steps
    TrainerOptions unscaled;
    unscaled.accum_steps = 4;
    TinyTrainer plain(p, device(), 0.1f, unscaled);
    feed(plain, 0);
    feed(plain, 1);
    feed(plain, 1, /*huge=*/true);
    EXPECT_TRUE(feed(plain, 1));
    EXPECT_EQ(plain.acc->counters().skipped_steps, 0);
    EXPECT_EQ(plain.acc->counters().loss_scale, 1.0f);
  }

  clean_group(t);
  EXPECT_EQ(t.acc->counters().loss_scale, 32768.0f) << "one clean group: not yet";
  const train::TrainingCounters mid = t.acc->counters();
  EXPECT_EQ(mid.loss_scale, 32768.0f);
  EXPECT_EQ(mid.loss_scale_clean_steps, 1);
  clean_group(t);
  EXPECT_EQ(t.acc->counters().loss_scale, 65536.0f) << "growth after growth_interval clean groups";
  EXPECT_EQ(t.acc->counters().optimizer_steps, 3);
  EXPECT_EQ(t.acc->counters().skipped_steps, 1);

  // Resumed from `mid`: the scale and the clean-step count are restored exactly, so the next clean
  // group grows the scale at the same step as in the run that was not interrupted.
  TinyTrainer resumed = make();
  resumed.acc->restore(mid);
  EXPECT_EQ(resumed.acc->counters().loss_scale, 32768.0f);
  EXPECT_EQ(resumed.acc->counters().loss_scale_clean_steps, 1);
  clean_group(resumed);
  EXPECT_EQ(resumed.acc->counters().loss_scale, 65536.0f);
  train::TrainingCounters broken = mid;
  broken.loss_scale_clean_steps = ls.growth_interval;  // a count the step never leaves behind
  EXPECT_THROW(make().acc->restore(broken), InvalidArgument);
  broken = mid;
  broken.loss_scale = 0.0f;
  EXPECT_THROW(make().acc->restore(broken), InvalidArgument);
  // A scale below the floor (saved before the floor existed) resumes at the floor.
  train::TrainingCounters low = mid;
  low.loss_scale = 0.25f;
  TinyTrainer floored = make();
  floored.acc->restore(low);
  EXPECT_EQ(floored.acc->counters().loss_scale, 1.0f);
}

// Item 6 of issue 26: repeated overflow holds the scale at its floor (a power of two, never 0), and
// the first group that is finite there steps: the run recovers by itself. Without the floor, 200
// skipped groups took the scale from 8 to 0, and from there every group was skipped (a zero seed,
// then 1 / 0 in the unscaling). The same at the lowest floor allowed, 2^-126.
TEST_P(AccumulationTest, LossScaleHoldsAtItsFloorAndTheRunRecovers) {
  const Tiny p;
  // One sample per micro-batch and step; an infinite feature overflows at any scale.
  auto feed = [&](TinyTrainer& t, bool overflow) {
    std::vector<float> xv(p.x.begin(), p.x.begin() + Tiny::I);
    if (overflow) xv[0] = INFINITY;
    const Tensor x = Tensor::from_vector(xv, {1, Tiny::I}, device());
    const Tensor y = Tensor::from_vector(std::vector<int32_t>{p.y[0]}, {1}, device());
    t.acc->backward(ops::cross_entropy(ops::linear(x, t.m.w, t.m.b), y, ops::Reduction::Sum), 1);
    return t.acc->step_if_ready();
  };
  for (const float floor : {1.0f, std::numeric_limits<float>::min()}) {
    SCOPED_TRACE("floor " + std::to_string(std::ilogb(floor)));
    LossScaling ls;
    ls.dynamic = true;
    ls.initial_scale = 8.0f;
    ls.growth_interval = 2;
    ls.min_scale = floor;
    TrainerOptions ao;
    ao.loss_scaling = ls;
    TinyTrainer t(p, device(), 0.1f, ao);
    constexpr int kOverflows = 200;
    for (int k = 0; k < kOverflows; ++k) feed(t, true);
    EXPECT_EQ(t.acc->counters().skipped_steps, kOverflows);
    EXPECT_EQ(t.acc->counters().optimizer_steps, 0);
    EXPECT_EQ(t.acc->counters().loss_scale, floor) << "held at the floor";
    const auto weights = t.m.theta();
    EXPECT_TRUE(feed(t, false));
    EXPECT_EQ(t.acc->counters().optimizer_steps, 1) << "a finite group steps at the floor";
    EXPECT_EQ(t.acc->counters().skipped_steps, kOverflows);
    // At 2^-126 the seeded gradient is subnormal, which CUDA kernels may flush to 0: moved at 1 only.
    if (floor == 1.0f) EXPECT_NE(t.m.theta(), weights) << "the step at the floor did not move the weights";
    feed(t, false);
    EXPECT_EQ(t.acc->counters().loss_scale, 2.0f * floor) << "growth from the floor after growth_interval clean groups";
    feed(t, true);
    EXPECT_EQ(t.acc->counters().loss_scale, floor) << "backed off to the floor again, not below";
  }
}

// Growth stops at the largest finite power of two: an infinite scale would overflow every group.
TEST_P(AccumulationTest, LossScaleNeverGrowsToInfinity) {
  const Tiny p;
  LossScaling ls;
  ls.dynamic = true;
  ls.initial_scale = 0x1p126f;
  ls.growth_interval = 1;
  TrainerOptions ao;
  ao.loss_scaling = ls;
  TinyTrainer t(p, device(), 0.0f, ao);  // lr 0: the weights, and so the gradients, stay put
  for (int k = 0; k < 3; ++k) {
    t.acc->backward(t.m.loss(ops::Reduction::Sum, 0, 1), 1);
    t.acc->step_if_ready();
  }
  EXPECT_EQ(t.acc->counters().loss_scale, 0x1p127f) << "held at 2^127";
}

TEST_P(AccumulationTest, LossScalingOptionsAreChecked) {
  const Tiny p;
  TinyModel m(p, device());
  auto make = [&](LossScaling ls, Normalization n = Normalization::units, bool skip = true) {
    ls.dynamic = true;
    TrainerOptions ao;
    ao.loss_scaling = ls;
    ao.normalization = n;
    ao.skip_non_finite = skip;
    Trainer acc(std::make_shared<optim::SGD>(m.flat, optim::SGDOptions{}), ao);
  };
  EXPECT_NO_THROW(make({}));
  LossScaling bad;
  bad.initial_scale = 1000.0f;
  EXPECT_THROW(make(bad), InvalidArgument) << "not a power of two";
  bad = LossScaling{};
  bad.backoff_factor = 1.0f;
  EXPECT_THROW(make(bad), InvalidArgument);
  bad = LossScaling{};
  bad.growth_factor = 0.5f;
  EXPECT_THROW(make(bad), InvalidArgument);
  bad = LossScaling{};
  bad.growth_interval = 0;
  EXPECT_THROW(make(bad), InvalidArgument);
  bad = LossScaling{};
  bad.initial_scale = INFINITY;
  EXPECT_THROW(make(bad), InvalidArgument);
  // The floor: a power of two from 2^-126 (1 / it is finite) to the initial scale.
  LossScaling floor;
  floor.min_scale = std::numeric_limits<float>::min();
  EXPECT_NO_THROW(make(floor));
  for (const float v : {3.0f, 0x1p-127f, 0x1p17f, 0.0f, -1.0f}) {
    floor.min_scale = v;
    try {
      make(floor);
      ADD_FAILURE() << "floor " << v << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("must be a power of two from 2^-126 to the initial scale 65536"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(make({}, Normalization::micro_batches), InvalidArgument);
  EXPECT_THROW(make({}, Normalization::units, /*skip=*/false), InvalidArgument);
}

// ---- mean-reduced losses (issue 28) -----------------------------------------------------------------

// The message of the InvalidArgument `fn` throws ("" when it throws none).
template <typename Fn>
std::string refusal(Fn fn) {
  return testing::thrown_message<InvalidArgument>(fn);
}

// A mean-reduced loss would make the gradient 1/B of the right one (the step divides by the samples
// again): refused, with the fix in the message, and nothing is accumulated or counted.
TEST_P(AccumulationTest, RefusesAMeanReducedLoss) {
  const Tiny p;
  TinyModel m(p, device());
  TrainerOptions ao;
  ao.accum_steps = 2;
  Trainer acc(std::make_shared<optim::SGD>(m.flat, optim::SGDOptions{}), ao);
  const Tensor x = m.x.narrow_rows(0, 2), y = m.y.narrow_rows(0, 2);
  const std::vector<std::pair<std::string, std::function<Tensor()>>> means = {
      {"cross_entropy's default", [&] { return ops::cross_entropy(ops::linear(x, m.w, m.b), y); }},
      {"cross_entropy Mean", [&] { return m.loss(ops::Reduction::Mean); }},
      {"mlp_cross_entropy Mean", [&] { return ops::mlp_cross_entropy(x, y, {m.w}, {m.b}, ops::Reduction::Mean); }},
      {"ops::mean", [&] { return ops::mean(ops::linear(x, m.w, m.b)); }},
      {"reshaped mean", [&] { return ops::reshape(m.loss(ops::Reduction::Mean), {1}); }},
      {"sum of one mean",
       [&] {
         return ops::sum(ops::flatten(m.loss(ops::Reduction::Mean).reshape({1, 1}), 0));
       }},
  };
  for (const auto& [name, loss] : means) {
    SCOPED_TRACE(name);
    const std::string what = refusal([&] { acc.backward(loss(), 2); });
    EXPECT_NE(what.find("the loss is a mean"), std::string::npos) << what;
    const bool is_mean_op = name == std::string("ops::mean");
    EXPECT_NE(what.find(is_mean_op ? "ops::sum instead of ops::mean" : "ops::Reduction::Sum"), std::string::npos)
        << what;
    EXPECT_EQ(acc.position().micro_batch_index, 0);
    EXPECT_EQ(acc.position().units_in_group, 0);
    EXPECT_FALSE(m.w.grad().defined()) << "backward ran";
  }
  // The same check on the Trainer's path (eager here; on CUDA the capture calls backward too).
  train::TrainerOptions to;
  static_cast<train::TrainerOptions&>(to) = ao;
  train::Trainer trainer(std::make_shared<optim::SGD>(m.flat, optim::SGDOptions{}), to);
  EXPECT_THROW(trainer.micro_batch(2, [&] { return m.loss(ops::Reduction::Mean); }), InvalidArgument);
  EXPECT_EQ(trainer.position().micro_batch_index, 0);
  // Normalization::micro_batches divides too; none divides by nothing, so a mean is the caller's choice.
  ao.normalization = Normalization::micro_batches;
  Trainer classic(std::make_shared<optim::SGD>(m.flat, optim::SGDOptions{}), ao);
  EXPECT_THROW(classic.backward(m.loss(ops::Reduction::Mean), 2), InvalidArgument);
  ao.normalization = Normalization::none;
  Trainer as_accumulated(std::make_shared<optim::SGD>(m.flat, optim::SGDOptions{}), ao);
  EXPECT_NO_THROW(as_accumulated.backward(m.loss(ops::Reduction::Mean), 2));
}

// Only what is known to be a mean is refused: sums, views of sums, one-element reductions, leaves
// and ops of unknown meaning go through (Note [Mean-reduced losses]).
TEST_P(AccumulationTest, AcceptsSummedLosses) {
  const Tiny p;
  TinyModel m(p, device());
  Trainer acc(std::make_shared<optim::SGD>(m.flat, optim::SGDOptions{}), TrainerOptions{});
  const Tensor x = m.x.narrow_rows(0, 2), y = m.y.narrow_rows(0, 2);
  const std::vector<std::pair<std::string, std::function<Tensor()>>> sums = {
      {"cross_entropy Sum", [&] { return m.loss(ops::Reduction::Sum); }},
      {"mlp_cross_entropy Sum", [&] { return ops::mlp_cross_entropy(x, y, {m.w}, {m.b}, ops::Reduction::Sum); }},
      {"ops::sum", [&] { return ops::sum(ops::linear(x, m.w, m.b)); }},
      {"reshaped sum", [&] { return ops::reshape(m.loss(ops::Reduction::Sum), {1}); }},
      {"mean of one sum", [&] { return ops::mean(ops::reshape(m.loss(ops::Reduction::Sum), {1})); }},
  };
  for (const auto& [name, loss] : sums) {
    SCOPED_TRACE(name);
    EXPECT_NO_THROW(acc.backward(loss(), 2));
    EXPECT_TRUE(acc.step_if_ready());
  }
}

// ---- grad() after a step (issue 28) ------------------------------------------------------------

// The step releases the gradients (marks them stale): grad() is then undefined, as PyTorch's .grad
// after zero_grad(), and using it says so and how to read it instead.
TEST_P(AccumulationTest, GradAfterAStepSaysWhyItIsUndefined) {
  const Tiny p;
  TinyModel m(p, device());
  Trainer acc(std::make_shared<optim::SGD>(m.flat, optim::SGDOptions{}), TrainerOptions{});
  acc.backward(m.loss(ops::Reduction::Sum), Tiny::B);
  const std::vector<float> summed = m.w.grad().to_vector<float>();
  ASSERT_TRUE(acc.step_if_ready());
  EXPECT_FALSE(m.w.grad().defined());
  const std::string what = refusal([&] { m.w.grad().to_vector<float>(); });
  EXPECT_NE(what.find("use of an undefined tensor"), std::string::npos) << what;
  EXPECT_NE(what.find("after the optimizer step"), std::string::npos) << what;
  EXPECT_NE(what.find("before step_if_ready()"), std::string::npos) << what;
  EXPECT_NE(what.find("grad_buffer()"), std::string::npos) << what;
  // An op handed the undefined gradient says why too.
  const std::string in_op = refusal([&] { ops::sum(m.w.grad()); });
  EXPECT_NE(in_op.find("after the optimizer step"), std::string::npos) << in_op;
  // What the message promises: the buffer keeps the group's summed gradient until the next backward.
  EXPECT_EQ(m.w.grad_buffer().to_vector<float>(), summed);
  acc.backward(m.loss(ops::Reduction::Sum), Tiny::B);
  EXPECT_TRUE(m.w.grad().defined());
}

// ---- counters ----------------------------------------------------------------------------------

TEST_P(AccumulationTest, CountersFollowMicroBatchesAndSteps) {
  const Tiny p;
  TinyModel m(p, device());
  optim::SGDOptions so;
  so.lr = 0.01f;
  TrainerOptions ao;
  ao.accum_steps = 3;
  Trainer acc(std::make_shared<optim::SGD>(m.flat, so), ao);
  EXPECT_EQ(acc.position().micro_batch_index, 0);
  EXPECT_EQ(acc.position().micro_batches_total, 0);
  EXPECT_EQ(acc.counters().optimizer_steps, 0);
  EXPECT_EQ(acc.counters().skipped_steps, 0);
  EXPECT_EQ(acc.position().units_in_group, 0);
  EXPECT_EQ(acc.position().micro_batches_in_group, 0);
  EXPECT_EQ(acc.position().accum_steps, 3);
  EXPECT_FALSE(acc.step_if_ready()) << "nothing accumulated";
  EXPECT_FALSE(acc.flush());

  // Two epochs of 7 micro-batches, sizes 1 or 2: groups of 3, 3, 1.
  int64_t total = 0, steps = 0;
  for (int epoch = 0; epoch < 2; ++epoch) {
    acc.begin_epoch(epoch, 7);
    EXPECT_EQ(acc.position().epoch, epoch);
    EXPECT_EQ(acc.position().micro_batch_index, 0);
    int64_t group_samples = 0;
    int group_mbs = 0;
    for (int mb = 0; mb < 7; ++mb) {
      const int64_t b = 1 + (mb % 2);
      acc.backward(m.loss(ops::Reduction::Sum, 0, b), b);
      ++total;
      group_samples += b;
      ++group_mbs;
      EXPECT_EQ(acc.position().micro_batch_index, mb + 1);
      EXPECT_EQ(acc.position().micro_batches_total, total);
      EXPECT_EQ(acc.position().units_in_group, group_samples);
      EXPECT_EQ(acc.position().micro_batches_in_group, group_mbs);
      const bool expect_step = group_mbs == 3 || mb == 6;
      EXPECT_EQ(acc.step_if_ready(), expect_step) << "epoch " << epoch << " micro-batch " << mb;
      if (expect_step) {
        ++steps;
        group_samples = 0;
        group_mbs = 0;
      }
      EXPECT_EQ(acc.counters().optimizer_steps, steps);
      EXPECT_EQ(acc.position().units_in_group, group_samples);
      EXPECT_EQ(acc.position().micro_batches_in_group, group_mbs);
    }
  }
  EXPECT_EQ(acc.counters().optimizer_steps, 6);
  EXPECT_EQ(acc.optimizer().updates(), 6);
  EXPECT_EQ(acc.position().micro_batches_total, 14);
  EXPECT_EQ(acc.position().micro_batch_index, 7);
  EXPECT_EQ(acc.counters().skipped_steps, 0);
  EXPECT_THROW(acc.backward(m.loss(ops::Reduction::Sum), 0), InvalidArgument);
}

// ---- optimizer state memory --------------------------------------------------------------------

TEST_P(AccumulationTest, OptimizerStateIsAllocatedAtTheFirstStep) {
  const Dataset& data = synthetic_dataset(device());
  CachingAllocator& alloc = allocator_for(device());
  auto round_up = [](int64_t n) {
    const int64_t r = static_cast<int64_t>(CachingAllocator::kRounding);
    return (n + r - 1) / r * r;
  };
  for (OptKind kind : {OptKind::sgd, OptKind::momentum, OptKind::adamw}) {
    const int copies = kind == OptKind::sgd ? 0 : kind == OptKind::momentum ? 1 : 2;
    SCOPED_TRACE("state copies " + std::to_string(copies));
    Generator gen(5);
    models::SeedMLP model(gen, device());
    auto flat = std::make_shared<nn::FlatParameters>(model);
    const int64_t params_bytes = static_cast<int64_t>(flat->values().allocated_bytes());  // as the allocator counts it
    EXPECT_GE(params_bytes, flat->num_parameters() * 4);
    const CategoryStats before_create = alloc.stats()[MemoryCategory::optimizer_state];
    {
      TrainerOptions ao;
      Trainer acc(make_optimizer(kind, flat), ao);
      EXPECT_EQ(acc.optimizer().state_bytes(), 0);
      acc.backward(sum_loss(model, data, 0, 8), 8);
      const CategoryStats before = alloc.stats()[MemoryCategory::optimizer_state];
      EXPECT_EQ(before.current, before_create.current) << "state allocated before the first step";
      EXPECT_EQ(before.allocs, before_create.allocs);
      ASSERT_TRUE(acc.step_if_ready());
      const CategoryStats after = alloc.stats()[MemoryCategory::optimizer_state];
      EXPECT_EQ(after.current - before.current, copies * round_up(params_bytes));
      EXPECT_EQ(after.allocs - before.allocs, copies);
      EXPECT_EQ(acc.optimizer().state_bytes(), copies * params_bytes);
      if (kind == OptKind::momentum) {
        const auto& sgd = dynamic_cast<const optim::SGD&>(acc.optimizer());
        EXPECT_EQ(sgd.momentum_buffer().memory_category(), MemoryCategory::optimizer_state);
      }
      if (kind == OptKind::adamw) {
        const auto& adam = dynamic_cast<const optim::AdamW&>(acc.optimizer());
        EXPECT_EQ(adam.exp_avg().memory_category(), MemoryCategory::optimizer_state);
        EXPECT_EQ(adam.exp_avg_sq().memory_category(), MemoryCategory::optimizer_state);
      }
      // Later steps allocate no more state.
      acc.backward(sum_loss(model, data, 8, 8), 8);
      ASSERT_TRUE(acc.step_if_ready());
      const CategoryStats later = alloc.stats()[MemoryCategory::optimizer_state];
      EXPECT_EQ(later.current, after.current);
      EXPECT_EQ(later.allocs, after.allocs);
      EXPECT_EQ(acc.optimizer().state_bytes(), copies * params_bytes);
    }
    // Released with the optimizer.
    EXPECT_EQ(alloc.stats()[MemoryCategory::optimizer_state].current, before_create.current);
  }
}

CUMULUS_INSTANTIATE_DEVICES(AccumulationTest);


// Note [CPU kernel threads]: the optimizer updates (plain and with frozen chunks), a Linear's bias
// (broadcast into the output, its gradient summed over rows) and strided copies (a permute made
// contiguous, and its backward) split across threads with the bits of one thread.
namespace {

struct UpdateResult {
  std::vector<float> w, m, v, y, dx, dw, db, permuted, dpermuted;
  std::vector<int32_t> missed;
};

UpdateResult threaded_results(int threads) {
  set_cpu_threads(threads);
  constexpr int64_t n = 300'000 + 37;  // several update chunks and a tail
  Generator gen(11);
  std::vector<float> w(n), g(n), m(n), v(n);
  gen.fill_uniform(w.data(), n, -1.0f, 1.0f);
  gen.fill_uniform(g.data(), n, -1.0f, 1.0f);
  gen.fill_uniform(m.data(), n, -0.1f, 0.1f);
  gen.fill_uniform(v.data(), n, 0.0f, 0.01f);
  const int64_t chunks = (n + kernels::FrozenChunks::kChunk - 1) / kernels::FrozenChunks::kChunk;
  std::vector<uint8_t> frozen(static_cast<std::size_t>(chunks));
  std::vector<int32_t> missed(frozen.size(), 0);
  for (std::size_t c = 0; c < frozen.size(); ++c) frozen[c] = c % 7 == 3;
  UpdateResult r;
  for (int step = 1; step <= 3; ++step) {
    kernels::adamw_step_cpu(w.data(), g.data(), m.data(), v.data(), n, 0.5f, 1e-2f, 0.9f, 0.99f, 1e-8f, 0.1f, step,
                            kernels::FrozenChunks{});
    kernels::adamw_step_cpu(w.data(), g.data(), m.data(), v.data(), n, 0.5f, 1e-2f, 0.9f, 0.99f, 1e-8f, 0.1f, step + 3,
                            kernels::FrozenChunks{frozen.data(), missed.data()});
    kernels::sgd_step_cpu(w.data(), g.data(), m.data(), n, 0.5f, 1e-2f, 0.9f, 0.0f, true, 0.1f, step,
                          kernels::FrozenChunks{frozen.data(), missed.data()});
  }
  r.w = w, r.m = m, r.v = v, r.missed = missed;
  std::vector<float> xv(512 * 384), wv(200 * 384), bv(200);
  gen.fill_uniform(xv.data(), static_cast<int64_t>(xv.size()), -1.0f, 1.0f);
  gen.fill_uniform(wv.data(), static_cast<int64_t>(wv.size()), -0.1f, 0.1f);
  gen.fill_uniform(bv.data(), static_cast<int64_t>(bv.size()), -0.1f, 0.1f);
  const Tensor x = Tensor::from_vector(xv, Shape{512, 384}).set_requires_grad(true);
  const Tensor wt = Tensor::from_vector(wv, Shape{200, 384}).set_requires_grad(true);
  const Tensor b = Tensor::from_vector(bv, Shape{200}).set_requires_grad(true);
  const Tensor y = ops::linear(x, wt, b);
  ops::sum(ops::mul(y, y)).backward();
  r.y = y.to_vector<float>(), r.dx = x.grad().to_vector<float>(), r.dw = wt.grad().to_vector<float>();
  r.db = b.grad().to_vector<float>();
  std::vector<float> hv(16 * 64 * 8 * 32);
  gen.fill_uniform(hv.data(), static_cast<int64_t>(hv.size()), -1.0f, 1.0f);
  const Tensor heads = Tensor::from_vector(hv, Shape{16, 64, 8, 32}).set_requires_grad(true);
  const Tensor permuted = ops::contiguous(ops::permute(heads, {0, 2, 1, 3}));
  ops::sum(ops::mul(permuted, permuted)).backward();
  r.permuted = permuted.to_vector<float>(), r.dpermuted = heads.grad().to_vector<float>();
  return r;
}

}  // namespace

TEST(CpuThreads, UpdatesBiasesAndCopiesGiveTheBitsOfOneThread) {
  const int threads = cpu_threads();
  const UpdateResult one = threaded_results(1), two = threaded_results(2);
  set_cpu_threads(threads);
  EXPECT_EQ(one.w, two.w);
  EXPECT_EQ(one.m, two.m);
  EXPECT_EQ(one.v, two.v);
  EXPECT_EQ(one.missed, two.missed);
  EXPECT_EQ(one.y, two.y);
  EXPECT_EQ(one.dx, two.dx);
  EXPECT_EQ(one.dw, two.dw);
  EXPECT_EQ(one.db, two.db);
  EXPECT_EQ(one.permuted, two.permuted);
  EXPECT_EQ(one.dpermuted, two.dpermuted);
}

}  // namespace
}  // namespace cumulus
