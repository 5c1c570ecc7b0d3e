// An optimizer written outside the engine, against the installed headers only (every include below
// is <cumulus/...>): Adagrad, as torch.optim.Adagrad without lr decay,
//   g = s * grad + wd * w;  sum += g * g;  w -= lr * g / (sqrt(sum) + eps),
// trained by the Trainer with accumulation over uneven micro-batches and a partial last group, and
// checked against the same training in float64 computed here from the closed-form gradient of a
// least-squares loss. The float run differs from it by float rounding only; a normalization off by
// a group's shape (each micro-batch divided by its rows times N, the classic convention) is shown to
// differ by far more than the tolerance, so the comparison can tell. Its state goes through a
// checkpoint (state() into a new optimizer's load_state()) and training resumes on the same course.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/layers.h"
#include "cumulus/ops/linear.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/optim/optimizer.h"
#include "cumulus/train/trainer.h"
#include "cumulus/tensor/random.h"
#include "cumulus/tensor/tensor.h"

namespace cumulus {
namespace {

class Adagrad final : public optim::Optimizer {
 public:
  Adagrad(std::shared_ptr<nn::FlatParameters> params, float lr, float weight_decay, float eps)
      : Optimizer(std::move(params), lr), weight_decay_(weight_decay), eps_(eps) {}

 protected:
  std::vector<optim::StateSpec> state_specs() const override { return {{"sum"}}; }

  // The CPU rule; `s` is host memory there (a CUDA version would read it in its kernel).
  void update(const optim::UpdateScalars* s, const optim::UpdateSpan& span) override {
    if (!span.device.is_cpu()) throw std::runtime_error("this Adagrad runs on the CPU only");
    float* w = span.values;
    const float* grad = span.gradients;
    float* sum = state_array(0).data<float>() + span.state_offset;
    const float lr = s->lr * span.lr_scale, wd = span.weight_decay_or(weight_decay_);
    const optim::FrozenChunks& frozen = span.frozen;
    for (int64_t i = 0; i < span.count; ++i) {
      const int64_t chunk = i / optim::FrozenChunks::kChunk;
      if (frozen.frozen != nullptr && frozen.frozen[chunk]) {  // left alone; the miss counted once
        if (i % optim::FrozenChunks::kChunk == 0) frozen.missed[chunk] += 1;
        continue;
      }
      const float g = s->grad_scale * grad[i] + wd * w[i];
      sum[i] += g * g;
      w[i] -= lr * g / (std::sqrt(sum[i]) + eps_);
    }
  }

 private:
  float weight_decay_, eps_;
};

constexpr int64_t kIn = 5, kOut = 3;
constexpr float kLr = 0.1f, kWeightDecay = 0.01f, kEps = 1e-3f;
constexpr int kAccumSteps = 3;
// Rows per micro-batch: groups {4, 2, 3}, {1, 4, 2} and the epoch's partial last {5}.
const std::vector<int64_t> kRows = {4, 2, 3, 1, 4, 2, 5};

struct Data {
  std::vector<float> x, y;  // [rows, kIn], [rows, kOut]
  int64_t rows = 0;
};

Data make_data() {
  Data d;
  for (int64_t r : kRows) d.rows += r;
  d.x.resize(static_cast<std::size_t>(d.rows * kIn));
  d.y.resize(static_cast<std::size_t>(d.rows * kOut));
  Generator gen(7);
  gen.fill_uniform(d.x.data(), static_cast<int64_t>(d.x.size()), -1.0f, 1.0f);
  gen.fill_uniform(d.y.data(), static_cast<int64_t>(d.y.size()), -1.0f, 1.0f);
  return d;
}

// The float64 twin: parameters [W (kOut x kIn) row-major, b (kOut)] and Adagrad's sums.
struct Reference {
  std::vector<double> p, sum;
  // How a micro-batch of `rows` rows in a group of `group_rows` is weighted: 1 / group_rows (the
  // Trainer's Normalization::units), or the classic 1 / (rows * N).
  bool classic = false;

  // Adds the gradient of sum over rows [first, first + rows) of |W x + b - y|^2, weighted.
  void add_gradient(const Data& d, int64_t first, int64_t rows, double weight, std::vector<double>& g) const {
    for (int64_t r = first; r < first + rows; ++r) {
      for (int64_t o = 0; o < kOut; ++o) {
        double z = p[static_cast<std::size_t>(kOut * kIn + o)];
        for (int64_t i = 0; i < kIn; ++i)
          z += p[static_cast<std::size_t>(o * kIn + i)] * d.x[static_cast<std::size_t>(r * kIn + i)];
        const double residual = 2.0 * (z - d.y[static_cast<std::size_t>(r * kOut + o)]) * weight;
        for (int64_t i = 0; i < kIn; ++i)
          g[static_cast<std::size_t>(o * kIn + i)] += residual * d.x[static_cast<std::size_t>(r * kIn + i)];
        g[static_cast<std::size_t>(kOut * kIn + o)] += residual;
      }
    }
  }

  // One group of micro-batches [begin, end) of kRows starting at row `first`.
  void step(const Data& d, std::size_t begin, std::size_t end, int64_t first) {
    int64_t group_rows = 0;
    for (std::size_t m = begin; m < end; ++m) group_rows += kRows[m];
    std::vector<double> g(p.size(), 0.0);
    for (std::size_t m = begin; m < end; ++m) {
      const double weight = classic ? 1.0 / (static_cast<double>(kRows[m]) * kAccumSteps) : 1.0 / group_rows;
      add_gradient(d, first, kRows[m], weight, g);
      first += kRows[m];
    }
    for (std::size_t k = 0; k < p.size(); ++k) {
      const double gk = g[k] + kWeightDecay * p[k];
      sum[k] += gk * gk;
      p[k] -= kLr * gk / (std::sqrt(sum[k]) + kEps);
    }
  }

  void epoch(const Data& d) {
    int64_t first = 0;
    for (std::size_t begin = 0; begin < kRows.size(); begin += kAccumSteps) {
      const std::size_t end = std::min(kRows.size(), begin + kAccumSteps);
      step(d, begin, end, first);
      for (std::size_t m = begin; m < end; ++m) first += kRows[m];
    }
  }
};

struct AdagradRun {
  Generator gen{11};
  nn::Linear model{kIn, kOut, gen};
  std::shared_ptr<nn::FlatParameters> flat = std::make_shared<nn::FlatParameters>(model);
  std::shared_ptr<Adagrad> optimizer = std::make_shared<Adagrad>(flat, kLr, kWeightDecay, kEps);
  std::unique_ptr<train::Trainer> trainer;

  AdagradRun() { trainer = std::make_unique<train::Trainer>(optimizer, options()); }
  static train::TrainerOptions options() {
    train::TrainerOptions o;
    o.accum_steps = kAccumSteps;
    o.skip_non_finite = false;  // nothing to guard; the norm is not needed
    return o;
  }
  std::vector<double> parameters() const {
    std::vector<double> out;
    for (float v : model.weight().to_vector<float>()) out.push_back(v);
    for (float v : model.bias().to_vector<float>()) out.push_back(v);
    return out;
  }
  void epoch(const Data& d, int epoch) {
    trainer->begin_epoch(epoch, static_cast<int64_t>(kRows.size()));
    int64_t first = 0;
    for (int64_t rows : kRows) {
      const Tensor x = Tensor::from_vector(std::vector<float>(d.x.begin() + first * kIn, d.x.begin() + (first + rows) * kIn),
                                           Shape{rows, kIn});
      const Tensor y = Tensor::from_vector(
          std::vector<float>(d.y.begin() + first * kOut, d.y.begin() + (first + rows) * kOut), Shape{rows, kOut});
      trainer->micro_batch(rows, [&] {
        const Tensor residual = model(x) - y;
        return ops::sum(residual * residual);
      });
      trainer->step_if_ready();
      first += rows;
    }
  }
};

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

constexpr double kTolerance = 2e-7;  // a few float ulps of weights near 1: rounding, nothing more

TEST(UserOptimizer, AdagradTrainsWithAccumulationAsTheFloat64Reference) {
  const Data d = make_data();
  AdagradRun run;
  Reference exact{run.parameters(), std::vector<double>(run.parameters().size(), 0.0)};
  Reference classic = exact;
  classic.classic = true;
  for (int epoch = 0; epoch < 4; ++epoch) {
    run.epoch(d, epoch);
    exact.epoch(d);
    classic.epoch(d);
    EXPECT_LT(max_abs_diff(run.parameters(), exact.p), kTolerance) << "epoch " << epoch;
  }
  EXPECT_EQ(run.trainer->counters().optimizer_steps, 4 * 3);
  EXPECT_EQ(run.optimizer->updates(), 4 * 3);
  EXPECT_GT(max_abs_diff(run.parameters(), classic.p), 100 * kTolerance)
      << "the groups' shapes must matter for the comparison to tell";
  EXPECT_EQ(run.optimizer->state_bytes(), static_cast<int64_t>(run.optimizer->state_tensor("sum").allocated_bytes()));
}

TEST(UserOptimizer, AdagradStateGoesThroughACheckpoint) {
  const Data d = make_data();
  AdagradRun run;
  Reference exact{run.parameters(), std::vector<double>(run.parameters().size(), 0.0)};
  ASSERT_TRUE(run.optimizer->state_to_allocate().size() == 1);
  run.epoch(d, 0);
  exact.epoch(d);
  // The checkpoint: the state copied out, the counters, then a new optimizer and Trainer over the
  // same parameters, restored in the documented order.
  std::vector<std::pair<std::string, Tensor>> saved;
  for (const auto& [name, t] : run.optimizer->state())
    saved.emplace_back(name, Tensor::from_vector(t.to_vector<float>(), t.shape()));
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_EQ(saved[0].first, "sum");
  const train::TrainingCounters counters = run.trainer->counters();
  const int64_t updates = run.optimizer->updates();
  run.trainer.reset();
  run.optimizer = std::make_shared<Adagrad>(run.flat, kLr, kWeightDecay, kEps);
  EXPECT_EQ(run.optimizer->state_to_allocate().size(), 1u) << "nothing held before the load";
  run.optimizer->load_state(saved, updates);
  EXPECT_TRUE(run.optimizer->state_to_allocate().empty()) << "the load allocated the state";
  run.trainer = std::make_unique<train::Trainer>(run.optimizer, AdagradRun::options());
  run.trainer->restore(counters);
  for (int epoch = 1; epoch < 3; ++epoch) {
    run.epoch(d, epoch);
    exact.epoch(d);
  }
  EXPECT_LT(max_abs_diff(run.parameters(), exact.p), kTolerance);
  EXPECT_EQ(run.trainer->counters().optimizer_steps, 3 * 3);
  // A checkpoint without the state is refused, naming what is missing.
  auto fresh = std::make_shared<Adagrad>(run.flat, kLr, kWeightDecay, kEps);
  try {
    fresh->load_state({}, 3);
    FAIL() << "a missing state was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'sum'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cumulus
