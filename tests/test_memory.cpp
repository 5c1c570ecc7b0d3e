// The memory tracker, its reports, budgets and the micro-batch planner.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "cumulus/autograd/grad_mode.h"
#include "cumulus/autograd/node.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/memory/report.h"
#include "cumulus/memory/tracker.h"
#include "cumulus/models/mlp.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/ops/linear.h"
#include "cumulus/ops/loss.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/optim/adamw.h"
#include "cumulus/optim/sgd.h"
#include "cumulus/memory/tracker.h"
#include "cumulus/plan/planner.h"
#include "cumulus/train/trainer.h"
#include "engine/core/opt_in.h"
#include "engine/plan/fits.h"
#include "test_util.h"

namespace cumulus {
namespace {

using testing::DeviceTest;

constexpr int64_t kRound = CachingAllocator::kRounding;
int64_t rounded(int64_t bytes) { return (bytes + kRound - 1) / kRound * kRound; }

// What the seed MLP's forward leaves allocated for backward at micro-batch b (see the ops' notes):
// each fused linear+relu saves its output (r1, r2: [b, 512], also the next Linear's saved input),
// as relu did when the two were separate ops, and keeps no pre-activation nor, on any device, a
// ReLU bit mask (Note [Fused linear]); cross_entropy saves the logits [b, 10] and, on the CPU, its
// rows' maxima and log sums [2 b] (so its backward need not compute them again); the loss scalar is
// alive too. Flatten and the batch views allocate nothing.
int64_t seed_mlp_activation_bytes(int64_t b, Device device) {
  const int64_t row_stats = device.is_cpu() ? rounded(b * 2 * 4) : 0;
  return 2 * rounded(b * 512 * 4) + rounded(b * 10 * 4) + row_stats + rounded(4);
}

struct Data {
  Tensor x, y;
};

Data make_data(int64_t n, Device device) {
  Generator gen(7);
  std::vector<float> x(static_cast<std::size_t>(n * 784));
  gen.fill_uniform(x.data(), n * 784, 0.0f, 1.0f);
  std::vector<int32_t> y(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) y[static_cast<std::size_t>(i)] = static_cast<int32_t>(i % 10);
  MemoryCategoryScope scope(MemoryCategory::data);
  return {Tensor::from_vector(x, Shape{n, 784}, device), Tensor::from_vector(y, Shape{n}, device)};
}

// One epoch over `n` samples in micro-batches of `b`, `accum` per step, tracked.
void run_tracked(memory::MemoryTracker& tracker, models::SeedMLP& model, train::Trainer& acc, const Data& d,
                 int64_t b, int64_t n) {
  const int64_t mbs = (n + b - 1) / b;
  acc.begin_epoch(0, mbs);
  for (int64_t i = 0; i < mbs; ++i) {
    const int64_t start = i * b, size = std::min(b, n - start);
    tracker.begin_micro_batch(0, i, size);
    Tensor loss = ops::cross_entropy(model(d.x.narrow_rows(start, size)), d.y.narrow_rows(start, size),
                                     ops::Reduction::Sum);
    tracker.end_forward();
    acc.backward(loss, size);
    loss = Tensor();
    tracker.end_backward();
    if (acc.ready()) {
      tracker.begin_step();
      acc.step_if_ready();
      tracker.end_step(acc.counters().optimizer_steps, acc.optimizer().state_bytes());
    }
  }
}

class MemoryTrackerTest : public DeviceTest {};

TEST_P(MemoryTrackerTest, ActivationFootprintIsTheAnalyticSumAndLinearInBatch) {
  const Data d = make_data(200, device());
  Generator gen(1);
  models::SeedMLP model(gen, device());
  auto flat = std::make_shared<nn::FlatParameters>(model);
  train::TrainerOptions ao;
  ao.accum_steps = 4;
  train::Trainer acc(std::make_shared<optim::SGD>(flat, optim::SGDOptions{}), ao);
  for (int64_t b : {8, 16, 40}) {
    SCOPED_TRACE("micro-batch " + std::to_string(b));
    memory::MemoryTracker::Options o;
    o.micro_batch_size = b;
    o.accum_steps = 4;
    o.timeline_steps = 0;
    memory::MemoryTracker tracker(device(), o);
    run_tracked(tracker, model, acc, d, b, 5 * b);  // five full micro-batches
    const auto& records = tracker.micro_batches();
    ASSERT_EQ(records.size(), 5u);
    for (const auto& r : records) {
      EXPECT_EQ(r.units, b);
      EXPECT_EQ(r.activation_bytes, seed_mlp_activation_bytes(b, device())) << "micro-batch " << r.index;
      EXPECT_GE(r.peak_bytes, r.activation_bytes);
      EXPECT_GE(r.forward_ms, 0.0);
      EXPECT_GE(r.backward_ms, 0.0);
    }
    // Linear in b: bytes per sample within rounding of the analytic 2*512*4 + 10*4 = 4136.
    const double per_sample = tracker.summary().activation_bytes_per_unit;
    EXPECT_NEAR(per_sample, 4136.0, 3.0 * kRound / static_cast<double>(b));
  }
}

TEST_P(MemoryTrackerTest, KeepsTheFirstRecordsAndSummarizesAll) {
  const Data d = make_data(64, device());
  Generator gen(1);
  models::SeedMLP model(gen, device());
  auto flat = std::make_shared<nn::FlatParameters>(model);
  train::TrainerOptions ao;
  ao.accum_steps = 2;
  train::Trainer acc(std::make_shared<optim::SGD>(flat, optim::SGDOptions{}), ao);
  memory::MemoryTracker::Options o;
  o.micro_batch_size = 8;
  o.accum_steps = 2;
  o.timeline_steps = 0;
  o.max_records = 3;
  memory::MemoryTracker tracker(device(), o);
  run_tracked(tracker, model, acc, d, 8, 64);  // 8 micro-batches, 4 steps
  EXPECT_EQ(tracker.micro_batches().size(), 3u);
  EXPECT_EQ(tracker.micro_batches_seen(), 8);
  EXPECT_EQ(tracker.steps().size(), 3u);
  EXPECT_EQ(tracker.steps_seen(), 4);
  EXPECT_EQ(tracker.last_micro_batch().index, 7);
  EXPECT_EQ(tracker.last_micro_batch().activation_bytes, seed_mlp_activation_bytes(8, device()));
  const auto j = nlohmann::json::parse(memory::memory_report_json(tracker));
  EXPECT_EQ(j["micro_batches"].size(), 3u);
  EXPECT_EQ(j["micro_batches_total"], 8);
  EXPECT_DOUBLE_EQ(tracker.summary().activation_bytes_per_unit,
                   static_cast<double>(seed_mlp_activation_bytes(8, device())) / 8.0);
}

TEST_P(MemoryTrackerTest, FixedCostsAreTheModelSizesAndAccumulationCutsThePeak) {
  const Data d = make_data(256, device());
  auto peak_for = [&](int64_t b, int accum, memory::MemorySummary* out) {
    const MemoryStats before = allocator_for(device()).stats();
    Generator gen(1);
    models::SeedMLP model(gen, device());
    auto flat = std::make_shared<nn::FlatParameters>(model);
    train::TrainerOptions ao;
    ao.accum_steps = accum;
    train::Trainer acc(std::make_shared<optim::AdamW>(flat, optim::AdamWOptions{}), ao);
    memory::MemoryTracker::Options o;
    o.micro_batch_size = b;
    o.accum_steps = accum;
    o.timeline_steps = 0;
    memory::MemoryTracker tracker(device(), o);
    run_tracked(tracker, model, acc, d, b, 128);
    *out = tracker.summary();
    // Exactly the model's flat buffers: 669706 parameters, each slot padded to 64 floats.
    int64_t padded = 0;
    for (const auto& s : flat->slots()) padded += (s.numel + 63) / 64 * 64;
    EXPECT_EQ(flat->num_parameters(), 669706);
    EXPECT_EQ(out->parameters_bytes - before[MemoryCategory::parameters].current, rounded(padded * 4));
    EXPECT_EQ(out->gradients_bytes - before[MemoryCategory::gradients].current, rounded(padded * 4));
    EXPECT_EQ(out->optimizer_state_bytes - before[MemoryCategory::optimizer_state].current,
              acc.optimizer().state_bytes());
    EXPECT_EQ(acc.optimizer().state_bytes(), 2 * rounded(padded * 4));  // AdamW: m and v
    return out->peak_at_micro_batch;
  };
  memory::MemorySummary s16, s64;
  const int64_t peak16 = peak_for(16, 4, &s16);
  const int64_t peak64 = peak_for(64, 1, &s64);
  EXPECT_LT(peak16, peak64) << "accumulation must lower the peak";
  EXPECT_FALSE(s16.effective_batch_measured);
  EXPECT_TRUE(s64.effective_batch_measured);
  // The prediction for 64 x 1 made from the 16 x 4 run is close to what 64 x 1 measured.
  EXPECT_NEAR(static_cast<double>(s16.peak_at_effective_batch), static_cast<double>(s64.peak_at_micro_batch),
              0.02 * static_cast<double>(s64.peak_at_micro_batch));
}

TEST_P(MemoryTrackerTest, ReportsParseAndHoldTheDocumentedFields) {
  const Data d = make_data(128, device());
  Generator gen(1);
  models::SeedMLP model(gen, device());
  auto flat = std::make_shared<nn::FlatParameters>(model);
  train::TrainerOptions ao;
  ao.accum_steps = 4;
  train::Trainer acc(std::make_shared<optim::SGD>(flat, optim::SGDOptions{}), ao);
  memory::MemoryTracker::Options o;
  o.model = "seed_mlp";
  o.micro_batch_size = 16;
  o.accum_steps = 4;
  o.timeline_steps = 2;
  memory::MemoryTracker tracker(device(), o);
  run_tracked(tracker, model, acc, d, 16, 128);

  const auto j = nlohmann::json::parse(memory::memory_report_json(tracker));
  for (const char* k : {"device", "model", "micro_batch_size", "accum_steps", "summary", "micro_batches", "steps"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["model"], "seed_mlp");
  EXPECT_EQ(j["micro_batch_size"], 16);
  for (const char* k : {"parameters_bytes", "gradients_bytes", "optimizer_state_bytes", "workspace_bytes",
                        "outside_allocator_bytes", "context_local_memory_bytes", "data_bytes",
                        "activation_bytes_per_unit", "peak_bytes"})
    EXPECT_TRUE(j["summary"].contains(k)) << k;
  // What the allocator never held (Note [Memory outside the allocator]): on CUDA, unless told not
  // to, at least the context and the libraries' handles, and the stack frames' local memory the
  // context reserves; nothing on the CPU or when told not to.
  const int64_t outside = j["summary"]["outside_allocator_bytes"], local = j["summary"]["context_local_memory_bytes"];
  const char* asked = std::getenv("CUMULUS_CUDA_MEMORY_OUTSIDE");
  if (device().is_cuda() && !(asked != nullptr && std::string(asked) == "0")) {
    EXPECT_GT(outside, 0);
    EXPECT_GT(local, 0);
  } else {
    EXPECT_EQ(outside, 0);
    EXPECT_EQ(local, 0);
  }
  ASSERT_EQ(j["micro_batches"].size(), 8u);
  for (const char* k :
       {"epoch", "index", "units", "activation_bytes", "peak_bytes", "peak_by_category", "forward_ms", "backward_ms"})
    EXPECT_TRUE(j["micro_batches"][0].contains(k)) << k;
  EXPECT_EQ(j["micro_batches"][3]["activation_bytes"], seed_mlp_activation_bytes(16, device()));
  EXPECT_EQ(j["micro_batches"][0]["peak_by_category"].size(), kNumMemoryCategories);
  ASSERT_EQ(j["steps"].size(), 2u);
  for (const auto& s : j["steps"])
    for (const char* k : {"step", "ms", "optimizer_state_bytes"}) EXPECT_TRUE(s.contains(k)) << k;
  EXPECT_EQ(j["steps"][1]["step"], 2);

  // The trace: counters for every category and forward/backward/step slices for the window.
  const auto t = nlohmann::json::parse(memory::memory_trace_json(tracker));
  ASSERT_TRUE(t.contains("traceEvents"));
  int counters = 0, forward = 0, backward = 0, step = 0;
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] == "C") {
      ++counters;
      EXPECT_EQ(e["args"].size(), kNumMemoryCategories);
    }
    if (e["ph"] == "X") {
      forward += e["name"] == "forward";
      backward += e["name"] == "backward";
      step += e["name"] == "step";
      EXPECT_GE(e["dur"].get<double>(), 0.0);
    }
  }
  EXPECT_GT(counters, 8);
  EXPECT_EQ(forward, 8);  // two optimizer steps of four micro-batches
  EXPECT_EQ(backward, 8);
  EXPECT_EQ(step, 2);

  // The SVG: well-formed XML (balanced tags, one root) with one area per category.
  const std::string svg = memory::memory_plot_svg(tracker);
  std::vector<std::string> open;
  int roots = 0, paths = 0;
  for (std::size_t i = svg.find('<'); i != std::string::npos; i = svg.find('<', i + 1)) {
    const std::size_t end = svg.find('>', i);
    ASSERT_NE(end, std::string::npos);
    const std::string tag = svg.substr(i + 1, end - i - 1);
    if (tag[0] == '?') continue;
    if (tag[0] == '/') {
      ASSERT_FALSE(open.empty());
      EXPECT_EQ(open.back(), tag.substr(1));
      open.pop_back();
    } else {
      const std::string name = tag.substr(0, tag.find_first_of(" /"));
      if (open.empty()) ++roots;
      paths += name == "path";
      if (tag.back() != '/') open.push_back(name);
    }
  }
  EXPECT_TRUE(open.empty());
  EXPECT_EQ(roots, 1);
  EXPECT_EQ(paths, static_cast<int>(kNumMemoryCategories));
}

TEST_P(MemoryTrackerTest, BudgetRaisesOutOfMemoryAndThePlannedRunStaysUnder) {
  const Data d = make_data(256, device());
  Generator gen(1);
  models::SeedMLP model(gen, device());
  auto flat = std::make_shared<nn::FlatParameters>(model);
  train::TrainerOptions ao;
  train::Trainer acc(std::make_shared<optim::SGD>(flat, optim::SGDOptions{}), ao);
  CachingAllocator& alloc = allocator_for(device());
  struct LimitGuard {
    CachingAllocator& a;
    ~LimitGuard() { a.set_memory_limit(0); }
  } guard{alloc};

  // The library's planner (its cases are in tests/test_planner.cpp) under a budget of reserved
  // bytes that a micro-batch of 256 exceeds: its plan trains under that budget as the limit.
  plan::PlanRequest request;
  request.device = device();
  request.effective_batch = 256;
  request.micro_batch = [&](int64_t b) {
    ops::cross_entropy(model(d.x.narrow_rows(0, b)), d.y.narrow_rows(0, b), ops::Reduction::Sum).backward();
    flat->mark_gradients_stale();
  };
  request.optimizer = &acc.optimizer();
  {
    // The Trainer's own blocks (its learning-rate table, its loss seed) come with its first
    // micro-batch; the planner sees only what is held and what micro_batch allocates, and the
    // budget below leaves the small pool no room to spare.
    acc.begin_epoch(0, 1);
    acc.backward(ops::cross_entropy(model(d.x.narrow_rows(0, 1)), d.y.narrow_rows(0, 1), ops::Reduction::Sum), 1);
    acc.step_if_ready();
    alloc.empty_cache();
  }
  const plan::Plan unlimited = plan::plan_batch(request);
  ASSERT_EQ(unlimited.table.size(), 9u);
  int64_t budget = 0;
  for (const plan::PlanRow& r : unlimited.table)
    if (r.reserved_bytes < unlimited.table[0].reserved_bytes) {
      budget = r.reserved_bytes;
      break;
    }
  ASSERT_GT(budget, 0);
  request.budget = budget;
  const plan::Plan plan = plan::plan_batch(request);
  EXPECT_GT(plan.micro_batch, 0) << plan.reason;
  EXPECT_LT(plan.micro_batch, 256) << plan.reason;
  EXPECT_EQ(plan.micro_batch * plan.accum_steps, 256);
  EXPECT_TRUE(plan.verified);
  EXPECT_NE(plan.reason.find("micro-batch"), std::string::npos);
  alloc.empty_cache();
  alloc.reset_peak();
  alloc.set_memory_limit(budget);
  {
    memory::MemoryTracker::Options o;
    o.micro_batch_size = plan.micro_batch;
    o.timeline_steps = 0;
    memory::MemoryTracker tracker(device(), o);
    run_tracked(tracker, model, acc, d, plan.micro_batch, 256);
    EXPECT_LE(tracker.summary().peak_bytes, budget);
    EXPECT_LE(alloc.stats().reserved_peak, budget);
  }
  // One batch of 256 does not fit the budget: OutOfMemory names the request and the usage.
  alloc.empty_cache();
  // Announced, so that the Trainer takes it should the limit be met in backward.
  acc.begin_epoch(1, 1);
  try {
    memory::MemoryTracker::Options o;
    o.micro_batch_size = 256;
    o.timeline_steps = 0;
    memory::MemoryTracker tracker(device(), o);
    tracker.begin_micro_batch(0, 0, 256);
    Tensor loss = ops::cross_entropy(model(d.x), d.y, ops::Reduction::Sum);
    acc.backward(loss, 256);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("out of memory on " + device().str()), std::string::npos) << msg;
    EXPECT_NE(msg.find("parameters"), std::string::npos) << msg;
    EXPECT_NE(msg.find("memory limit"), std::string::npos) << msg;
  }
  // Nothing is lost: with the limit lifted the model still trains.
  alloc.set_memory_limit(0);
  Tensor loss = ops::cross_entropy(model(d.x.narrow_rows(0, 16)), d.y.narrow_rows(0, 16), ops::Reduction::Sum);
  EXPECT_TRUE(std::isfinite(loss.item()));
}

CUMULUS_INSTANTIATE_DEVICES(MemoryTrackerTest);

// ---- custom ops (issue 28) -------------------------------------------------------------------------
// A custom op as a user writes it against the public headers, with no memory category in sight:
// y = 2x, computed on the host (any device), its output made by Tensor::from_vector.

class Doubling final : public Node {
 public:
  Doubling() : Node("doubling") {}
  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    if (grads[0].needed()) grads[0].give(times_two(dy));
  }
  static Tensor times_two(const Tensor& x) {
    std::vector<float> v = x.to_vector<float>();
    for (float& e : v) e *= 2.0f;
    return Tensor::from_vector(v, x.shape(), x.device());
  }
};

Tensor doubled(const Tensor& x) {
  Tensor y = Doubling::times_two(x);
  if (should_record({&x})) attach_node(y, std::make_shared<Doubling>(), {&x});
  return y;
}

// An identity op whose output is a view of its input.
class Identity final : public Node {
 public:
  Identity() : Node("identity") {}
  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    if (grads[0].needed()) grads[0].give(dy);
  }
};

class CustomOpMemoryTest : public DeviceTest {};

TEST_P(CustomOpMemoryTest, ACustomOpsOutputIsAnActivation) {
  CachingAllocator& alloc = allocator_for(device());
  Tensor x = Tensor::full({64, 100}, 0.5f, device());
  x.set_requires_grad(true);
  const int64_t bytes = rounded(64 * 100 * 4);
  const MemoryStats before = alloc.stats();
  Tensor y = doubled(x);
  const MemoryStats after = alloc.stats();
  EXPECT_EQ(y.memory_category(), MemoryCategory::activations);
  EXPECT_EQ(after[MemoryCategory::activations].current - before[MemoryCategory::activations].current, bytes);
  EXPECT_EQ(after[MemoryCategory::other].current, before[MemoryCategory::other].current);
  EXPECT_EQ(x.memory_category(), MemoryCategory::other) << "the input is not an activation";
  y = Tensor();
  EXPECT_EQ(alloc.stats()[MemoryCategory::activations].current, before[MemoryCategory::activations].current);

  // Not recorded (no grad mode): an ordinary tensor.
  {
    NoGradGuard no_grad;
    EXPECT_EQ(doubled(x).memory_category(), MemoryCategory::other);
  }
  // An output that is a view of the input keeps the input's category.
  Tensor same = x.detach();
  attach_node(same, std::make_shared<Identity>(), {&x});
  EXPECT_EQ(same.memory_category(), MemoryCategory::other);
  EXPECT_EQ(x.memory_category(), MemoryCategory::other);

  // The tracker counts it in the micro-batch's activation footprint: a Linear keeps it for its
  // weight gradient (the Linear's own output is gone: sum saves nothing), beside the loss scalar.
  Tensor w = Tensor::full({3, 100}, 0.25f, device());
  w.set_requires_grad(true);
  memory::MemoryTracker::Options o;
  o.timeline_steps = 0;
  memory::MemoryTracker tracker(device(), o);
  tracker.begin_micro_batch(0, 0, 64);
  Tensor loss = ops::sum(ops::linear(doubled(x), w, Tensor()));
  tracker.end_forward();
  loss.backward();
  loss = Tensor();
  tracker.end_backward();
  ASSERT_EQ(tracker.micro_batches().size(), 1u);
  EXPECT_EQ(tracker.micro_batches()[0].activation_bytes, bytes + rounded(4));
  EXPECT_EQ(x.grad().to_vector<float>(), std::vector<float>(64 * 100, 2.0f * 3 * 0.25f));
}

CUMULUS_INSTANTIATE_DEVICES(CustomOpMemoryTest);

TEST(Planner, ParsesSizes) {
  EXPECT_EQ(plan::parse_byte_size("1048576"), 1048576);
  EXPECT_EQ(plan::parse_byte_size("64MiB"), 64LL << 20);
  EXPECT_EQ(plan::parse_byte_size("1.5GiB"), 3LL << 29);
  EXPECT_EQ(plan::parse_byte_size("512 KiB"), 512LL << 10);
  EXPECT_EQ(plan::parse_byte_size("2GB"), 2000000000LL);
  for (const char* bad : {"", "abc", "-1MiB", "12XB", "1.5", " 5MiB", "inf"}) {
    try {
      plan::parse_byte_size(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(Planner, CostFromTwoProbes) {
  const plan::MemoryCost c = plan::memory_cost_from_probes(8, 1000 + 8 * 50, 32, 1000 + 32 * 50);
  EXPECT_EQ(c.fixed_bytes, 1000);
  EXPECT_DOUBLE_EQ(c.peak_bytes_per_unit, 50.0);
  EXPECT_EQ(c.predicted_peak(64), 1000 + 64 * 50);
  EXPECT_THROW(plan::memory_cost_from_probes(8, 0, 8, 0), InvalidArgument);
}

}  // namespace
}  // namespace cumulus

// The opt-in settings' reading (engine/core/opt_in.h): a listed value's index, unset or empty as
// unset, and any other value said on stderr and read as unset.
TEST(OptInSetting, ReadsAListedValueAndSaysWhatItIgnores) {
  const char* name = "CUMULUS_TEST_OPT_IN_CHOICE";
  ::unsetenv(name);
  EXPECT_EQ(cumulus::detail::environment_choice(name, {"off", "on"}), -1);
  ::setenv(name, "", 1);
  EXPECT_EQ(cumulus::detail::environment_choice(name, {"off", "on"}), -1);
  ::setenv(name, "on", 1);
  EXPECT_EQ(cumulus::detail::environment_choice(name, {"off", "on"}), 1);
  ::setenv(name, "On", 1);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(cumulus::detail::environment_choice(name, {"off", "on"}), -1);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "cumulus: CUMULUS_TEST_OPT_IN_CHOICE=On is not off or on; ignored\n");
  ::unsetenv(name);
}
