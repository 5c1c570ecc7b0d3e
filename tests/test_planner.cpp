// The micro-batch planner in the library (cumulus::plan::plan_batch, Note [Planning a micro-batch] in
// engine/plan/planner.cpp): its table, its choice under a budget in reserved bytes with the
// optimizer state counted, the verifying probe, recompute, the fallback, and what it restores; the
// ready-made request over a TensorDataset (train::plan_request) and require_fit.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cumulus/data/dataset.h"
#include "cumulus/dist/communicator.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/models/cnn.h"
#include "cumulus/models/fashion_mnist.h"
#include "cumulus/models/mlp.h"
#include "cumulus/nn/activation_layers.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/layers.h"
#include "cumulus/ops/loss.h"
#include "cumulus/optim/adamw.h"
#include "cumulus/optim/sgd.h"
#include "cumulus/plan/planner.h"
#include "cumulus/train/trainer.h"
#include "engine/dist/gradient_buckets.h"
#include "engine/plan/fits.h"

namespace cumulus {
namespace {

const Device kCpu = Device::cpu();

int64_t rounded(int64_t bytes) {
  constexpr auto r = static_cast<int64_t>(CachingAllocator::kRounding);
  return (bytes + r - 1) / r * r;
}

// Injected timings (PlanRequest::micro_batch_seconds) for tests that check memory choices: a
// fixed cost a call makes larger micro-batches faster, and recompute costs 30% more a sample, so
// the fastest plan that fits is the largest micro-batch, without recompute where that fits.
double larger_is_faster(int64_t samples, const plan::PlanSetting& setting) {
  return 1e-3 + 1e-5 * static_cast<double>(samples) * (setting.recompute != 0 ? 1.3 : 1.0);
}

// Sets the allocator's limit for a scope.
struct LimitGuard {
  explicit LimitGuard(int64_t limit) { allocator_for(kCpu).set_memory_limit(limit); }
  ~LimitGuard() { allocator_for(kCpu).set_memory_limit(0); }
};

// A model, its flat parameters and one training micro-batch of zeros as a planner's caller writes
// it: the batch (category data), forward, summed loss, backward, the gradients discarded.
struct Rig {
  Generator gen{3};
  std::unique_ptr<nn::Module> model;
  std::shared_ptr<nn::FlatParameters> flat;

  explicit Rig(std::unique_ptr<nn::Module> m) : model(std::move(m)) {
    flat = std::make_shared<nn::FlatParameters>(*model);
    allocator_for(kCpu).empty_cache();
  }
  std::pair<Tensor, Tensor> batch(int64_t b) const {
    MemoryCategoryScope scope(MemoryCategory::data);
    return {Tensor::zeros(Shape{b, 784}, DType::f32, kCpu), Tensor::zeros(Shape{b}, DType::i32, kCpu)};
  }
  void micro_batch(int64_t b) const {
    {
      const auto [x, y] = batch(b);
      ops::cross_entropy((*model)(x), y, ops::Reduction::Sum).backward();
    }
    flat->mark_gradients_stale();
  }
  plan::PlanRequest request(optim::Optimizer& optimizer, int64_t effective_batch, int64_t budget) const {
    plan::PlanRequest r;
    r.device = kCpu;
    r.effective_batch = effective_batch;
    r.budget = budget;
    r.micro_batch = [this](int64_t b) { micro_batch(b); };
    r.optimizer = &optimizer;
    r.model = model.get();
    r.micro_batch_seconds = larger_is_faster;
    return r;
  }
  // Trains two optimizer steps of micro-batch x accum under `budget` as the allocator's limit (the
  // second group runs beside the state the first step allocates). The OutOfMemory's message, or "".
  // With `zero_stage`, as rank 0 of two ranks alone (its memory; the other's micro-batches skipped),
  // `accum` of them per rank.
  std::string train_two_steps(const std::shared_ptr<optim::Optimizer>& optimizer, int64_t micro_batch, int64_t accum,
                              int64_t budget, int zero_stage = -1) const {
    train::TrainerOptions ao;
    const int world = zero_stage >= 0 ? 2 : 1;
    ao.accum_steps = static_cast<int>(accum) * world;
    if (zero_stage >= 0) ao.communicator = dist::Communicator::alone(0, world), ao.zero_stage = zero_stage;
    train::Trainer acc(optimizer, ao);
    allocator_for(kCpu).empty_cache();
    allocator_for(kCpu).reset_peak();
    const LimitGuard limit(budget);
    try {
      acc.begin_epoch(0, 2 * ao.accum_steps);
      for (int64_t i = 0; i < 2 * ao.accum_steps; ++i) {
        if (dist::owner_of_micro_batch(i, world) == 0) {
          const auto [x, y] = batch(micro_batch);
          acc.backward(ops::cross_entropy((*model)(x), y, ops::Reduction::Sum), micro_batch);
        } else {
          acc.skip_micro_batch();
        }
        acc.step_if_ready();
      }
    } catch (const OutOfMemory& e) {
      return e.what();
    }
    EXPECT_EQ(acc.counters().optimizer_steps, 2);
    EXPECT_LE(allocator_for(kCpu).stats().reserved_peak, budget);
    return "";
  }
};

std::unique_ptr<nn::Module> mlp() {
  Generator gen(3);
  return std::make_unique<models::SeedMLP>(gen, kCpu);
}

// The rule plan_micro_batch applied until the library's planner replaced it: a line through two
// probes' allocated peaks, the largest divisor whose peak is within the budget less 5%. Allocated
// bytes are compared with a budget that counts reserved ones, and the optimizer state is unseen.
int64_t old_rule_choice(const Rig& rig, int64_t effective_batch, int64_t budget) {
  CachingAllocator& alloc = allocator_for(kCpu);
  auto probe = [&](int64_t b) {
    alloc.reset_peak();
    rig.micro_batch(b);
    return alloc.stats().allocated_peak;
  };
  const plan::MemoryCost cost = plan::memory_cost_from_probes(8, probe(8), 32, probe(32));
  alloc.empty_cache();
  for (int64_t b = effective_batch; b >= 1; --b)
    if (effective_batch % b == 0 && cost.predicted_peak(b) <= static_cast<int64_t>(0.95 * static_cast<double>(budget)))
      return b;
  return 0;
}

// The failure on the seed MLP with AdamW: under 24 MiB the old rule took the whole
// effective batch of 1024 (peak 16.2 MiB predicted in allocated bytes, no optimizer state), which
// ran out of memory once AdamW's first step had allocated its two copies of the parameters.
TEST(PlanBatch, ItsChoiceTrainsUnderTheBudgetWhereTheOldRuleRanOutOfMemory) {
  const Rig rig(mlp());
  constexpr int64_t kBudget = int64_t{24} << 20, kEffective = 1024;
  auto adamw = std::make_shared<optim::AdamW>(rig.flat, optim::AdamWOptions{});
  const plan::Plan plan = plan::plan_batch(rig.request(*adamw, kEffective, kBudget));
  std::printf("%s\n", plan.reason.c_str());
  ASSERT_GT(plan.micro_batch, 0) << plan.reason;
  EXPECT_EQ(plan.method, plan::PlanMethod::recorded_sequence) << plan.prediction;
  EXPECT_TRUE(plan.verified);
  EXPECT_LE(plan.verified_reserved_bytes, kBudget);
  EXPECT_EQ(plan.optimizer_state_bytes, 2 * rounded(static_cast<int64_t>(rig.flat->values().nbytes())));
  EXPECT_EQ(plan.micro_batch * plan.accum_steps, kEffective);
  EXPECT_EQ(rig.train_two_steps(adamw, plan.micro_batch, plan.accum_steps, kBudget), "");
  EXPECT_GT(adamw->state_bytes(), 0);

  // The old rule's answer under the same budget, trained with a fresh AdamW: out of memory.
  const int64_t old = old_rule_choice(rig, kEffective, kBudget);
  EXPECT_EQ(old, kEffective);
  EXPECT_GT(old, plan.micro_batch);
  const std::string oom = rig.train_two_steps(std::make_shared<optim::AdamW>(rig.flat, optim::AdamWOptions{}), old,
                                              kEffective / old, kBudget);
  EXPECT_NE(oom.find("out of memory"), std::string::npos) << "micro-batch " << old << " trained under the budget";
}

// Every divisor, largest first, with the optimizer's first-step state in every row: AdamW's two
// copies of the parameters raise each peak by exactly their bytes, and its choice under a budget
// is no larger than plain SGD's (which holds no state). Without a budget: every divisor fits and
// the whole effective batch is taken, unprobed.
TEST(PlanBatch, TableHasEveryDivisorAndCountsTheOptimizerState) {
  const Rig rig(mlp());
  constexpr int64_t kEffective = 512;
  optim::SGD sgd(rig.flat, optim::SGDOptions{});
  optim::AdamW adamw(rig.flat, optim::AdamWOptions{});
  int tables = 0;
  plan::PlanRequest request = rig.request(sgd, kEffective, 0);
  request.on_table = [&](const plan::Plan& p) {
    ++tables;
    EXPECT_EQ(p.table.size(), 10u);
    EXPECT_EQ(p.micro_batch, 0);  // shown before the choice
  };
  const plan::Plan sgd_free = plan::plan_batch(request);
  const plan::Plan adamw_free = plan::plan_batch(rig.request(adamw, kEffective, 0));
  EXPECT_EQ(tables, 1);
  const std::vector<int64_t> divisors = {512, 256, 128, 64, 32, 16, 8, 4, 2, 1};
  ASSERT_EQ(sgd_free.table.size(), divisors.size());
  ASSERT_EQ(adamw_free.table.size(), divisors.size());
  EXPECT_EQ(sgd_free.optimizer_state_bytes, 0);
  EXPECT_EQ(adamw_free.optimizer_state_bytes, 2 * rounded(static_cast<int64_t>(rig.flat->values().nbytes())));
  for (std::size_t i = 0; i < divisors.size(); ++i) {
    const plan::PlanRow &s = sgd_free.table[i], &a = adamw_free.table[i];
    EXPECT_EQ(s.micro_batch, divisors[i]);
    EXPECT_EQ(s.accum_steps, kEffective / divisors[i]);
    EXPECT_EQ(a.micro_batch, divisors[i]);
    EXPECT_TRUE(s.fits && a.fits);
    EXPECT_EQ(a.peak_bytes - s.peak_bytes, adamw_free.optimizer_state_bytes) << divisors[i];
    EXPECT_GE(a.reserved_bytes - s.reserved_bytes, adamw_free.optimizer_state_bytes) << divisors[i];
    EXPECT_EQ(a.peak_by_category[static_cast<std::size_t>(MemoryCategory::optimizer_state)],
              adamw_free.optimizer_state_bytes);
  }
  for (const plan::Plan* p : {&sgd_free, &adamw_free}) {
    EXPECT_EQ(p->micro_batch, kEffective);
    EXPECT_EQ(p->accum_steps, 1);
    EXPECT_FALSE(p->verified);
    EXPECT_NE(p->reason.find("no budget"), std::string::npos) << p->reason;
    EXPECT_GT(p->reserved_at_rest, 0);
  }

  // A budget AdamW's whole batch exceeds but a smaller divisor of it fits.
  int64_t budget = 0;
  for (const plan::PlanRow& r : adamw_free.table)
    if (r.reserved_bytes < adamw_free.table[0].reserved_bytes) {
      budget = r.reserved_bytes;
      break;
    }
  ASSERT_GT(budget, 0);
  const plan::Plan with_sgd = plan::plan_batch(rig.request(sgd, kEffective, budget));
  const plan::Plan with_adamw = plan::plan_batch(rig.request(adamw, kEffective, budget));
  EXPECT_EQ(with_sgd.micro_batch, kEffective) << with_sgd.reason;
  EXPECT_GT(with_adamw.micro_batch, 0) << with_adamw.reason;
  EXPECT_LT(with_adamw.micro_batch, with_sgd.micro_batch) << with_adamw.reason;
  EXPECT_TRUE(with_sgd.verified && with_adamw.verified);
  EXPECT_FALSE(with_adamw.table[0].fits);
  EXPECT_EQ(allocator_for(kCpu).memory_limit(), 0);  // the caller's limit is back
}

// Probes are training forwards: batch norm's running statistics move, and the planner puts them back.
TEST(PlanBatch, RestoresTheModelsBuffers) {
  Generator gen(5);
  const Rig rig(std::make_unique<models::CNN>(gen, kCpu));
  auto snapshot = [&] {
    std::vector<std::vector<float>> out;
    for (const auto& [name, t] : rig.model->named_buffers())
      if (t.dtype() == DType::f32) out.push_back(t.to_vector<float>());
    return out;
  };
  const auto before = snapshot();
  ASSERT_FALSE(before.empty());
  optim::SGD sgd(rig.flat, optim::SGDOptions{});
  plan::PlanRequest request = rig.request(sgd, 16, 0);
  request.unit_limit = 16;
  const plan::Plan plan = plan::plan_batch(request);
  EXPECT_EQ(plan.micro_batch, 16) << plan.reason;
  EXPECT_EQ(snapshot(), before);
  Tensor x = Tensor::full(Shape{4, 784}, 0.5f, kCpu);
  (*rig.model)(x);
  EXPECT_NE(snapshot(), before) << "a training forward no longer moves the statistics: the test shows nothing";
}

// A micro-batch of our own making, exact to predict: activations of `per_sample` bytes a sample
// (fewer with recompute) and 4 KiB of backward temporaries. Planned with a tiny model's SGD (no
// state).
struct Synthetic {
  Generator gen{1};
  nn::Linear layer{4, 2, gen, kCpu};
  std::shared_ptr<nn::FlatParameters> flat = std::make_shared<nn::FlatParameters>(layer);
  optim::SGD sgd{flat, optim::SGDOptions{}};
  int64_t per_sample = 64 << 10;
  int64_t per_sample_recomputing = 24 << 10;
  bool recompute = false;
  std::function<void(int64_t)> also;  // run inside each micro-batch (faults, interrupts)

  Synthetic() { allocator_for(kCpu).empty_cache(); }
  void micro_batch(int64_t b) {
    CachingAllocator& alloc = allocator_for(kCpu);
    const Allocation act = alloc.allocate(
        static_cast<std::size_t>(b * (recompute ? per_sample_recomputing : per_sample)), MemoryCategory::activations);
    if (also) also(b);
    const Allocation tmp = alloc.allocate(4096, MemoryCategory::backward_temporaries);
  }
  plan::PlanRequest request(int64_t effective_batch, int64_t budget) {
    plan::PlanRequest r;
    r.effective_batch = effective_batch;
    r.budget = budget;
    r.micro_batch = [this](int64_t b) { micro_batch(b); };
    r.optimizer = &sgd;
    r.micro_batch_seconds = larger_is_faster;
    return r;
  }
  // The same with one recompute segment the planner may turn on.
  plan::PlanRequest request_with_recompute(int64_t effective_batch, int64_t budget) {
    plan::PlanRequest r = request(effective_batch, budget);
    r.recompute_segments = {"all"};
    r.apply = [this](const plan::PlanSetting& s) { recompute = s.recompute != 0; };
    return r;
  }
  // What micro-batch `b` is predicted to reserve (from a plan without a budget).
  int64_t reserved(int64_t effective_batch, int64_t b) {
    for (const plan::PlanRow& r : plan::plan_batch(request(effective_batch, 0)).table)
      if (r.micro_batch == b) return r.reserved_bytes;
    return -1;
  }
};

TEST(PlanBatch, ProbeThatRunsOutOfMemoryFallsBackToTheNextSmallerDivisor) {
  Synthetic s;
  const int64_t budget = s.reserved(64, 64);
  plan::PlanRequest request = s.request(64, budget);
  // After the table: an allocation the recordings never saw, in the probe of 64 only.
  request.on_table = [&](const plan::Plan&) {
    s.also = [](int64_t b) {
      if (b == 64) allocator_for(kCpu).allocate(std::size_t{64} << 20, MemoryCategory::other);
    };
  };
  const plan::Plan plan = plan::plan_batch(request);
  EXPECT_TRUE(plan.table[0].fits);
  EXPECT_EQ(plan.rejected_by_probe, std::vector<int64_t>{64});
  EXPECT_EQ(plan.micro_batch, 32);
  EXPECT_EQ(plan.accum_steps, 2);
  EXPECT_TRUE(plan.verified);
  EXPECT_NE(plan.reason.find("micro-batch 64 ran out of memory in its probe"), std::string::npos) << plan.reason;
}

// The largest micro-batch a weighed setting is predicted to fit (0: none, or not weighed).
int64_t largest_fitting(const plan::Plan& p, uint32_t recompute) {
  for (const plan::Plan::Weighed& w : p.weighed)
    if (w.setting.recompute == recompute) return w.largest_fitting;
  return 0;
}

// Recompute is predicted for every divisor; with recompute 30% slower a sample it is chosen only
// where it lets a larger (so faster) micro-batch fit, and the lever is left as the choice has it.
TEST(PlanBatch, RecomputeOnlyWhenItLetsALargerMicroBatchFit) {
  Synthetic s;
  std::vector<bool> lever;
  auto plan_with_lever = [&](int64_t budget) {
    plan::PlanRequest request = s.request_with_recompute(64, budget);
    request.apply = [&](const plan::PlanSetting& setting) {
      lever.push_back(setting.recompute != 0);
      s.recompute = setting.recompute != 0;
    };
    return plan::plan_batch(request);
  };
  const int64_t whole = s.reserved(64, 64), half = s.reserved(64, 32);
  ASSERT_LT(half, whole);

  plan::Plan p = plan_with_lever(whole);  // fits without
  EXPECT_EQ(lever.front(), true);   // recorded with it
  ASSERT_EQ(p.weighed.size(), 2u);
  EXPECT_FALSE(p.setting.recompute != 0 || s.recompute);
  EXPECT_EQ(largest_fitting(p, 0), 64);
  EXPECT_EQ(largest_fitting(p, 1), 64);
  EXPECT_EQ(p.micro_batch, 64);

  lever.clear();
  p = plan_with_lever(half);  // 24 KiB a sample instead of 64: 64 fits with recompute
  EXPECT_EQ(lever.front(), true);
  EXPECT_TRUE(p.setting.recompute != 0 && s.recompute);
  EXPECT_EQ(largest_fitting(p, 0), 32);
  EXPECT_EQ(largest_fitting(p, 1), 64);
  EXPECT_EQ(p.micro_batch, 64);
  EXPECT_FALSE(p.table[0].fits);  // 64 without recompute
  EXPECT_TRUE(p.table[1].fits && p.table[1].chosen && p.table[1].setting.recompute == 1);
  EXPECT_NE(p.reason.find("effective batch 64 with recompute all:"), std::string::npos) << p.reason;

  lever.clear();
  s.recompute = false;
  s.per_sample_recomputing = s.per_sample;  // a lever that saves nothing is put back
  p = plan_with_lever(half);
  EXPECT_EQ(lever.back(), false);
  EXPECT_FALSE(p.setting.recompute != 0 || s.recompute);
  EXPECT_EQ(p.micro_batch, 32);
}

// With injected timings where recompute doubles a sample's time, micro-batch 32 x 2 without it
// is predicted faster than 64 x 1 with it, though 64 fits only with recompute: the planner takes
// the faster plan, not the largest micro-batch. With recompute 10% slower, 64 with it wins.
TEST(PlanBatch, PrefersAFasterPlanOverTheLargestMicroBatchWhenRecomputeIsSlower) {
  Synthetic s;
  const int64_t half = s.reserved(64, 32);
  double recompute_cost = 2.0;
  plan::PlanRequest request = s.request_with_recompute(64, half);
  request.micro_batch_seconds = [&](int64_t b, const plan::PlanSetting& setting) {
    return 1e-4 + 1e-5 * static_cast<double>(b) * (setting.recompute != 0 ? recompute_cost : 1.0);
  };
  request.step_seconds = 1e-3;
  request.epoch_units = 640;
  plan::Plan p = plan::plan_batch(request);
  EXPECT_EQ(largest_fitting(p, 1), 64);
  EXPECT_EQ(p.micro_batch, 32) << p.reason;
  EXPECT_FALSE(p.setting.recompute != 0 || s.recompute);
  ASSERT_EQ(p.weighed.size(), 2u);
  EXPECT_NEAR(p.weighed[1].time.seconds_per_unit, 2e-5, 1e-12);
  EXPECT_NEAR(p.weighed[0].time.fixed_seconds, 1e-4, 1e-12);
  for (const plan::PlanRow& r : p.table)
    if (r.micro_batch == 32 && r.setting.recompute == 0) {
      EXPECT_TRUE(r.chosen);
      EXPECT_NEAR(r.batch_seconds, 2 * (1e-4 + 32e-5) + 1e-3, 1e-12);
      EXPECT_NEAR(r.epoch_seconds, 10 * r.batch_seconds, 1e-12);  // 640 samples: 10 effective batches
    }
  EXPECT_NE(p.reason.find("the fastest of"), std::string::npos) << p.reason;

  recompute_cost = 1.1;
  p = plan::plan_batch(request);
  EXPECT_EQ(p.micro_batch, 64) << p.reason;
  EXPECT_TRUE(p.setting.recompute != 0 && s.recompute);
}

// The table: every divisor, largest first, each without and then with recompute; every row
// predicted (memory and time) and exactly one chosen. Without a budget the fastest row is chosen
// (here recompute is made the faster lever); times within 2% tie: the largest micro-batch that
// fits keeps a tie it is in, other ties go to less memory.
TEST(PlanBatch, TableIsCompleteAndOrderedAndWithoutABudgetTheFastestWins) {
  Synthetic s;
  plan::PlanRequest request = s.request_with_recompute(64, 0);
  request.micro_batch_seconds = [&](int64_t b, const plan::PlanSetting& setting) {
    return 1e-4 + 1e-5 * static_cast<double>(b) * (setting.recompute != 0 ? 0.5 : 1.0);
  };
  request.step_seconds = 0;
  plan::Plan p = plan::plan_batch(request);
  const std::vector<int64_t> divisors = {64, 32, 16, 8, 4, 2, 1};
  ASSERT_EQ(p.table.size(), 2 * divisors.size());
  int chosen = 0;
  for (std::size_t i = 0; i < p.table.size(); ++i) {
    const plan::PlanRow& r = p.table[i];
    EXPECT_EQ(r.micro_batch, divisors[i / 2]) << i;
    EXPECT_EQ(r.setting.recompute, i % 2) << i;
    EXPECT_EQ(r.accum_steps, 64 / r.micro_batch);
    EXPECT_TRUE(r.fits);
    EXPECT_GT(r.reserved_bytes, 0);
    EXPECT_GT(r.batch_seconds, 0);
    chosen += r.chosen ? 1 : 0;
  }
  EXPECT_EQ(chosen, 1);
  EXPECT_TRUE(p.table[1].chosen) << p.reason;  // 64 with recompute: the fastest
  EXPECT_EQ(p.micro_batch, 64);
  EXPECT_TRUE(p.setting.recompute != 0 && s.recompute);
  EXPECT_NE(p.reason.find("no budget"), std::string::npos) << p.reason;

  // A tiny fixed cost a call, recompute 5% faster a sample: 64 with recompute is the fastest and
  // every row with recompute is within 2% of it. The tie goes to the least reserved memory (among
  // rows reserving the same, the larger micro-batch).
  request.micro_batch_seconds = [](int64_t b, const plan::PlanSetting& setting) {
    return 1e-7 + 1e-5 * static_cast<double>(b) * (setting.recompute != 0 ? 0.95 : 1.0);
  };
  p = plan::plan_batch(request);
  int64_t least = p.table[0].reserved_bytes;
  for (const plan::PlanRow& r : p.table) least = std::min(least, r.reserved_bytes);
  ASSERT_LT(least, p.table[0].reserved_bytes);
  for (const plan::PlanRow& r : p.table) {
    if (r.chosen) EXPECT_EQ(r.reserved_bytes, least) << p.reason;
    if (r.reserved_bytes == least && r.micro_batch > p.micro_batch)
      ADD_FAILURE() << r.micro_batch << " reserves as little";
  }
  EXPECT_LT(p.micro_batch, 64);
  EXPECT_NE(p.setting.recompute, 0u);
  EXPECT_NE(p.reason.find("with less memory"), std::string::npos) << p.reason;

  // The same with recompute as fast: the largest micro-batch without it ties the fastest and, as
  // the planner's choice before it predicted time, keeps the tie.
  request.micro_batch_seconds = [](int64_t b, const plan::PlanSetting&) {
    return 1e-7 + 1e-5 * static_cast<double>(b);
  };
  p = plan::plan_batch(request);
  EXPECT_EQ(p.micro_batch, 64) << p.reason;
  EXPECT_EQ(p.setting.recompute, 0u);
}

// A micro-batch whose memory each lever changes by a known amount (Note [Plan levers]):
// activations of 64 KiB a sample, 32 KiB less with segment 0 recomputed and 8 KiB less with
// segment 1, half as many bytes in 16 bits; a training set of 8 MiB held in the allocator while it
// is on the device, and a staged batch of 1 KiB a sample from the host.
struct LeverRig {
  Generator gen{1};
  nn::Linear layer{4, 2, gen, kCpu};
  std::shared_ptr<nn::FlatParameters> flat = std::make_shared<nn::FlatParameters>(layer);
  optim::SGD sgd{flat, optim::SGDOptions{}};
  plan::PlanSetting in_place;
  Allocation dataset;
  std::vector<plan::PlanSetting> applied;

  LeverRig() {
    allocator_for(kCpu).empty_cache();
    apply(in_place);
  }
  void apply(const plan::PlanSetting& s) {
    applied.push_back(s);
    in_place = s;
    dataset.reset();
    if (s.data == plan::DataPlacement::device)
      dataset = allocator_for(kCpu).allocate(std::size_t{8} << 20, MemoryCategory::data);
  }
  void micro_batch(int64_t b) const {
    CachingAllocator& alloc = allocator_for(kCpu);
    Allocation staged;
    if (in_place.data == plan::DataPlacement::host)
      staged = alloc.allocate(static_cast<std::size_t>(b) << 10, MemoryCategory::data);
    int64_t per_sample = (64 - (in_place.recompute & 1 ? 32 : 0) - (in_place.recompute & 2 ? 8 : 0)) << 10;
    if (in_place.precision != Precision::fp32) per_sample /= 2;
    const Allocation act = alloc.allocate(static_cast<std::size_t>(b * per_sample), MemoryCategory::activations);
    const Allocation tmp = alloc.allocate(4096, MemoryCategory::backward_temporaries);
  }
  plan::PlanRequest request(int64_t effective_batch, int64_t budget) {
    plan::PlanRequest r;
    r.effective_batch = effective_batch;
    r.budget = budget;
    r.micro_batch = [this](int64_t b) { micro_batch(b); };
    r.optimizer = &sgd;
    r.apply = [this](const plan::PlanSetting& s) { apply(s); };
    r.micro_batch_seconds = larger_is_faster;
    return r;
  }
  // The least reserved bytes any row of `p` with the data at `where` is predicted to need.
  static int64_t least_reserved(const plan::Plan& p, plan::DataPlacement where) {
    int64_t least = -1;
    for (const plan::PlanRow& r : p.table)
      if (r.setting.data == where && (least < 0 || r.reserved_bytes < least)) least = r.reserved_bytes;
    return least;
  }
};

// Host-resident data is weighed only when nothing fits with the data on the device, even where it
// is predicted faster: a budget the device-resident plans fit keeps the data there (no host row in
// the table); one they cannot fit moves it to the host, and the reason says why.
TEST(PlanBatch, PicksHostResidentDataOnlyWhenDeviceResidentDataCannotFit) {
  LeverRig rig;
  plan::PlanRequest request = rig.request(64, 0);
  request.weigh_placement = true;
  request.micro_batch_seconds = [](int64_t b, const plan::PlanSetting& s) {
    return 1e-4 + 1e-5 * static_cast<double>(b) * (s.data == plan::DataPlacement::host ? 0.5 : 1.0);
  };
  const plan::Plan free = plan::plan_batch(request);
  for (const plan::PlanRow& r : free.table)
    EXPECT_EQ(r.setting.data, plan::DataPlacement::device) << "host weighed unneeded";
  EXPECT_EQ(free.setting.data, plan::DataPlacement::device);
  const int64_t device_least = LeverRig::least_reserved(free, plan::DataPlacement::device);

  request.budget = device_least;  // micro-batch 1 fits on the device
  plan::Plan p = plan::plan_batch(request);
  EXPECT_EQ(p.setting.data, plan::DataPlacement::device) << p.reason;
  EXPECT_EQ(rig.in_place.data, plan::DataPlacement::device);
  EXPECT_EQ(p.weighed.size(), 1u);

  request.budget = device_least - (int64_t{4} << 20);  // the 8 MiB set does not fit on the device
  p = plan::plan_batch(request);
  ASSERT_GT(p.micro_batch, 0) << p.reason;
  EXPECT_EQ(p.setting.data, plan::DataPlacement::host);
  EXPECT_EQ(rig.in_place.data, plan::DataPlacement::host) << "the chosen setting is left in place";
  EXPECT_TRUE(p.verified);
  ASSERT_EQ(p.weighed.size(), 2u);
  EXPECT_EQ(p.weighed[1].setting.data, plan::DataPlacement::host);
  EXPECT_LT(p.weighed[1].reserved_at_rest, p.weighed[0].reserved_at_rest);
  EXPECT_EQ(p.table.size(), 14u);  // every divisor on the device, then on the host
  EXPECT_NE(p.reason.find("with data on host"), std::string::npos) << p.reason;
  EXPECT_NE(p.reason.find("no plan with the training set on the device fits"), std::string::npos) << p.reason;
  rig.apply(plan::PlanSetting{});

  // Nothing fits even on the host: the set goes back to the device, though the budget has no room
  // for it (it was there before the budget applied), and the plan says why instead of throwing.
  request.budget = int64_t{1} << 20;
  p = plan::plan_batch(request);
  EXPECT_EQ(p.micro_batch, 0) << p.reason;
  EXPECT_EQ(rig.in_place.data, plan::DataPlacement::device);
  EXPECT_EQ(allocator_for(kCpu).memory_limit(), 0);
  rig.apply(plan::PlanSetting{});
}

// The optimizer's state on the host is weighed only when nothing fits with it on the device: a
// budget the device plans fit keeps it there (no host row); one that only AdamW's moments break
// moves it to the host, each row lower by exactly their bytes, the optimizer left placed there and
// two real steps within the budget; where nothing fits either way it goes back to the device.
TEST(PlanBatch, PlacesTheOptimizerStateOnTheHostOnlyWhenNothingFitsOnTheDevice) {
  const Rig rig(mlp());
  auto adamw = std::make_shared<optim::AdamW>(rig.flat, optim::AdamWOptions{});
  plan::PlanRequest request = rig.request(*adamw, 64, 0);
  request.weigh_state_placement = true;
  const plan::Plan free = plan::plan_batch(request);
  int64_t device_least = -1;
  for (const plan::PlanRow& r : free.table) {
    EXPECT_EQ(r.setting.optimizer_state, optim::StatePlacement::device) << "host weighed unneeded";
    if (device_least < 0 || r.reserved_bytes < device_least) device_least = r.reserved_bytes;
  }
  EXPECT_EQ(adamw->state_placement(), optim::StatePlacement::device);

  request.budget = device_least - 1;  // no micro-batch fits beside the moments
  const plan::Plan p = plan::plan_batch(request);
  ASSERT_GT(p.micro_batch, 0) << p.reason;
  EXPECT_EQ(p.setting.optimizer_state, optim::StatePlacement::host);
  EXPECT_EQ(adamw->state_placement(), optim::StatePlacement::host) << "the chosen placement is left in place";
  EXPECT_TRUE(p.verified);
  EXPECT_NE(p.reason.find("nothing fit with the optimizer state on the device"), std::string::npos) << p.reason;
  ASSERT_EQ(p.table.size(), 14u);  // every divisor of 64 with the state on the device, then on the host
  const int64_t moments = 2 * rounded(static_cast<int64_t>(rig.flat->values().nbytes()));
  for (std::size_t i = 0; i < p.table.size(); i += 2) {
    const plan::PlanRow &on_device = p.table[i], &on_host = p.table[i + 1];
    EXPECT_EQ(on_device.micro_batch, on_host.micro_batch);
    EXPECT_EQ(on_host.setting.optimizer_state, optim::StatePlacement::host);
    EXPECT_FALSE(on_device.fits);
    EXPECT_EQ(on_device.peak_bytes - on_host.peak_bytes, moments) << on_host.micro_batch;
  }
  EXPECT_EQ(rig.train_two_steps(adamw, p.micro_batch, p.accum_steps, request.budget), "");

  // Nothing fits either way: the state stays on the device, and the plan says why.
  auto other = std::make_shared<optim::AdamW>(rig.flat, optim::AdamWOptions{});
  plan::PlanRequest tiny = rig.request(*other, 64, int64_t{1} << 20);
  tiny.weigh_state_placement = true;
  const plan::Plan none = plan::plan_batch(tiny);
  EXPECT_EQ(none.micro_batch, 0);
  EXPECT_EQ(other->state_placement(), optim::StatePlacement::device);
  EXPECT_NE(none.reason.find("with the optimizer state on the host"), std::string::npos) << none.reason;
  // A state that exists cannot move.
  other->step();
  EXPECT_THROW(plan::plan_batch(tiny), InvalidArgument);
}

// 8-bit state is weighed only with the opt-in and only when nothing fits in 32 bits, before the
// host: a budget only AdamW's f32 moments break takes 8 bits on the device (each row lower by the
// bytes 8 bits save), leaves the optimizer at 8 bits and trains within it; with the host weighed
// too, a budget with room for half the 8-bit state moves the state to the host at 32 bits.
TEST(PlanBatch, WeighsEightBitStateWithTheOptInBeforeTheHost) {
  const Rig rig(mlp());
  auto adamw = std::make_shared<optim::AdamW>(rig.flat, optim::AdamWOptions{});
  plan::PlanRequest request = rig.request(*adamw, 64, 0);
  int64_t device_least = -1;
  for (const plan::PlanRow& r : plan::plan_batch(request).table)
    if (device_least < 0 || r.reserved_bytes < device_least) device_least = r.reserved_bytes;
  request.budget = device_least - 1;
  EXPECT_EQ(plan::plan_batch(request).micro_batch, 0) << "8 bits weighed without the opt-in";
  EXPECT_EQ(adamw->state_bits(), 32);

  request.weigh_state_bits = true;
  const plan::Plan p = plan::plan_batch(request);
  ASSERT_GT(p.micro_batch, 0) << p.reason;
  EXPECT_EQ(p.setting.optimizer_bits, 8);
  EXPECT_EQ(p.setting.optimizer_state, optim::StatePlacement::device);
  EXPECT_EQ(adamw->state_bits(), 8) << "the chosen bits are left in place";
  EXPECT_NE(p.reason.find("nothing fit with the optimizer state on the device in 32 bits"), std::string::npos)
      << p.reason;
  ASSERT_EQ(p.table.size(), 14u);
  const int64_t moments = 2 * rounded(static_cast<int64_t>(rig.flat->values().nbytes()));
  for (std::size_t i = 0; i < p.table.size(); i += 2) {
    const plan::PlanRow &f32 = p.table[i], &q8 = p.table[i + 1];
    EXPECT_EQ(q8.setting.optimizer_bits, 8);
    EXPECT_GT(f32.peak_bytes - q8.peak_bytes, moments * 7 / 10) << q8.micro_batch;  // 26.6% of the bytes kept
  }
  EXPECT_EQ(rig.train_two_steps(adamw, p.micro_batch, p.accum_steps, request.budget), "");
  adamw.reset();

  // 784-4096-10: 3.3 M parameters, whose 8-bit state (6.5 MiB) outgrows the 2 MiB segments' slack.
  auto wide_model = std::make_unique<nn::Sequential>();
  Generator gen(4);
  wide_model->add(std::make_shared<nn::Linear>(784, 4096, gen, kCpu));
  wide_model->add(std::make_shared<nn::ReLU>());
  wide_model->add(std::make_shared<nn::Linear>(4096, 10, gen, kCpu));
  const Rig wide(std::move(wide_model));
  auto other = std::make_shared<optim::AdamW>(wide.flat, optim::AdamWOptions{});
  plan::PlanRequest both = wide.request(*other, 64, 0);
  both.weigh_state_bits = true;
  both.weigh_state_placement = true;
  const plan::Plan eight = plan::plan_batch(both);  // no budget: 32 bits fits, nothing else weighed
  ASSERT_EQ(eight.table.size(), 7u);
  EXPECT_EQ(other->state_bits(), 32);
  const int64_t state_8bit = [&] {
    optim::AdamWOptions o;
    o.state_bits = 8;
    int64_t bytes = 0;
    for (int64_t b : optim::AdamW(wide.flat, o).state_to_allocate()) bytes += rounded(b);
    return bytes;
  }();
  int64_t f32_least = -1;
  for (const plan::PlanRow& r : eight.table)
    if (f32_least < 0 || r.reserved_bytes < f32_least) f32_least = r.reserved_bytes;
  both.budget = f32_least - 2 * rounded(static_cast<int64_t>(wide.flat->values().nbytes())) + state_8bit / 2;
  const plan::Plan h = plan::plan_batch(both);
  ASSERT_GT(h.micro_batch, 0) << h.reason;
  EXPECT_EQ(h.setting.optimizer_state, optim::StatePlacement::host);
  EXPECT_EQ(h.setting.optimizer_bits, 32) << "the host keeps the numbers";
  EXPECT_EQ(h.table.size(), 21u);  // 32 bits and 8 on the device, then the host
  EXPECT_EQ(other->state_bits(), 32);
  EXPECT_EQ(other->state_placement(), optim::StatePlacement::host);
}

// 784-256-...-256-10 with eight hidden layers: stage 2 saves half of a gradient no parameter of
// which is much larger than the others (a bucket holds a whole parameter's gradient at least).
std::unique_ptr<nn::Module> deep_mlp() {
  auto m = std::make_unique<nn::Sequential>();
  Generator gen(5);
  m->add(std::make_shared<nn::Linear>(784, 256, gen, kCpu));
  for (int i = 0; i < 8; ++i) {
    m->add(std::make_shared<nn::ReLU>());
    m->add(std::make_shared<nn::Linear>(256, 256, gen, kCpu));
  }
  m->add(std::make_shared<nn::ReLU>());
  m->add(std::make_shared<nn::Linear>(256, 10, gen, kCpu));
  return m;
}

// Data parallel over two ranks, planned for rank 0 (Note [Plan levers]): each ZeRO stage is weighed
// only when nothing fits below it; stage 1's rows hold half the moments, stage 2's half the
// gradient too (and its buckets during backward), and the chosen plan trains within the budget as
// rank 0 of a Trainer of that stage.
TEST(PlanBatch, ShardsTheStateThenTheGradientsOverTheRanksOnlyWhenNothingFitsUnsharded) {
  const Rig rig(deep_mlp());
  auto adamw = std::make_shared<optim::AdamW>(rig.flat, optim::AdamWOptions{});
  plan::PlanRequest request = rig.request(*adamw, 32, 0);  // rank 0's part of an effective batch of 64
  request.world_size = 2;
  request.weigh_zero = true;
  request.bucket_bytes = 256 << 10;
  auto least_reserved = [](const plan::Plan& p, int stage) {
    int64_t least = -1;
    for (const plan::PlanRow& r : p.table)
      if (r.setting.zero_stage == stage && (least < 0 || r.reserved_bytes < least)) least = r.reserved_bytes;
    return least;
  };
  const plan::Plan free = plan::plan_batch(request);
  for (const plan::PlanRow& r : free.table) EXPECT_EQ(r.setting.zero_stage, 0) << "a stage weighed unneeded";

  request.budget = least_reserved(free, 0) - 1;
  const plan::Plan one = plan::plan_batch(request);
  ASSERT_GT(one.micro_batch, 0) << one.reason;
  EXPECT_EQ(one.setting.zero_stage, 1);
  EXPECT_NE(one.reason.find("nothing fit with the optimizer state on the device in 32 bits"), std::string::npos)
      << one.reason;
  const int64_t parameter_bytes = rounded(static_cast<int64_t>(rig.flat->values().nbytes()));
  for (std::size_t i = 0; i < one.table.size(); i += 2) {
    const plan::PlanRow &whole = one.table[i], &shard = one.table[i + 1];
    ASSERT_EQ(whole.micro_batch, shard.micro_batch);
    EXPECT_EQ(shard.setting.zero_stage, 1);
    EXPECT_NEAR(static_cast<double>(whole.peak_bytes - shard.peak_bytes), static_cast<double>(parameter_bytes),
                64.0 * 1024) << "half of two moments";
  }
  EXPECT_EQ(rig.train_two_steps(adamw, one.micro_batch, one.accum_steps, request.budget, 1), "");

  adamw.reset();  // its state freed
  auto fresh = std::make_shared<optim::AdamW>(rig.flat, optim::AdamWOptions{});
  request.optimizer = fresh.get();
  request.budget = least_reserved(one, 1) - 1;
  const plan::Plan two = plan::plan_batch(request);
  ASSERT_GT(two.micro_batch, 0) << two.reason;
  EXPECT_EQ(two.setting.zero_stage, 2);
  EXPECT_EQ(two.table.size(), 18u);  // the 6 divisors of 32 at each stage
  EXPECT_TRUE(rig.flat->gradients_sharded()) << "a plan of stage 2 leaves the gradients sharded for its Trainer";
  EXPECT_EQ(fresh->shard_count(), rig.flat->size()) << "the Trainer keeps the optimizer's shard";
  EXPECT_EQ(rig.train_two_steps(fresh, two.micro_batch, two.accum_steps, request.budget, 2), "");
  EXPECT_EQ(rig.flat->gradients().numel(), rig.flat->size()) << "the Trainer's end gives the flat gradient back";

  plan::PlanRequest alone = rig.request(*fresh, 32, 0);
  alone.weigh_zero = true;  // one rank: nothing to shard over
  EXPECT_THROW(plan::plan_batch(alone), InvalidArgument);
}

// Collective lines for two ranks, as measure_collective_times would fit them (fixed numbers: the
// predicted times are then exact).
dist::CollectiveTimes two_rank_collectives() {
  dist::CollectiveTimes t;
  t.world_size = 2;
  t.all_reduce = {1e-4, 1e-9};
  t.reduce_scatter = {2e-4, 5e-10};
  t.all_gather = {3e-4, 7e-10};
  return t;
}

// The collectives a row of `stage` makes in an effective batch of `accum_steps` micro-batches
// (Note [Predicting time]): the buckets as a Trainer of `bucket_bytes` cuts them.
double expected_collectives(const dist::CollectiveTimes& t, const nn::FlatParameters& flat, int64_t bucket_bytes,
                            int stage, int64_t accum_steps) {
  double buckets_all_reduced = 0, buckets_reduce_scattered = 0;
  for (const dist::BucketRange& b : dist::bucket_layout(flat, bucket_bytes)) {
    buckets_all_reduced += t.all_reduce.latency_seconds + t.all_reduce.seconds_per_byte * double(b.count * 4);
    buckets_reduce_scattered +=
        t.reduce_scatter.latency_seconds + t.reduce_scatter.seconds_per_byte * double(b.count * 4);
  }
  const double step_sums = t.all_reduce.latency_seconds + t.all_reduce.seconds_per_byte * 16;
  const double norm_sum = t.all_reduce.latency_seconds + t.all_reduce.seconds_per_byte * 8;
  const double gather = t.all_gather.latency_seconds + t.all_gather.seconds_per_byte * double(flat.size() * 4);
  if (stage == 0) return step_sums + buckets_all_reduced;
  if (stage == 1) return step_sums + buckets_all_reduced + gather;
  return step_sums + double(accum_steps) * buckets_reduce_scattered + norm_sum + gather;
}

// Data parallel rows add the collectives their ZeRO stage makes, from the injected lines: stages 0
// and 1 all-reduce each bucket once a step whatever the accumulation (1 also all-gathers the
// weights), stage 2 reduce-scatters each bucket once per micro-batch, so its row of 32 x 1 pays 31
// rounds fewer than its row of 1 x 32. Without measured lines nothing is added and the reason says so.
TEST(PlanBatch, EachZeroStageAddsTheCollectivesItMakesInAnEffectiveBatch) {
  const Rig rig(deep_mlp());
  const dist::CollectiveTimes times = two_rank_collectives();
  const int64_t bucket_bytes = 256 << 10;
  ASSERT_GE(dist::bucket_layout(*rig.flat, bucket_bytes).size(), 3u) << "several buckets a round";
  std::map<int, std::map<int64_t, double>> comm;  // stage, micro-batch: the row's collectives
  for (int stage : {0, 1, 2}) {
    auto adamw = std::make_shared<optim::AdamW>(rig.flat, optim::AdamWOptions{});
    plan::PlanRequest request = rig.request(*adamw, 32, 0);
    request.world_size = 2;
    request.setting.zero_stage = stage;
    request.bucket_bytes = bucket_bytes;
    request.step_seconds = 1e-3;
    request.collective_times = times;
    const plan::Plan p = plan::plan_batch(request);
    ASSERT_EQ(p.table.size(), 6u) << p.reason;  // the divisors of 32
    for (const plan::PlanRow& r : p.table) {
      const double expected = expected_collectives(times, *rig.flat, bucket_bytes, stage, r.accum_steps);
      EXPECT_DOUBLE_EQ(r.communication_seconds, expected) << "stage " << stage << ", micro-batch " << r.micro_batch;
      EXPECT_DOUBLE_EQ(r.batch_seconds,
                       double(r.accum_steps) * larger_is_faster(r.micro_batch, r.setting) + 1e-3 + expected);
      EXPECT_DOUBLE_EQ(r.batch_seconds_low, r.batch_seconds) << "injected timings: no spread";
      comm[stage][r.micro_batch] = r.communication_seconds;
    }
    EXPECT_NE(p.reason.find("of it collectives"), std::string::npos) << p.reason;
  }
  double one_round = 0;
  for (const dist::BucketRange& b : dist::bucket_layout(*rig.flat, bucket_bytes))
    one_round += times.reduce_scatter.predict(b.count * 4);
  EXPECT_NEAR(comm[2][1] - comm[2][32], 31 * one_round, 1e-12) << "31 more rounds of reduce-scatters";
  EXPECT_EQ(comm[1][1], comm[1][32]) << "stage 1 reduces once a step";
  EXPECT_EQ(comm[0][1], comm[0][32]);
  EXPECT_GT(comm[1][32], comm[0][32]) << "stage 1 also gathers the weights";

  auto adamw = std::make_shared<optim::AdamW>(rig.flat, optim::AdamWOptions{});
  plan::PlanRequest unmeasured = rig.request(*adamw, 32, 0);
  unmeasured.world_size = 2;
  unmeasured.setting.zero_stage = 1;
  const plan::Plan p = plan::plan_batch(unmeasured);
  for (const plan::PlanRow& r : p.table) EXPECT_EQ(r.communication_seconds, 0.0);
  EXPECT_NE(p.reason.find("(communication not measured)"), std::string::npos) << p.reason;
  dist::CollectiveTimes three = times;
  three.world_size = 3;
  unmeasured.collective_times = three;
  EXPECT_THROW(plan::plan_batch(unmeasured), InvalidArgument) << "lines of another world";
}

// Rows within 2% of the fastest tie, and a tie the largest micro-batch is not in goes to the least
// memory (Note [Plan levers]): here recompute is 5% faster a sample, so without collectives every
// row with recompute ties and a small micro-batch wins. At stage 2 each micro-batch is a round of
// reduce-scatters, which breaks the tie: 64 x 1 with recompute pays one round, 32 x 2 two.
TEST(PlanBatch, StageTwosRoundsPerMicroBatchBreakATieTowardsFewerMicroBatches) {
  auto plan_stage_two = [](const dist::CollectiveTimes& times) {
    Synthetic s;
    plan::PlanRequest request = s.request_with_recompute(64, 0);
    request.micro_batch_seconds = [](int64_t b, const plan::PlanSetting& setting) {
      return 1e-7 + 1e-5 * static_cast<double>(b) * (setting.recompute != 0 ? 0.95 : 1.0);
    };
    request.step_seconds = 0;
    request.world_size = 2;
    request.setting.zero_stage = 2;
    request.collective_times = times;
    return plan::plan_batch(request);
  };
  const plan::Plan without = plan_stage_two(dist::CollectiveTimes{});
  EXPECT_LT(without.micro_batch, 64) << without.reason;
  EXPECT_NE(without.setting.recompute, 0u);
  EXPECT_NE(without.reason.find("with less memory"), std::string::npos) << without.reason;
  const plan::Plan with = plan_stage_two(two_rank_collectives());
  EXPECT_EQ(with.micro_batch, 64) << with.reason;
  EXPECT_NE(with.setting.recompute, 0u);
  EXPECT_EQ(with.setting.zero_stage, 2);
  EXPECT_NE(with.reason.find("the fastest of 14 candidates"), std::string::npos) << with.reason;
}

// Precision is weighed only with the opt-in, and then wins only by more than the 2% tie: without
// it no 16-bit row exists even where bf16 would fit a larger and faster micro-batch, and the
// request's precision is left in place; with it bf16 is chosen there, and where both fit and bf16
// is 1% faster, fp32 stays.
TEST(PlanBatch, NeverChangesPrecisionWithoutTheOptIn) {
  LeverRig rig;
  double bf16_speed = 0.5;
  plan::PlanRequest request = rig.request(64, 0);
  request.micro_batch_seconds = [&](int64_t b, const plan::PlanSetting& s) {
    return (1e-4 + 1e-5 * static_cast<double>(b)) * (s.precision == Precision::bf16 ? bf16_speed : 1.0);
  };
  request.precisions = {Precision::bf16};
  const plan::Plan both = plan::plan_batch(request);
  ASSERT_EQ(both.table.size(), 14u);
  EXPECT_EQ(both.setting.precision, Precision::bf16) << "without a budget the faster bf16 wins: " << both.reason;
  rig.apply(plan::PlanSetting{});

  // A budget bf16 fits micro-batch 64 in and fp32 does not.
  ASSERT_EQ(both.table[1].setting.precision, Precision::bf16);
  request.budget = both.table[1].reserved_bytes;
  ASSERT_LT(request.budget, both.table[0].reserved_bytes);
  request.precisions.clear();
  rig.applied.clear();
  plan::Plan p = plan::plan_batch(request);
  ASSERT_GT(p.micro_batch, 0) << p.reason;
  EXPECT_LT(p.micro_batch, 64) << p.reason;
  for (const plan::PlanRow& r : p.table) EXPECT_EQ(r.setting.precision, Precision::fp32);
  EXPECT_EQ(p.setting.precision, Precision::fp32);
  for (const plan::PlanSetting& s : rig.applied) EXPECT_EQ(s.precision, Precision::fp32) << "bf16 put in place";
  EXPECT_EQ(rig.in_place.precision, Precision::fp32);

  request.precisions = {Precision::bf16};
  p = plan::plan_batch(request);
  EXPECT_EQ(p.micro_batch, 64) << p.reason;
  EXPECT_EQ(p.setting.precision, Precision::bf16);
  EXPECT_EQ(rig.in_place.precision, Precision::bf16);
  EXPECT_NE(p.reason.find("with bf16"), std::string::npos) << p.reason;

  bf16_speed = 0.99;  // both fit without a budget; 1% is a tie, and a tie keeps fp32
  request.budget = 0;
  p = plan::plan_batch(request);
  EXPECT_EQ(p.setting.precision, Precision::fp32) << p.reason;
  EXPECT_EQ(p.micro_batch, 64);
  rig.apply(plan::PlanSetting{});
}

// Per segment: every subset of two segments is weighed (four settings a divisor, in mask order),
// and the cheaper segment alone is taken where it is enough: segment 0 saves 32 KiB a sample for
// 10% more time, segment 1 8 KiB for 40% more.
TEST(PlanBatch, WeighsEverySubsetOfTheRecomputeSegments) {
  LeverRig rig;
  plan::PlanRequest request = rig.request(64, 0);
  request.recompute_segments = {"block1", "block2"};
  request.micro_batch_seconds = [](int64_t b, const plan::PlanSetting& s) {
    const double slower = 1.0 + (s.recompute & 1 ? 0.1 : 0.0) + (s.recompute & 2 ? 0.4 : 0.0);
    return 1e-3 + 1e-5 * static_cast<double>(b) * slower;
  };
  const plan::Plan free = plan::plan_batch(request);
  ASSERT_EQ(free.table.size(), 4 * 7u);
  for (std::size_t i = 0; i < free.table.size(); ++i) EXPECT_EQ(free.table[i].setting.recompute, i % 4) << i;
  EXPECT_EQ(free.setting.recompute, 0u);
  EXPECT_EQ(plan::plan_setting_text(free.table[1].setting, free.recompute_segments),
            "recompute block1, data on device, fp32");
  EXPECT_EQ(plan::recompute_text(3, free.recompute_segments), "all");
  EXPECT_EQ(plan::recompute_text(2, free.recompute_segments), "block2");
  // 64 with segment 0 only: the budget is its reserved bytes, below 64's without recompute.
  request.budget = free.table[1].reserved_bytes;
  ASSERT_LT(request.budget, free.table[0].reserved_bytes);
  const plan::Plan p = plan::plan_batch(request);
  EXPECT_EQ(p.micro_batch, 64) << p.reason;
  EXPECT_EQ(p.setting.recompute, 1u) << p.reason;
  EXPECT_EQ(rig.in_place.recompute, 1u);
  EXPECT_NE(p.reason.find("with recompute block1:"), std::string::npos) << p.reason;
  rig.apply(plan::PlanSetting{});
  request.recompute_segments = {"a", "b", "c", "d", "e"};
  EXPECT_THROW(plan::plan_batch(request), InvalidArgument);
}

// The training loop's own blocks (a Trainer's learning-rate table and step state, made with it after
// the planning) are held in every row, category other, as the optimizer state is: without them a plan
// at the edge of the budget passed its probe and then ran out of memory by those bytes in the loop.
TEST(PlanBatch, HoldsTheLoopsStateInEveryRow) {
  Synthetic s;
  const plan::Plan without = plan::plan_batch(s.request(64, 0));
  plan::PlanRequest request = s.request(64, 0);
  request.loop_state = train::Trainer::state_to_allocate();
  ASSERT_EQ(request.loop_state.size(), 2u);
  const int64_t table_bytes = rounded(request.loop_state[0]) + rounded(request.loop_state[1]);
  const plan::Plan with = plan::plan_batch(request);
  ASSERT_EQ(with.table.size(), without.table.size());
  constexpr auto kOther = static_cast<std::size_t>(MemoryCategory::other);
  for (std::size_t i = 0; i < with.table.size(); ++i) {
    EXPECT_EQ(with.table[i].peak_bytes - without.table[i].peak_bytes, table_bytes) << i;
    EXPECT_EQ(with.table[i].peak_by_category[kOther] - without.table[i].peak_by_category[kOther], table_bytes) << i;
  }
  EXPECT_EQ(with.optimizer_state_bytes, 0) << "the loop's blocks are not optimizer state";
}

// Without injected timings, the probes' own times are fitted (a line through positive times)
// and a step of an optimizer that already holds its state is probed and undone: the parameters,
// the state and the update count are as before.
TEST(PlanBatch, TimesTheProbesAndAnOptimizerStepItUndoes) {
  const Rig rig(mlp());
  auto adamw = std::make_shared<optim::AdamW>(rig.flat, optim::AdamWOptions{});
  ASSERT_EQ(rig.train_two_steps(adamw, 8, 1, int64_t{1} << 40), "");  // the state is held now
  const std::vector<float> values = rig.flat->values().to_vector<float>();
  std::vector<std::vector<float>> state;
  for (const auto& [name, t] : adamw->state()) state.push_back(t.to_vector<float>());
  const int64_t updates = adamw->updates();
  plan::PlanRequest request = rig.request(*adamw, 64, 0);
  request.micro_batch_seconds = nullptr;
  const plan::Plan p = plan::plan_batch(request);
  EXPECT_TRUE(p.step_timed);
  EXPECT_GT(p.step_seconds, 0);
  ASSERT_EQ(p.weighed.size(), 1u);
  EXPECT_GT(p.weighed[0].time.probes, 2);
  EXPECT_GT(p.weighed[0].time.seconds_per_unit + p.weighed[0].time.fixed_seconds, 0);
  for (const plan::PlanRow& r : p.table) EXPECT_GT(r.batch_seconds, p.step_seconds);
  EXPECT_EQ(rig.flat->values().to_vector<float>(), values);
  std::size_t k = 0;
  for (const auto& [name, t] : adamw->state()) EXPECT_EQ(t.to_vector<float>(), state[k++]) << name;
  EXPECT_EQ(adamw->updates(), updates);

  // Before its first step the state does not exist: the probe makes one and leaves none, the weights
  // and the update count as they were.
  optim::AdamW fresh(rig.flat, optim::AdamWOptions{});
  plan::PlanRequest first = rig.request(fresh, 64, 0);
  first.micro_batch_seconds = nullptr;
  EXPECT_TRUE(plan::plan_batch(first).step_timed);
  EXPECT_EQ(fresh.state_bytes(), 0);
  EXPECT_TRUE(fresh.next_update_allocates());
  EXPECT_EQ(fresh.updates(), 0);
  EXPECT_EQ(rig.flat->values().to_vector<float>(), values);
}

// fit_time: the median per size, then a line; one size gives a line through the origin.
TEST(PlanBatch, FitTimeTakesTheMedianPerSizeAndFitsALine) {
  const plan::TimeFit fit = plan::fit_time({{1, 2e-3}, {1, 9.0}, {1, 2e-3}, {4, 5e-3}, {8, 9e-3}});
  EXPECT_EQ(fit.probes, 3);
  EXPECT_NEAR(fit.fixed_seconds, 1e-3, 1e-9);
  EXPECT_NEAR(fit.seconds_per_unit, 1e-3, 1e-9);
  const plan::TimeFit one = plan::fit_time({{4, 2e-3}});
  EXPECT_EQ(one.fixed_seconds, 0);
  EXPECT_NEAR(one.predict(8), 4e-3, 1e-12);
  EXPECT_EQ(plan::fit_time({}).probes, 0);
}

TEST(PlanBatch, AnExceptionFromTheMicroBatchLeavesTheLimitAndTheLeverAsTheyWere) {
  struct Interrupt {};
  Synthetic s;
  const int64_t half = s.reserved(64, 32);
  plan::PlanRequest request = s.request_with_recompute(64, half);
  s.also = [&](int64_t) {
    if (s.recompute) throw Interrupt{};  // while recording with recompute on
  };
  allocator_for(kCpu).set_memory_limit(int64_t{1} << 40);
  EXPECT_THROW(plan::plan_batch(request), Interrupt);
  EXPECT_FALSE(s.recompute);
  EXPECT_EQ(allocator_for(kCpu).memory_limit(), int64_t{1} << 40);
  allocator_for(kCpu).set_memory_limit(0);
}

// Recordings that do not match (the allocations change with the size) leave the line through two
// probes, held against the budget less 5% and verified the same way. (The mismatch starts above 32:
// recordings stay within the effective batch 64 now; it started above 128 when they ran at 256.)
// Without room for any micro-batch the probes run out of memory under the budget: no plan.
TEST(PlanBatch, FallsBackToALineThroughTwoProbesWhenRecordingsDoNotMatch) {
  Synthetic s;
  s.also = [](int64_t b) {
    if (b > 32) allocator_for(kCpu).allocate(1000, MemoryCategory::other);
  };
  const plan::Plan free = plan::plan_batch(s.request(64, 0));
  EXPECT_EQ(free.method, plan::PlanMethod::probe_line);
  EXPECT_NE(free.prediction.find("do not match"), std::string::npos) << free.prediction;
  ASSERT_EQ(free.table.size(), 7u);
  EXPECT_EQ(free.table[0].reserved_bytes, -1);
  EXPECT_EQ(free.micro_batch, 64);

  const plan::Plan roomy = plan::plan_batch(s.request(64, free.reserved_at_rest + (int64_t{64} << 20)));
  EXPECT_EQ(roomy.micro_batch, 64);
  EXPECT_TRUE(roomy.verified);
  EXPECT_NE(roomy.reason.find("less 5% margin"), std::string::npos) << roomy.reason;

  // At the reserved bytes at rest the line (fixed costs in whole segments, a 5% margin) once said
  // nothing fits; recorded under the budget, micro-batches up to 16 (1 MiB of activations) run in
  // the room the small segments at rest have, and match: the plan takes 16, verified by a probe.
  const plan::Plan tight = plan::plan_batch(s.request(64, free.reserved_at_rest));
  EXPECT_EQ(tight.method, plan::PlanMethod::recorded_sequence);
  EXPECT_EQ(tight.micro_batch, 16) << tight.reason;
  EXPECT_TRUE(tight.verified);
  EXPECT_LE(tight.largest_probe, 64);

  const plan::Plan none = plan::plan_batch(s.request(64, 1));
  EXPECT_EQ(none.micro_batch, 0) << none.reason;
  EXPECT_FALSE(none.reason.empty());
}

// train::plan_request, the ready-made request over a TensorDataset: its probe is the one its
// documentation describes, written out here (batch 0 of a loader of b samples, the loss backward,
// the gradients discarded), so both plans are the same, row for row; the sample limit is the
// dataset's size. It requires a fit: a budget nothing fits in throws
// OutOfMemory with the plan's reason, where the same request without require_fit returns no choice.
TEST(PlanBatch, ThePlanRequestOverADatasetPlansAsTheHandWrittenOne) {
  const Rig rig(mlp());
  const data::TensorDataset dataset(
      {Tensor::zeros(Shape{600, 784}, DType::f32, kCpu), Tensor::zeros(Shape{600}, DType::i32, kCpu)});
  auto loss = [&](const data::Batch& b) { return ops::cross_entropy((*rig.model)(b.x), b.y, ops::Reduction::Sum); };
  optim::AdamW adamw(rig.flat, optim::AdamWOptions{});
  constexpr int64_t kBudget = int64_t{24} << 20;
  // The documented probe written out: batch 0 of a loader of b, its loss backward, grads discarded.
  plan::PlanRequest by_hand = rig.request(adamw, 512, kBudget);
  by_hand.model = nullptr;
  by_hand.unit_limit = 600;
  by_hand.loop_state = train::Trainer::state_to_allocate();  // the Trainer's learning-rate table
  by_hand.micro_batch = [&](int64_t b) {
    data::DataLoader loader(dataset, b);
    loader.seek(0);
    Tensor probe_loss = loss(loader.next(0));  // the batch released before backward
    probe_loss.backward();
    rig.flat->mark_gradients_stale();
  };
  const plan::Plan want = plan::plan_batch(by_hand);
  plan::PlanRequest request = train::plan_request(adamw, dataset, loss, 512, kBudget);
  request.micro_batch_seconds = larger_is_faster;  // measured timings could tie differently
  EXPECT_EQ(request.device, kCpu);
  EXPECT_EQ(request.unit_limit, 600);
  EXPECT_TRUE(request.require_fit);
  EXPECT_EQ(request.loop_state, train::Trainer::state_to_allocate());
  const plan::Plan got = plan::plan_batch(request);
  for (const auto& [name, p] : rig.model->named_parameters())
    EXPECT_FALSE(p.grad().defined()) << name << ": the probes' gradients are discarded";
  ASSERT_GT(want.micro_batch, 0) << want.reason;
  EXPECT_EQ(got.micro_batch, want.micro_batch) << got.reason;
  EXPECT_EQ(got.accum_steps, want.accum_steps);
  ASSERT_EQ(got.table.size(), want.table.size());
  for (std::size_t k = 0; k < got.table.size(); ++k) {
    EXPECT_EQ(got.table[k].peak_bytes, want.table[k].peak_bytes) << "micro-batch " << got.table[k].micro_batch;
    EXPECT_EQ(got.table[k].reserved_bytes, want.table[k].reserved_bytes) << "micro-batch " << got.table[k].micro_batch;
  }

  plan::PlanRequest tiny = train::plan_request(adamw, dataset, loss, 512, int64_t{64} << 10);
  try {
    plan::plan_batch(tiny);
    ADD_FAILURE() << "a 64 KiB budget was met";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("plan_batch: no micro-batch dividing 512 fits"), std::string::npos)
        << e.what();
  }
  tiny.require_fit = false;
  EXPECT_EQ(plan::plan_batch(tiny).micro_batch, 0);
}

// Over a dataset read at each probe (for a caller whose apply moves its data): every probe reads
// what the function returns then, and the plan is the one over the dataset itself.
TEST(PlanBatch, ThePlanRequestOverADatasetReadAtEachProbe) {
  const Rig rig(mlp());
  data::TensorDataset current(
      {Tensor::zeros(Shape{600, 784}, DType::f32, kCpu), Tensor::zeros(Shape{600}, DType::i32, kCpu)});
  const data::TensorDataset dataset = current;
  int64_t rows_seen = 0;
  auto loss = [&](const data::Batch& b) {
    rows_seen += b.x.size(0);
    return ops::cross_entropy((*rig.model)(b.x), b.y, ops::Reduction::Sum);
  };
  optim::AdamW adamw(rig.flat, optim::AdamWOptions{});
  plan::PlanRequest fixed = train::plan_request(adamw, dataset, loss, 512, int64_t{24} << 20);
  fixed.micro_batch_seconds = larger_is_faster;
  const plan::Plan want = plan::plan_batch(fixed);
  int reads = 0;
  plan::PlanRequest request = train::plan_request(
      adamw,
      [&] {
        ++reads;
        return current;
      },
      loss, 512, int64_t{24} << 20);
  EXPECT_EQ(reads, 1);  // the sample limit and units per row
  EXPECT_EQ(request.unit_limit, 600);
  request.micro_batch_seconds = larger_is_faster;
  rows_seen = 0;
  const plan::Plan got = plan::plan_batch(request);
  EXPECT_GT(reads, 1);
  EXPECT_GT(rows_seen, 0);
  EXPECT_EQ(got.micro_batch, want.micro_batch) << got.reason;
  EXPECT_EQ(got.accum_steps, want.accum_steps);
  // A probe after the data moved reads it where it is now.
  current =
      data::TensorDataset({Tensor::zeros(Shape{8, 784}, DType::f32, kCpu), Tensor::zeros(Shape{8}, DType::i32, kCpu)});
  rows_seen = 0;
  request.micro_batch(64);  // more rows than there are now: the loader's first batch has all 8
  EXPECT_EQ(rows_seen, 8);
}

// The Fashion-MNIST request weighs the levers it is given; its apply sets the model's recompute.
TEST(PlanBatch, AFashionMnistRequestWeighsAndAppliesItsLevers) {
  Generator gen(5);
  models::SeedMLP model(gen, kCpu);
  auto flat = std::make_shared<nn::FlatParameters>(model);
  optim::SGD sgd(flat, optim::SGDOptions{});
  auto split = [](int64_t n) {
    MemoryCategoryScope scope(MemoryCategory::data);
    return models::FashionMnistSplit{Tensor::zeros(Shape{n, 28, 28}, DType::u8, kCpu),
                                     Tensor::zeros(Shape{n}, DType::i32, kCpu), 10};
  };
  models::FashionMnistSplit train = split(64), test = split(16);
  const train::BatchLoss loss = [&model](const data::Batch& b) { return model.loss(b.x, b.y, ops::Reduction::Sum); };
  models::FashionMnistLevers levers;
  levers.weigh_recompute = true;
  levers.weigh_bf16 = true;
  plan::PlanRequest request = models::plan_request(model, sgd, loss, train, test, 32, 0, DType::f32, levers);
  EXPECT_EQ(request.model, &model);
  EXPECT_EQ(request.recompute_segments, model.recompute_segment_names());
  EXPECT_EQ(request.unit_limit, 64);
  if (precision_unsupported_reason(Precision::bf16, kCpu).empty())
    EXPECT_EQ(request.precisions, std::vector<Precision>{Precision::bf16});
  plan::PlanSetting on_host;
  on_host.recompute = 1;
  on_host.data = plan::DataPlacement::host;
  request.apply(on_host);
  EXPECT_TRUE(model.recompute());
  request.apply(plan::PlanSetting{});
  EXPECT_FALSE(model.recompute());
  request.micro_batch_seconds = larger_is_faster;
  const plan::Plan plan = plan::plan_batch(request);
  EXPECT_GT(plan.micro_batch, 0) << plan.reason;
  bool weighed_recompute = false;
  for (const plan::PlanRow& r : plan.table) weighed_recompute |= r.setting.recompute != 0;
  EXPECT_TRUE(weighed_recompute);
}

TEST(PlanBatch, RejectsAMalformedRequest) {
  Synthetic s;
  plan::PlanRequest r = s.request(0, 0);
  EXPECT_THROW(plan::plan_batch(r), InvalidArgument);
  r = s.request(8, 0);
  r.optimizer = nullptr;
  EXPECT_THROW(plan::plan_batch(r), InvalidArgument);
  r = s.request(8, 0);
  r.micro_batch = nullptr;
  EXPECT_THROW(plan::plan_batch(r), InvalidArgument);
}

}  // namespace
}  // namespace cumulus
