// The Trainer's CUDA graphs and the host-free CUDA step (Note [Captured training], Note [Device-side
// step]): captured and eager training give the same weights bit for bit (partial micro-batch,
// partial group, SGD with momentum, AdamW, clipping, a non-finite step skipped on the device);
// replays never allocate; the steady state never synchronizes with the host; the memory report
// of a graph run has the categories and fixed costs of an eager one. Each case runs on the CPU
// (eager both times: the same calls must give the plain Trainer's result) and on CUDA.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "cumulus/core/device.h"
#include "cumulus/data/dataset.h"
#include "cumulus/memory/tracker.h"
#include "cumulus/nn/activation_layers.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/layers.h"
#include "cumulus/ops/loss.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/optim/adamw.h"
#include "cumulus/optim/sgd.h"
#include "cumulus/train/trainer.h"
#include "cumulus/train/trainer.h"
#include "test_util.h"

#if CUMULUS_WITH_CUDA
#include "engine/core/cuda_context.h"
#endif

using namespace cumulus;
using cumulus::testing::DeviceTest;

namespace {

constexpr int64_t kSamples = 37, kSide = 4, kClasses = 3;

// u8 images of kSide x kSide pixels, flattened, scaled to [0, 1] as they are gathered, and labels.
data::TensorDataset toy_dataset(const Device& device) {
  Generator gen(5);
  std::vector<float> u(static_cast<std::size_t>(kSamples * kSide * kSide));
  gen.fill_uniform(u.data(), static_cast<int64_t>(u.size()), 0.0f, 255.0f);
  std::vector<uint8_t> pixels(u.size());
  for (std::size_t i = 0; i < u.size(); ++i) pixels[i] = static_cast<uint8_t>(u[i]);
  std::vector<int32_t> labels(kSamples);
  for (int64_t i = 0; i < kSamples; ++i) labels[static_cast<std::size_t>(i)] = static_cast<int32_t>((i * 7) % kClasses);
  data::TensorDataset d({Tensor::from_vector(pixels, Shape{kSamples, kSide * kSide}, device),
                         Tensor::from_vector(labels, Shape{kSamples}, device)},
                        {"images", "labels"});
  d.to_float(0, 255.0f);
  return d;
}

enum class Opt { sgd_momentum_clip, adamw };

struct RunResult {
  std::vector<float> weights;
  int64_t steps = 0, skipped = 0;
  double last_epoch_loss = 0.0;
  train::Trainer::Stats stats;
};

// 3 epochs of 8 micro-batches of 5 (the last holds 2) in groups of 3 (the last holds 2); before
// micro-batch 4 of epoch 1 a bias is set to +inf, so that group's gradient is non-finite and its
// step is skipped on the device; the bias is restored after that step.
RunResult train(const Device& device, Opt opt, bool graphs, memory::MemoryTracker* tracker = nullptr, int epochs = 3,
                bool dropout = false) {
  const data::TensorDataset ds = toy_dataset(device);
  Generator gen(3);
  nn::Sequential model;
  model.add(std::make_shared<nn::Flatten>());
  auto first = std::make_shared<nn::Linear>(kSide * kSide, 8, gen, device);
  model.add(first);
  model.add(std::make_shared<nn::ReLU>());
  if (dropout) model.add(std::make_shared<nn::Dropout>(0.3f, 11));
  model.add(std::make_shared<nn::Linear>(8, kClasses, gen, device));
  auto flat = std::make_shared<nn::FlatParameters>(model);
  std::shared_ptr<optim::Optimizer> optimizer;
  train::TrainerOptions ao;
  ao.accum_steps = 3;
  ao.use_graphs = graphs;
  ao.tracker = tracker;
  if (opt == Opt::adamw) {
    optim::AdamWOptions a;
    a.lr = 0.01f;
    optimizer = std::make_shared<optim::AdamW>(flat, a);
  } else {
    optim::SGDOptions s;
    s.lr = 0.05f;
    s.momentum = 0.9f;
    optimizer = std::make_shared<optim::SGD>(flat, s);
    ao.clip_grad_norm = 0.5f;
  }
  train::Trainer trainer(optimizer, ao);
  const train::Trainer& acc = trainer;
  data::DataLoader loader(ds, 5, /*shuffle=*/true, 9);
  RunResult r;
  float poisoned_value = 0.0f;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    loader.set_epoch(epoch);
    loader.seek(0);
    trainer.begin_epoch(epoch, loader.num_batches());
    for (int64_t i = 0; i < loader.num_batches(); ++i) {
      const bool poison = epoch == 1 && i == 3;
      const float saved = poison ? first->bias().to_vector<float>()[0] : 0.0f;
      if (poison) {
        const float inf = std::numeric_limits<float>::infinity();
        copy_bytes(first->bias().raw_data(), device, &inf, Device::cpu(), sizeof(float));
      }
      const int64_t b = std::min<int64_t>(5, kSamples - i * 5);
      trainer.micro_batch(b, [&] {
        const data::Batch batch = loader.next(i);
        return ops::cross_entropy(model(batch.x), batch.y, ops::Reduction::Sum);
      });
      const bool stepped = trainer.step_if_ready();
      if (poison) poisoned_value = saved;
      if (epoch == 1 && i >= 3 && i < 6 && stepped)  // the poisoned group's step is done: restore
        copy_bytes(first->bias().raw_data(), device, &poisoned_value, Device::cpu(), sizeof(float));
    }
    r.last_epoch_loss = acc.counters().epoch_loss_sum;
  }
  r.weights = flat->values().to_vector<float>();
  r.steps = acc.counters().optimizer_steps;
  r.skipped = acc.counters().skipped_steps;
  r.stats = trainer.stats();
  return r;
}

class TrainerGraphsTest : public DeviceTest {};

TEST_P(TrainerGraphsTest, GraphsGiveTheEagerWeightsBitForBit) {
  for (Opt opt : {Opt::sgd_momentum_clip, Opt::adamw}) {
    const RunResult eager = train(device(), opt, false);
    const RunResult captured = train(device(), opt, device().is_cuda());
    EXPECT_EQ(eager.skipped, 1) << "the poisoned group is skipped";
    EXPECT_EQ(eager.steps, 3 * 3 - 1);
    EXPECT_EQ(captured.steps, eager.steps);
    EXPECT_EQ(captured.skipped, eager.skipped);
    ASSERT_EQ(captured.weights.size(), eager.weights.size());
    EXPECT_EQ(0, std::memcmp(captured.weights.data(), eager.weights.data(), eager.weights.size() * sizeof(float)))
        << "captured and eager weights differ";
    EXPECT_EQ(captured.last_epoch_loss, eager.last_epoch_loss);
    for (float w : eager.weights) ASSERT_TRUE(std::isfinite(w));
    if (device().is_cuda()) {
      EXPECT_GT(captured.stats.replayed_micro_batches, 0);
      EXPECT_GT(captured.stats.replayed_steps, 0);
    } else {
      EXPECT_EQ(captured.stats.replayed_micro_batches, 0);
    }
  }
}

// Note [Dropout offsets on the device]: a replayed micro-batch draws the mask of its own offset, as
// an eager one does, so a model with dropout trains to the eager weights under graphs too (with the
// offset frozen at capture, every replay would repeat one mask).
TEST_P(TrainerGraphsTest, GraphsWithDropoutGiveTheEagerWeightsBitForBit) {
  const RunResult eager = train(device(), Opt::adamw, false, nullptr, 3, /*dropout=*/true);
  const RunResult captured = train(device(), Opt::adamw, device().is_cuda(), nullptr, 3, /*dropout=*/true);
  ASSERT_EQ(captured.weights.size(), eager.weights.size());
  EXPECT_EQ(0, std::memcmp(captured.weights.data(), eager.weights.data(), eager.weights.size() * sizeof(float)))
      << "captured and eager weights differ";
  EXPECT_EQ(captured.last_epoch_loss, eager.last_epoch_loss);
  if (device().is_cuda()) EXPECT_GT(captured.stats.replayed_micro_batches, 0);
}

TEST_P(TrainerGraphsTest, MemoryReportHasTheEagerCategoriesAndFixedCosts) {
  memory::MemoryTracker::Options to;
  to.timeline_steps = 1;
  memory::MemoryTracker eager_tracker(device(), to);
  train(device(), Opt::adamw, false, &eager_tracker, 2);
  const memory::MemorySummary e = eager_tracker.summary();
  memory::MemoryTracker graph_tracker(device(), to);
  const RunResult g = train(device(), Opt::adamw, device().is_cuda(), &graph_tracker, 2);
  const memory::MemorySummary c = graph_tracker.summary();
  EXPECT_EQ(c.parameters_bytes, e.parameters_bytes);
  EXPECT_EQ(c.gradients_bytes, e.gradients_bytes);
  EXPECT_EQ(c.optimizer_state_bytes, e.optimizer_state_bytes);
  EXPECT_EQ(c.workspace_bytes, e.workspace_bytes);
  EXPECT_EQ(c.data_bytes, e.data_bytes);
  EXPECT_DOUBLE_EQ(c.activation_bytes_per_unit, e.activation_bytes_per_unit);
  EXPECT_EQ(graph_tracker.micro_batches_seen(), eager_tracker.micro_batches_seen());
  EXPECT_EQ(graph_tracker.steps_seen(), eager_tracker.steps_seen());
  if (device().is_cuda()) EXPECT_GT(g.stats.replayed_micro_batches, 0);
}

CUMULUS_INSTANTIATE_DEVICES(TrainerGraphsTest);

#if CUMULUS_WITH_CUDA
class GraphCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

// A small model and loop on CUDA, warmed up until every graph exists.
struct Loop {
  Device device = Device::cuda(0);
  data::TensorDataset ds = toy_dataset(device);
  Generator gen{4};
  nn::Sequential model;
  std::shared_ptr<nn::FlatParameters> flat;
  std::shared_ptr<optim::SGD> opt;
  std::unique_ptr<train::Trainer> trainer;
  std::unique_ptr<data::DataLoader> loader;
  Loop() {
    model.add(std::make_shared<nn::Flatten>());
    model.add(std::make_shared<nn::Linear>(kSide * kSide, 8, gen, device));
    model.add(std::make_shared<nn::ReLU>());
    model.add(std::make_shared<nn::Linear>(8, kClasses, gen, device));
    flat = std::make_shared<nn::FlatParameters>(model);
    optim::SGDOptions s;
    s.momentum = 0.9f;
    opt = std::make_shared<optim::SGD>(flat, s);
    train::TrainerOptions ao;
    ao.accum_steps = 2;
    ao.clip_grad_norm = 1.0f;
    ao.use_graphs = true;
    trainer = std::make_unique<train::Trainer>(opt, ao);
    loader = std::make_unique<data::DataLoader>(ds, 4);  // 37 = 9 x 4 + 1
  }
  // Full micro-batches only (32 samples: 4 groups of 2 x 4), from the start of the epoch.
  void epoch_of_full_batches(int epoch) {
    loader->set_epoch(epoch);
    trainer->begin_epoch(epoch, 8);
    for (int64_t i = 0; i < 8; ++i) {
      trainer->micro_batch(4, [&] {
        const data::Batch b = loader->next(i);
        return ops::cross_entropy(model(b.x), b.y, ops::Reduction::Sum);
      });
      trainer->step_if_ready();
    }
  }
};

TEST_F(GraphCudaTest, ReplaysNeverAllocateNorSynchronize) {
  Loop loop;
  loop.epoch_of_full_batches(0);  // eager, then captured: every graph exists afterwards
  loop.epoch_of_full_batches(1);
  CachingAllocator& alloc = allocator_for(loop.device);
  const MemoryStats before = alloc.stats();
  const int64_t syncs = host_synchronizations();
  const auto replayed = loop.trainer->stats().replayed_micro_batches;
  loop.epoch_of_full_batches(2);
  loop.epoch_of_full_batches(3);
  EXPECT_EQ(loop.trainer->stats().replayed_micro_batches, replayed + 16);
  const MemoryStats after = alloc.stats();
  EXPECT_EQ(after.backend_allocs, before.backend_allocs) << "a replay reached cudaMalloc";
  int64_t allocs_before = 0, allocs_after = 0;
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
    allocs_before += before.by_category[c].allocs;
    allocs_after += after.by_category[c].allocs;
  }
  // set_epoch writes its cursor through a small host-to-device copy, nothing else allocates
  EXPECT_EQ(allocs_after, allocs_before) << "replays allocated from the caching allocator";
  EXPECT_EQ(host_synchronizations(), syncs) << "the steady state waited for the device";
  EXPECT_GT(after.graph_pool_reserved, 0);
  EXPECT_EQ(loop.trainer->counters().skipped_steps, 0);
}

TEST_F(GraphCudaTest, AWholeGroupIsCapturableSoNothingSynchronizes) {
  // Capture mode fails any call that would wait for the device, so capturing two micro-batches'
  // backward in one graph, and then replaying the step's device part the Trainer captured in the
  // first epoch, proves the steady state is host-free.
  Loop loop;
  loop.epoch_of_full_batches(0);
  ASSERT_GT(loop.trainer->stats().kernels_per_step, 0) << "the step's device part was captured";
  loop.loader->set_epoch(1);
  loop.trainer->begin_epoch(1, 8);
  cuda::Context& ctx = cuda::context(0);
  cuda::Graph group;
  int64_t k = 0;
  auto one = [&] {
    const data::Batch b = loop.loader->next(k++);
    return ops::cross_entropy(loop.model(b.x), b.y, ops::Reduction::Sum);
  };
  ASSERT_NO_THROW(group = cuda::Graph::capture(ctx, [&] {
    loop.trainer->backward(one(), 4);
    loop.trainer->backward(one(), 4);
  }));
  group.launch();
  const int64_t replayed = loop.trainer->stats().replayed_steps;
  ASSERT_TRUE(loop.trainer->step_if_ready());
  EXPECT_EQ(loop.trainer->stats().replayed_steps, replayed + 1);
  synchronize(loop.device);
  EXPECT_EQ(loop.trainer->counters().optimizer_steps, 5);
}

TEST_F(GraphCudaTest, ASynchronizingClosureFailsTheCaptureWithAClearError) {
  Loop loop;
  cuda::Context& ctx = cuda::context(0);
  const Tensor t = Tensor::zeros(Shape{4}, DType::f32, loop.device);
  try {
    cuda::Graph g = cuda::Graph::capture(ctx, [&] { (void)t.to_vector<float>(); });
    FAIL() << "a copy to the host was captured";
  } catch (const CudaError& e) {
    EXPECT_NE(std::string(e.what()).find("graph capture"), std::string::npos) << e.what();
  }
  // The context and the allocator are usable afterwards.
  EXPECT_EQ(Tensor::full(Shape{3}, 2.0f, loop.device).to_vector<float>(), (std::vector<float>{2, 2, 2}));
}

// A capture that cannot begin (the stream is already capturing) leaves the context out of capture
// mode and the allocator's routing off: the next eager call and the next capture work.
TEST_F(GraphCudaTest, ACaptureThatCannotBeginLeavesNothingBehind) {
  Loop loop;
  cuda::Context& ctx = cuda::context(0);
  (void)Tensor::zeros(Shape{4}, DType::f32, loop.device);  // the context's stream exists
  ASSERT_EQ(cudaStreamBeginCapture(ctx.stream(), cudaStreamCaptureModeRelaxed), cudaSuccess);
  EXPECT_THROW(cuda::Graph::capture(ctx, [] {}), CudaError);
  cudaGraph_t outer = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(ctx.stream(), &outer), cudaSuccess);
  if (outer) cudaGraphDestroy(outer);
  EXPECT_FALSE(ctx.capturing());
  EXPECT_EQ(Tensor::full(Shape{3}, 2.0f, loop.device).to_vector<float>(), (std::vector<float>{2, 2, 2}));
  const Tensor x = Tensor::full(Shape{4}, -1.0f, loop.device);
  Tensor y;
  cuda::Graph g = cuda::Graph::capture(ctx, [&] { y = ops::relu(x); });
  g.launch();
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{0, 0, 0, 0}));
}
#endif

}  // namespace
