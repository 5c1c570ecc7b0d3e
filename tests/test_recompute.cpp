// Activation checkpointing (Note [Recompute] in engine/autograd/checkpoint.cpp):
//  - the MLP and the CNN give the same gradients, weights and batch-norm running statistics with
//    and without recompute, across accumulation (several micro-batches into the persistent
//    buffers, then a step, twice): bit for bit on the CPU;
//  - every way of cutting the CNN into segments (nested, disjoint, the whole network, one layer,
//    a view) gives those same gradients, and an input's gradient flows through a checkpoint;
//  - without a recording forward (no-grad, evaluation) a checkpoint is a plain call;
//  - the activation footprint drops to the analytic bytes of what the forward still keeps, and
//    the tracker's saving, recomputed bytes, report and trace say so; the peak falls.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cumulus/autograd/checkpoint.h"
#include "cumulus/autograd/grad_mode.h"
#include "cumulus/autograd/node.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/memory/report.h"
#include "cumulus/memory/tracker.h"
#include "cumulus/models/cnn.h"
#include "cumulus/models/mlp.h"
#include "cumulus/nn/activation_layers.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/ops/linear.h"
#include "cumulus/ops/loss.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/optim/sgd.h"
#include "cumulus/tensor/random.h"
#include "cumulus/train/trainer.h"
#include "engine/plan/prediction.h"
#include "engine/tensor/tensor_impl.h"
#include "test_util.h"

namespace cumulus {
namespace {

using testing::DeviceTest;
using testing::max_rel_diff;
using testing::memory_table_text;

class RecomputeTest : public DeviceTest {};

struct Batch {
  Tensor x, y;
};

Batch make_batch(int64_t n, uint64_t seed, Device device) {
  Generator g(seed);
  std::vector<float> x(static_cast<std::size_t>(n * 784));
  g.fill_uniform(x.data(), static_cast<int64_t>(x.size()), 0.0f, 1.0f);
  std::vector<int32_t> y(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) y[static_cast<std::size_t>(i)] = static_cast<int32_t>((i * 7) % 10);
  MemoryCategoryScope scope(MemoryCategory::data);
  return {Tensor::from_vector(x, {n, 784}, device), Tensor::from_vector(y, {n}, device)};
}

using Values = std::vector<std::vector<float>>;

// Bit for bit on the CPU. On CUDA the same kernels run on the same inputs too, but a library may
// pick a non-deterministic algorithm (cuDNN's backward filter), so a tight tolerance there.
void expect_same(const Values& a, const Values& b, const Device& device, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (device.is_cpu())
      EXPECT_TRUE(a[i] == b[i]) << what << " #" << i << " differs (max rel " << max_rel_diff(a[i], b[i]) << ")";
    else EXPECT_LT(max_rel_diff(a[i], b[i]), 1e-5) << what << " #" << i;
  }
}

Values gradients_of(const nn::Module& m) {
  Values out;
  for (const Tensor& p : m.parameters()) out.push_back(p.grad().to_vector<float>());
  return out;
}

// Every entry of the state dict as floats (parameters, running statistics, the i32 counters).
Values state_of(const nn::Module& m) {
  Values out;
  for (const auto& [name, t] : m.state_dict()) {
    if (t.dtype() == DType::i32) {
      std::vector<float> v;
      for (int32_t c : t.to_vector<int32_t>()) v.push_back(static_cast<float>(c));
      out.push_back(v);
    } else {
      out.push_back(t.to_vector<float>());
    }
  }
  return out;
}

// What a training run leaves: the flat gradient at the end of each group (before its step) and
// the state after the last step.
struct RunResult {
  Values group_gradients;
  Values final_state;
};

// `groups` optimizer steps of `accum` micro-batches of `b` (SGD with momentum, flat parameters,
// the Trainer), the micro-batches taken in order from `data`.
template <typename Model>
RunResult train(Model& model, const Batch& data, int64_t b, int accum, int groups) {
  auto flat = std::make_shared<nn::FlatParameters>(model);
  optim::SGDOptions so;
  so.lr = 0.05f;
  so.momentum = 0.9f;
  train::TrainerOptions ao;
  ao.accum_steps = accum;
  train::Trainer acc(std::make_shared<optim::SGD>(flat, so), ao);
  acc.begin_epoch(0, static_cast<int64_t>(accum) * groups);
  RunResult out;
  int64_t start = 0;
  for (int g = 0; g < groups; ++g) {
    for (int i = 0; i < accum; ++i, start += b) {
      const Tensor loss =
          ops::cross_entropy(model(data.x.narrow_rows(start, b)), data.y.narrow_rows(start, b), ops::Reduction::Sum);
      acc.backward(loss, b);
    }
    EXPECT_TRUE(acc.ready());
    out.group_gradients.push_back(flat->gradients().template to_vector<float>());
    acc.step_if_ready();
  }
  out.final_state = state_of(model);
  return out;
}

TEST_P(RecomputeTest, MlpGivesTheSameGradientsAndWeightsAcrossAccumulation) {
  const Batch data = make_batch(96, 11, device());
  Generator gen_stored(5), gen_recomputed(5);
  models::SeedMLP stored(gen_stored, device()), recomputed(gen_recomputed, device());
  recomputed.set_recompute(true);
  ASSERT_TRUE(recomputed.recompute());
  ASSERT_FALSE(stored.recompute());
  take_recompute_log();
  const RunResult a = train(stored, data, 16, 3, 2);
  EXPECT_EQ(take_recompute_log().segments_recomputed, 0) << "recompute is off by default";
  const RunResult b = train(recomputed, data, 16, 3, 2);
  const RecomputeLog log = take_recompute_log();
  EXPECT_EQ(log.segments_recorded, 6);
  EXPECT_EQ(log.segments_recomputed, 6);
  expect_same(a.group_gradients, b.group_gradients, device(), "flat gradient at a group's end");
  expect_same(a.final_state, b.final_state, device(), "weights after two steps");
}

TEST_P(RecomputeTest, CnnGivesTheSameGradientsWeightsAndRunningStatisticsAcrossAccumulation) {
  const Batch data = make_batch(48, 12, device());
  Generator gen_stored(6), gen_recomputed(6);
  models::CNN stored(gen_stored, device()), recomputed(gen_recomputed, device());
  recomputed.set_recompute(true);
  EXPECT_TRUE(recomputed.recompute_segments() == models::CNN::recompute_segments_default());
  take_recompute_log();
  const RunResult a = train(stored, data, 8, 3, 2);
  const RunResult b = train(recomputed, data, 8, 3, 2);
  const RecomputeLog log = take_recompute_log();
  // Per micro-batch: [conv, batch norm] of each block, recorded in forward, recomputed in backward.
  EXPECT_EQ(log.segments_recomputed, 6 * 2);
  EXPECT_EQ(log.segments_recorded, 6 * 2);
  expect_same(a.group_gradients, b.group_gradients, device(), "flat gradient at a group's end");
  expect_same(a.final_state, b.final_state, device(), "state dict after two steps");
  // Six training forwards each, not more: the recomputations left the counters alone.
  EXPECT_EQ(recomputed.state_dict()[6].second.to_vector<int32_t>(), std::vector<int32_t>{6});
  EXPECT_EQ(recomputed.state_dict()[13].second.to_vector<int32_t>(), std::vector<int32_t>{6});

  // Turned off again: the stored path, and still the same numbers from here on.
  recomputed.set_recompute(false);
  EXPECT_FALSE(recomputed.recompute());
}

// Mixed precision (16-bit batches, so 16-bit activations): a checkpoint's recomputation starts
// at a 16-bit leaf, and the gradients are the stored path's. `--recompute on --precision bf16`
// failed with "only f32 tensors can require grad" until 16-bit leaves could require grad.
TEST_P(RecomputeTest, SixteenBitActivationsRecomputeToTheSameGradients) {
  for (DType dtype : {DType::bf16, DType::f16}) {
    Batch data = make_batch(24, 14, device());
    data.x = data.x.to(dtype);
    Generator cnn_a(6), cnn_b(6), mlp_a(2), mlp_b(2);
    models::CNN cnn_stored(cnn_a, device()), cnn_recomputed(cnn_b, device());
    models::SeedMLP mlp_stored(mlp_a, device()), mlp_recomputed(mlp_b, device());
    cnn_recomputed.set_recompute(true);
    mlp_recomputed.set_recompute(true);
    take_recompute_log();
    const RunResult cnn = train(cnn_stored, data, 8, 3, 1), cnn_again = train(cnn_recomputed, data, 8, 3, 1);
    const RunResult mlp = train(mlp_stored, data, 8, 3, 1), mlp_again = train(mlp_recomputed, data, 8, 3, 1);
    EXPECT_EQ(take_recompute_log().segments_recomputed, 3 * 2 + 3) << dtype_name(dtype);
    expect_same(cnn.group_gradients, cnn_again.group_gradients, device(), std::string("CNN ") + dtype_name(dtype));
    expect_same(mlp.group_gradients, mlp_again.group_gradients, device(), std::string("MLP ") + dtype_name(dtype));
  }
}

// A 16-bit leaf's gradient is of its type: the cross-entropy of bf16 logits x, summed, has the
// gradient softmax(x) - onehot(label), to bf16's precision.
TEST_P(RecomputeTest, ASixteenBitLeafGetsAGradientOfItsType) {
  const std::vector<float> logits{1.0f, -2.0f, 0.5f, 3.0f};
  Tensor x = Tensor::from_vector(logits, {2, 2}, device()).to(DType::bf16);
  x.set_requires_grad(true);
  const Tensor labels = Tensor::from_vector(std::vector<int32_t>{0, 1}, {2}, device());
  ops::cross_entropy(x, labels, ops::Reduction::Sum).backward();
  ASSERT_EQ(x.grad().dtype(), DType::bf16);
  const std::vector<float> got = x.grad().to(DType::f32).to_vector<float>();
  for (int row = 0; row < 2; ++row) {
    const double a = logits[2 * row], b = logits[2 * row + 1];
    const double p0 = 1.0 / (1.0 + std::exp(b - a));
    const double want[2] = {p0 - (row == 0 ? 1.0 : 0.0), (1.0 - p0) - (row == 1 ? 1.0 : 0.0)};
    for (int k = 0; k < 2; ++k) EXPECT_NEAR(got[2 * row + k], want[k], 1e-2) << row << "," << k;
  }
  EXPECT_THROW(Tensor::zeros(Shape{2}, DType::i32, device()).set_requires_grad(true), InvalidArgument);
}

TEST_P(RecomputeTest, EverySegmentationOfTheCnnGivesTheSameGradients) {
  const Batch data = make_batch(6, 13, device());
  auto run = [&](const std::vector<nn::LayerRange>& segments) {
    Generator gen(7);
    models::CNN model(gen, device());
    model.set_recompute(segments);
    ops::cross_entropy(model(data.x), data.y, ops::Reduction::Sum).backward();
    Values out = gradients_of(model);
    for (const Values& v : {state_of(model)}) out.insert(out.end(), v.begin(), v.end());
    return out;
  };
  const Values stored = run({});
  const std::vector<std::pair<std::string, std::vector<nn::LayerRange>>> cuts = {
      {"blocks", {{0, 4}, {4, 8}}},
      {"conv + batch norm", {{0, 2}, {4, 6}}},
      {"the default", models::CNN::recompute_segments_default()},
      {"blocks with [conv, batch norm] nested", {{0, 4}, {0, 2}, {4, 8}, {4, 6}}},
      {"the whole network", {{0, 12}}},
      {"the whole network around the blocks", {{0, 12}, {0, 4}, {4, 8}, {1, 3}}},
      {"the head", {{8, 12}}},
      {"one conv", {{0, 1}}},
      {"flatten alone (a view)", {{8, 9}}},
      {"one ReLU", {{2, 3}}},
      {"every layer",
       {{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}, {5, 6}, {6, 7}, {7, 8}, {8, 9}, {9, 10}, {10, 11}, {11, 12}}},
  };
  for (const auto& [name, segments] : cuts) expect_same(stored, run(segments), device(), name);
}

TEST_P(RecomputeTest, InputGradientsFlowThroughACheckpoint) {
  const Batch data = make_batch(4, 14, device());
  // inner: the checkpoint's input is made by an op (its gradient goes to the engine's pending
  // slot); otherwise it is the leaf itself (its gradient goes to the leaf's buffer). An identity
  // checkpoint passes a tensor through. A second backward accumulates into the input's buffer.
  auto run = [&](bool recompute, bool inner) {
    Generator gen(8);
    nn::Sequential stack;
    stack.add(std::make_shared<nn::Linear>(784, 32, gen, device()))
        .add(std::make_shared<nn::ReLU>())
        .add(std::make_shared<nn::Linear>(32, 10, gen, device()));
    if (recompute) stack.set_recompute({{0, 2}});
    Tensor x = data.x.clone();
    x.set_requires_grad(true);
    const Tensor h = inner ? ops::relu(x) : x;
    const Tensor through = recompute ? checkpoint([](const Tensor& t) { return t; }, h, {}) : h;
    ops::cross_entropy(stack(through), data.y, ops::Reduction::Sum).backward();
    ops::sum(ops::relu(x)).backward();
    Values out = gradients_of(stack);
    out.push_back(x.grad().to_vector<float>());
    return out;
  };
  for (bool inner : {false, true})
    expect_same(run(false, inner), run(true, inner), device(),
                std::string("gradients, the input's last; input ") + (inner ? "made by an op" : "a leaf"));
}

// Data parallel training starts reducing a parameter's gradient when the backward engine reports
// the leaf finished (run_backward's on_leaf_done). A checkpoint's node has an edge to every
// parameter of its segment, so each is reported once, after the recomputation wrote its gradient.
TEST_P(RecomputeTest, FinishedLeavesAreReportedAfterTheirRecomputedGradients) {
  const Batch data = make_batch(4, 19, device());
  auto run = [&](bool recompute) {
    Generator gen(10);
    models::CNN model(gen, device());
    model.set_recompute(recompute);
    std::map<const TensorImpl*, std::vector<float>> at_report;
    const Tensor loss = ops::cross_entropy(model(data.x), data.y, ops::Reduction::Sum);
    run_backward(loss, 1.0f, [&](const TensorImpl* leaf) {
      for (const Tensor& p : model.parameters())
        if (impl_of(p).get() == leaf) {
          EXPECT_EQ(at_report.count(leaf), 0u) << "a leaf reported twice";
          at_report[leaf] = p.grad().to_vector<float>();
        }
    });
    Values reported, final_grads = gradients_of(model);
    for (const Tensor& p : model.parameters()) {
      EXPECT_EQ(at_report.count(impl_of(p).get()), 1u) << "a parameter never reported";
      reported.push_back(at_report[impl_of(p).get()]);
    }
    expect_same(reported, final_grads, device(), "gradient when reported vs at the end");
    return final_grads;
  };
  expect_same(run(false), run(true), device(), "gradients");
}

TEST_P(RecomputeTest, WithoutARecordingForwardACheckpointIsAPlainCall) {
  const Batch data = make_batch(5, 15, device());
  Generator gen_a(9), gen_b(9);
  models::CNN plain(gen_a, device()), recomputed(gen_b, device());
  recomputed.set_recompute(true);
  take_recompute_log();
  {
    NoGradGuard no_grad;
    const Tensor y = recomputed(data.x);
    EXPECT_FALSE(y.requires_grad());
    expect_same({plain(data.x).to_vector<float>()}, {y.to_vector<float>()}, device(), "no-grad output");
  }
  plain.eval();
  recomputed.eval();
  const Tensor y = recomputed(data.x);
  EXPECT_TRUE(y.requires_grad()) << "evaluation mode still records (parameters require grad)";
  expect_same({plain(data.x).to_vector<float>()}, {y.to_vector<float>()}, device(), "evaluation output");
  EXPECT_EQ(take_recompute_log().segments_recorded, 2) << "only the recording forward checkpoints";
  EXPECT_FALSE(recomputing());
}

TEST(RecomputeSegments, BadSegmentsAreRefusedWithTheirRange) {
  Generator gen(1);
  models::CNN model(gen);
  auto refused = [&](std::vector<nn::LayerRange> segments, const std::string& says) {
    try {
      model.set_recompute(std::move(segments));
      ADD_FAILURE() << "accepted; expected: " << says;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused({{2, 2}}, "segment [2, 2) is not a non-empty range of the 12 layers");
  refused({{0, 13}}, "segment [0, 13) is not a non-empty range");
  refused({{0, 4}, {2, 6}}, "segments [0, 4) and [2, 6) overlap");
  refused({{4, 8}, {4, 8}}, "segment [4, 8) is given twice");
  EXPECT_TRUE(model.recompute_segments().empty()) << "a refused list leaves the model as it was";
  model.set_recompute({{4, 8}, {0, 4}, {0, 2}});
  const std::vector<nn::LayerRange> sorted{{0, 4}, {0, 2}, {4, 8}};
  EXPECT_TRUE(model.recompute_segments() == sorted);
}

// ---- the footprint -----------------------------------------------------------------------------

constexpr int64_t kRound = CachingAllocator::kRounding;
int64_t rounded(int64_t bytes) { return (bytes + kRound - 1) / kRound * kRound; }

// The CNN's tensors at micro-batch b (f32 bytes), as in test_cnn.cpp's analytic footprint.
struct CnnTensors {
  int64_t c1, r1, p1, c2, r2, p2, r3, logits, row_stats, loss, stats1, stats2;
  CnnTensors(int64_t b, Device device)
      : c1(rounded(b * 32 * 28 * 28 * 4)),
        r1(c1),
        p1(rounded(b * 32 * 14 * 14 * 4)),
        c2(rounded(b * 64 * 14 * 14 * 4)),
        r2(c2),
        p2(rounded(b * 64 * 7 * 7 * 4)),
        r3(rounded(b * 128 * 4)),
        logits(rounded(b * 10 * 4)),
        row_stats(device.is_cpu() ? rounded(b * 2 * 4) : 0),
        loss(rounded(4)),
        stats1(2 * rounded(32 * 4)),
        stats2(2 * rounded(64 * 4)) {}
  // Stored: c1 and bn1's statistics, r1, p1, c2 and bn2's statistics, r2, p2, r3, the logits (and on
  // the CPU cross_entropy's row statistics), the loss.
  int64_t stored() const { return c1 + stats1 + r1 + p1 + c2 + stats2 + r2 + p2 + r3 + logits + row_stats + loss; }
  // With the default segments ([conv, batch norm] of each block) the forward no longer keeps the
  // conv outputs and the batch norms' statistics; the input is the dataset's (category data).
  int64_t recomputed_footprint() const { return r1 + p1 + r2 + p2 + r3 + logits + row_stats + loss; }
  // What the recomputations hold at the end of their forwards, summed: c1, bn1's statistics and
  // its output b1 (the size of r1; the ReLU after it reads it and saves its own output), and the
  // same for block 2.
  int64_t recomputed_bytes() const { return (c1 + stats1 + r1) + (c2 + stats2 + r2); }
};

memory::MemoryTracker::Options tracker_options(const std::string& model, int timeline_steps) {
  memory::MemoryTracker::Options o;
  o.model = model;
  o.micro_batch_size = 5;
  o.accum_steps = 2;
  o.timeline_steps = timeline_steps;
  return o;
}

// Runs micro-batches of sizes `sizes` (`per_size` each, stepping every 2) under a tracker; returns
// each micro-batch's record.
template <typename Model>
std::vector<memory::MicroBatchRecord> tracked_run(Model& model, memory::MemoryTracker& tracker, const Batch& data,
                                                  const std::vector<int64_t>& sizes, int64_t per_size) {
  auto flat = std::make_shared<nn::FlatParameters>(model);
  train::TrainerOptions ao;
  ao.accum_steps = 2;
  train::Trainer acc(std::make_shared<optim::SGD>(flat, optim::SGDOptions{}), ao);
  std::vector<memory::MicroBatchRecord> out;
  for (int64_t b : sizes) {
    acc.begin_epoch(0, per_size);
    for (int64_t i = 0; i < per_size; ++i) {
      tracker.begin_micro_batch(0, i, b);
      Tensor loss =
          ops::cross_entropy(model(data.x.narrow_rows(i * b, b)), data.y.narrow_rows(i * b, b), ops::Reduction::Sum);
      tracker.end_forward();
      acc.backward(loss, b);
      loss = Tensor();
      tracker.end_backward();
      if (acc.ready()) {
        tracker.begin_step();
        acc.step_if_ready();
        tracker.end_step(acc.counters().optimizer_steps, acc.optimizer().state_bytes());
      }
      out.push_back(tracker.last_micro_batch());
    }
  }
  return out;
}

TEST_P(RecomputeTest, CnnActivationFootprintDropsToWhatTheForwardKeeps) {
  const Batch data = make_batch(40, 16, device());
  const std::vector<int64_t> sizes{1, 2, 5};
  Generator gen_a(2), gen_b(2);
  models::CNN stored(gen_a, device()), recomputed(gen_b, device());
  recomputed.set_recompute(true);
  memory::MemoryTracker stored_tracker(device(), tracker_options("cnn", 0));
  const auto stored_records = tracked_run(stored, stored_tracker, data, sizes, 4);
  memory::MemoryTracker tracker(device(), tracker_options("cnn", 2));
  const auto records = tracked_run(recomputed, tracker, data, sizes, 4);
  ASSERT_EQ(records.size(), stored_records.size());
  const bool cuda = device().is_cuda();
  for (std::size_t i = 0; i < records.size(); ++i) {
    const memory::MicroBatchRecord &r = records[i], &s = stored_records[i];
    const CnnTensors t(r.units, device());
    SCOPED_TRACE("micro-batch " + std::to_string(i) + " of " + std::to_string(r.units));
    EXPECT_EQ(s.activation_bytes, t.stored()) << "the stored footprint (test_cnn.cpp's analytic sum)";
    EXPECT_EQ(r.activation_bytes, t.recomputed_footprint());
    EXPECT_EQ(r.activation_bytes + r.recompute_avoided_bytes, s.activation_bytes)
        << "the tracker's saving is exactly the difference to the stored run";
    // Pinned on the CPU; on CUDA the same sum is expected but has not been run yet.
    if (!cuda) {
      EXPECT_EQ(r.recomputed_bytes, t.recomputed_bytes());
    }
    EXPECT_EQ(r.recompute_segments, 2);
    EXPECT_EQ(s.recompute_segments, 0);
    EXPECT_EQ(s.recompute_avoided_bytes, 0);
    // cuDNN's workspaces may set the peak of tiny micro-batches on CUDA (not measured yet).
    if (cuda) EXPECT_LE(r.peak_bytes, s.peak_bytes);
    else EXPECT_LT(r.peak_bytes, s.peak_bytes);
  }
  EXPECT_EQ(allocator_for(device()).stats()[MemoryCategory::activations].current, 0)
      << "backward released every saved and recomputed tensor";
  // The recompute time is part of backward.
  for (const memory::MicroBatchRecord& r : tracker.micro_batches()) {
    EXPECT_GT(r.recompute_ms, 0.0);
    EXPECT_LE(r.recompute_ms, r.backward_ms);
  }

  // The reports say it: the summary's recompute object, the records' fields, the trace's slices,
  // the table's line; a stored run's report has none of them.
  const auto j = nlohmann::json::parse(memory::memory_report_json(tracker));
  ASSERT_TRUE(j["summary"].contains("recompute")) << j["summary"].dump();
  const auto& rj = j["summary"]["recompute"];
  const CnnTensors t5(5, device());
  EXPECT_EQ(rj["segments_per_micro_batch"].get<int64_t>(), 2);
  EXPECT_EQ(rj["activation_bytes"].get<int64_t>(), t5.recomputed_footprint());
  EXPECT_EQ(rj["activation_bytes_without_recompute"].get<int64_t>(), stored_records.back().activation_bytes);
  EXPECT_EQ(rj["saved_bytes"].get<int64_t>(), stored_records.back().activation_bytes - t5.recomputed_footprint());
  EXPECT_GT(rj["recompute_share_of_backward"].get<double>(), 0.0);
  EXPECT_LT(rj["recompute_share_of_backward"].get<double>(), 1.0);
  EXPECT_EQ(j["micro_batches"][0]["recompute_segments"].get<int64_t>(), 2);
  const auto stored_json = nlohmann::json::parse(memory::memory_report_json(stored_tracker));
  EXPECT_FALSE(stored_json["summary"].contains("recompute"));
  EXPECT_FALSE(stored_json["micro_batches"][0].contains("recompute_segments"));

  const auto trace = nlohmann::json::parse(memory::memory_trace_json(tracker));
  int recompute_events = 0;
  for (const auto& e : trace["traceEvents"])
    if (e["name"] == "recompute") {
      ++recompute_events;
      EXPECT_GT(e["args"]["recomputed_bytes"].get<int64_t>(), 0);
    }
  // The timeline covers the first 2 optimizer steps: 4 micro-batches of 2 recomputations each.
  EXPECT_EQ(recompute_events, 8);

  const std::string table = memory_table_text(tracker);
  EXPECT_NE(table.find("recompute on: 2 segments per micro-batch"), std::string::npos) << table;
}

// Note [CNN recompute segments] in models/cnn.cpp: stored, the peak above the fixed costs
// is four tensors of conv1's output size (relu1's backward); with the default segments, three.
TEST_P(RecomputeTest, CnnPeakFallsFromFourToThreeConvOutputs) {
  if (device().is_cuda()) GTEST_SKIP() << "the CPU kernels' working sets; cuDNN's have not been measured";
  const int64_t b = 128;
  const Batch data = make_batch(2 * b, 18, device());
  auto variable_peak = [&](bool recompute) {
    Generator gen(4);
    models::CNN model(gen, device());
    model.set_recompute(recompute);
    memory::MemoryTracker tracker(device(), tracker_options("cnn", 0));
    const memory::MicroBatchRecord r = tracked_run(model, tracker, data, {b}, 2).back();
    int64_t fixed = 0;
    for (MemoryCategory c :
         {MemoryCategory::parameters, MemoryCategory::gradients, MemoryCategory::optimizer_state, MemoryCategory::data})
      fixed += r.peak_by_category[static_cast<std::size_t>(c)];
    return r.peak_bytes - fixed;
  };
  const int64_t c1 = CnnTensors(b, device()).c1;
  const int64_t stored = variable_peak(false), recomputed = variable_peak(true);
  std::printf("variable peak at %lld: stored %.2f c1, recompute %.2f c1\n", static_cast<long long>(b),
              double(stored) / double(c1), double(recomputed) / double(c1));
  EXPECT_GE(stored, 4 * c1);
  EXPECT_LT(stored, 4 * c1 + c1 / 2);
  EXPECT_GE(recomputed, 3 * c1);
  EXPECT_LT(recomputed, 3 * c1 + c1 / 2);
}

// A planner can weigh recompute before running it: the recorded-sequence predictor
// (Note [Memory prediction]) foresees the recomputing CNN's peak as well as the stored one's, so
// recording both and comparing the largest micro-batch that fits tells whether recompute is
// needed (the app's planner: choose it only then).
TEST_P(RecomputeTest, ThePredictorForeseesTheRecomputedPeak) {
  auto predictor_and_measure = [&](bool recompute, int64_t b) {
    Generator gen(3);
    models::CNN model(gen, device());
    model.set_recompute(recompute);
    nn::FlatParameters flat(model);
    CachingAllocator& alloc = allocator_for(device());
    auto micro_batch = [&](int64_t n) {
      Tensor x, y;
      {
        MemoryCategoryScope scope(MemoryCategory::data);
        x = Tensor::zeros(Shape{n, 784}, DType::f32, device());
        y = Tensor::zeros(Shape{n}, DType::i32, device());
      }
      ops::cross_entropy(model(x), y, ops::Reduction::Sum).backward();
      flat.mark_gradients_stale();
    };
    alloc.empty_cache();
    const plan::MemoryPredictor p = plan::record_micro_batch(alloc, micro_batch, 128, 256);
    EXPECT_TRUE(p.ok()) << p.reason();
    alloc.empty_cache();
    alloc.reset_peak();
    micro_batch(b);
    const int64_t measured = alloc.stats().allocated_peak;
    alloc.empty_cache();
    return std::pair<int64_t, int64_t>{p.ok() ? p.predict(b).peak_bytes : 0, measured};
  };
  for (int64_t b : {64, 200}) {
    const auto [stored_predicted, stored_measured] = predictor_and_measure(false, b);
    const auto [predicted, measured] = predictor_and_measure(true, b);
    SCOPED_TRACE("micro-batch " + std::to_string(b));
    EXPECT_NEAR(double(predicted), double(measured), 0.05 * double(measured));
    EXPECT_NEAR(double(stored_predicted), double(stored_measured), 0.05 * double(stored_measured));
    EXPECT_LT(predicted, stored_predicted);
  }
}

TEST_P(RecomputeTest, MlpFootprintDropsByTheFirstReluOutput) {
  const Batch data = make_batch(24, 17, device());
  Generator gen_a(3), gen_b(3);
  models::SeedMLP stored(gen_a, device()), recomputed(gen_b, device());
  recomputed.set_recompute(true);
  memory::MemoryTracker stored_tracker(device(), tracker_options("mlp", 0));
  memory::MemoryTracker tracker(device(), tracker_options("mlp", 0));
  const auto s = tracked_run(stored, stored_tracker, data, {3, 5}, 2);
  const auto r = tracked_run(recomputed, tracker, data, {3, 5}, 2);
  for (std::size_t i = 0; i < r.size(); ++i) {
    const int64_t b = r[i].units;
    // Stored: both ReLU outputs [b, 512], the logits (and on the CPU cross_entropy's row statistics),
    // the loss. Recomputed: the first output goes.
    const int64_t loss_bytes = rounded(b * 10 * 4) + (device().is_cpu() ? rounded(b * 2 * 4) : 0) + rounded(4);
    EXPECT_EQ(s[i].activation_bytes, 2 * rounded(b * 512 * 4) + loss_bytes);
    EXPECT_EQ(r[i].activation_bytes, rounded(b * 512 * 4) + loss_bytes);
    EXPECT_EQ(r[i].recompute_avoided_bytes, rounded(b * 512 * 4));
    EXPECT_EQ(r[i].recompute_segments, 1);
  }
}

CUMULUS_INSTANTIATE_DEVICES(RecomputeTest);

}  // namespace
}  // namespace cumulus
