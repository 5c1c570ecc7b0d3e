// Memory prediction from the recorded allocation sequence (Note [Memory prediction]): predicted
// peaks and reserved bytes against real micro-batches of the MLP and the CNN.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <tuple>

#include "cumulus/memory/allocator.h"
#include "cumulus/models/cnn.h"
#include "cumulus/models/mlp.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/ops/loss.h"
#include "engine/plan/prediction.h"
#include "test_util.h"

namespace cumulus {
namespace {

using testing::DeviceTest;

// One training micro-batch as the app runs it: the batch (category data), the model's summed loss
// (on CUDA the fused MLP up to 64 samples), backward into the persistent gradient buffers;
// everything it made is freed on return.
struct Rig {
  Device device;
  std::unique_ptr<nn::Model> model;
  std::unique_ptr<nn::FlatParameters> flat;

  Rig(const std::string& name, Device d) : device(d) {
    Generator gen(3);
    if (name == "cnn") model = std::make_unique<models::CNN>(gen, d);
    else model = std::make_unique<models::SeedMLP>(gen, d);
    flat = std::make_unique<nn::FlatParameters>(*model);
    allocator_for(d).empty_cache();
  }
  void micro_batch(int64_t b) const {
    Tensor x, y;
    {
      MemoryCategoryScope scope(MemoryCategory::data);
      x = Tensor::zeros(Shape{b, 784}, DType::f32, device);
      y = Tensor::zeros(Shape{b}, DType::i32, device);
    }
    Tensor loss = model->loss(x, y, ops::Reduction::Sum);
    loss.backward();
    loss = Tensor();
    flat->mark_gradients_stale();
  }
  // The real peak and reserved of one micro-batch from the state at rest (cache emptied).
  std::pair<int64_t, int64_t> measure(int64_t b) const {
    CachingAllocator& alloc = allocator_for(device);
    alloc.empty_cache();
    alloc.reset_peak();
    micro_batch(b);
    const MemoryStats st = alloc.stats();
    alloc.empty_cache();
    return {st.allocated_peak, st.reserved_peak};
  }
  plan::MemoryPredictor record(std::vector<plan::FixedBlock> fixed = {}) const {
    return plan::record_micro_batch(
        allocator_for(device), [this](int64_t b) { micro_batch(b); }, 128, 256, std::move(fixed));
  }
};

double rel(int64_t predicted, int64_t measured) {
  return static_cast<double>(predicted - measured) / static_cast<double>(measured);
}

class PredictionTest : public DeviceTest {};

void check_model(const std::string& name, Device device, const std::vector<int64_t>& sizes) {
  const Rig rig(name, device);
  const plan::MemoryPredictor p = rig.record();
  ASSERT_TRUE(p.ok()) << p.reason();
  std::printf("%s: %s\n", name.c_str(), p.reason().c_str());
  for (int64_t b : sizes) {
    const plan::PredictedMemory pm = p.predict(b);
    const auto [peak, reserved] = rig.measure(b);
    std::printf(
        "%s B=%lld: peak predicted %lld measured %lld (%+.2f%%), reserved predicted %lld measured %lld "
        "(%+.2f%%)\n",
        name.c_str(), static_cast<long long>(b), static_cast<long long>(pm.peak_bytes), static_cast<long long>(peak),
        100 * rel(pm.peak_bytes, peak), static_cast<long long>(pm.reserved_bytes), static_cast<long long>(reserved),
        100 * rel(pm.reserved_bytes, reserved));
    EXPECT_GE(pm.peak_bytes, peak) << name << " B=" << b;
    EXPECT_GE(pm.reserved_bytes, reserved) << name << " B=" << b;
    EXPECT_LE(std::abs(rel(pm.peak_bytes, peak)), 0.05) << name << " B=" << b;
    EXPECT_LE(std::abs(rel(pm.reserved_bytes, reserved)), 0.05) << name << " B=" << b;
    int64_t sum = 0;
    for (int64_t c : pm.peak_by_category) sum += c;
    EXPECT_EQ(sum, pm.peak_bytes);
  }
}

TEST_P(PredictionTest, MlpPeakAndReservedWithinFivePercent) {
  check_model("mlp", device(), {1, 3, 16, 64, 257, 1024});
}

// The CNN stops at 257 on the CPU: a micro-batch of 1024 holds about 0.5 GB and takes seconds there.
TEST_P(PredictionTest, CnnPeakAndReservedWithinFivePercent) {
  check_model("cnn", device(), device().is_cpu() ? std::vector<int64_t>{1, 3, 16, 64, 257}
                                                 : std::vector<int64_t>{1, 3, 16, 64, 257, 1024});
}

// The small micro-batches, where the convolution's scratch (min(B, c) samples) bends: before the
// piecewise fit, the CNN was over-predicted by up to 121% here.
TEST_P(PredictionTest, CnnSmallMicroBatchesWithinFivePercent) {
  check_model("cnn", device(), {1, 2, 4, 8, 16, 32, 17, 18, 19, 40, 41, 42});
}

TEST_P(PredictionTest, SequencesMatchAndFixedBlocksAreHeld) {
  const Rig rig("mlp", device());
  const plan::MemoryPredictor p = rig.record();
  ASSERT_TRUE(p.ok()) << p.reason();
  // The recorded sequence at a probe size is reproduced exactly.
  const std::vector<plan::MemoryEvent> at =
      plan::record_allocations(allocator_for(device()), [&] { rig.micro_batch(256); });
  const std::vector<plan::MemoryEvent> predicted = p.sequence(256);
  ASSERT_EQ(at.size(), predicted.size());
  for (std::size_t i = 0; i < at.size(); ++i) {
    EXPECT_EQ(at[i].category, predicted[i].category) << i;
    EXPECT_EQ(at[i].alloc, predicted[i].alloc) << i;
    EXPECT_EQ(at[i].bytes, predicted[i].bytes) << i;
  }
  // Optimizer state held through the micro-batch adds its bytes to the peak and its segment to reserved.
  const int64_t state = 8 << 20;
  const plan::MemoryPredictor q = rig.record({plan::FixedBlock{MemoryCategory::optimizer_state, state}});
  const plan::PredictedMemory a = p.predict(64), b = q.predict(64);
  EXPECT_EQ(b.peak_bytes - a.peak_bytes, state);
  EXPECT_EQ(b.peak_by_category[static_cast<std::size_t>(MemoryCategory::optimizer_state)], state);
  EXPECT_GE(b.reserved_bytes - a.reserved_bytes, state);
}

TEST(Prediction, MismatchedSequencesFallBackWithAReason) {
  const std::array<int64_t, kNumMemoryCategories> rest{};
  const std::vector<plan::MemoryEvent> s{{MemoryCategory::activations, true, 512},
                                         {MemoryCategory::activations, false, 512}};
  const std::vector<plan::MemoryEvent> l{{MemoryCategory::activations, true, 1024}};
  const plan::MemoryPredictor p = plan::MemoryPredictor::from_recordings(1, s, 2, l, rest, 0);
  EXPECT_FALSE(p.ok());
  EXPECT_NE(p.reason().find("do not match"), std::string::npos) << p.reason();
  EXPECT_THROW(p.predict(4), InvalidArgument);
  // An affine size: 512 B at 1, 1024 at 2 gives 512 * B; a large one gets its own 2 MiB-rounded segment.
  const std::vector<plan::MemoryEvent> l2{{MemoryCategory::activations, true, 1024},
                                          {MemoryCategory::activations, false, 1024}};
  const plan::MemoryPredictor q = plan::MemoryPredictor::from_recordings(1, s, 2, l2, rest, 0);
  ASSERT_TRUE(q.ok()) << q.reason();
  EXPECT_EQ(q.predict(5000).peak_bytes, 512 * 5000);
  EXPECT_EQ(q.predict(5000).reserved_bytes, 4 << 20);
  EXPECT_EQ(q.predict(3).reserved_bytes, 2 << 20);  // the small pool's segment
}

// A scratch buffer capped in samples (min(B, 10) x 4 KiB, as the CPU convolution's im2col
// columns are) beside an affine one: recorded at 256, 128 and the halvings, the refinement sizes pin
// the bend and every size from 1 to 300 is predicted exactly.
TEST(Prediction, CappedAllocationIsFittedPiecewise) {
  auto events = [](int64_t b) {
    const int64_t capped = std::min<int64_t>(b, 10) * 4096, affine = b * 3072;
    return std::vector<plan::MemoryEvent>{{MemoryCategory::activations, true, affine},
                                          {MemoryCategory::workspace, true, capped},
                                          {MemoryCategory::workspace, false, capped},
                                          {MemoryCategory::activations, false, affine}};
  };
  const std::array<int64_t, kNumMemoryCategories> rest{};
  std::vector<plan::MemoryRecording> recs;
  for (int64_t b = 256; b >= 1; b /= 2) recs.push_back({b, events(b)});
  plan::MemoryPredictor p = plan::MemoryPredictor::from_recordings(recs, rest, 0);
  ASSERT_TRUE(p.ok()) << p.reason();
  EXPECT_EQ(p.piecewise_events(), 1u);
  int rounds = 0;
  for (std::vector<int64_t> more = p.refinement_sizes(); !more.empty(); more = p.refinement_sizes()) {
    ASSERT_LT(++rounds, 10);
    for (int64_t b : more) recs.push_back({b, events(b)});
    p = plan::MemoryPredictor::from_recordings(recs, rest, 0);
    ASSERT_TRUE(p.ok()) << p.reason();
  }
  EXPECT_LE(rounds, 3);  // 12, then 10, then 11 (the bend is between 10 and 11: equal at 10)
  for (int64_t b = 1; b <= 300; ++b)
    ASSERT_EQ(p.predict(b).peak_bytes, b * 3072 + std::min<int64_t>(b, 10) * 4096) << "B=" << b;
}

// A path taken only up to some size (the fused MLP on CUDA, up to 64 samples) records another
// sequence below it: those recordings form a regime of their own, every size is predicted exactly
// on either side, and between the regimes' recorded sizes (65-127), where the switch is not seen,
// the larger of the two predictions (here the generic one's, the truth). One recording that
// matches nothing is still left out.
TEST(Prediction, APathTakenUpToASizeIsARegimeOfItsOwn) {
  using plan::MemoryEvent;
  auto events = [](int64_t b) {
    if (b <= 64)
      return std::vector<MemoryEvent>{{MemoryCategory::activations, true, b * 1024},
                                      {MemoryCategory::activations, false, b * 1024}};
    return std::vector<MemoryEvent>{{MemoryCategory::activations, true, b * 3072},
                                    {MemoryCategory::workspace, true, b * 512},
                                    {MemoryCategory::workspace, false, b * 512},
                                    {MemoryCategory::activations, false, b * 3072}};
  };
  const std::array<int64_t, kNumMemoryCategories> rest{};
  std::vector<plan::MemoryRecording> recs;
  for (int64_t b = 256; b >= 1; b /= 2) recs.push_back({b, events(b)});
  const plan::MemoryPredictor p = plan::MemoryPredictor::from_recordings(recs, rest, 0);
  ASSERT_TRUE(p.ok()) << p.reason();
  ASSERT_NE(p.regime_below(), nullptr) << p.reason();
  EXPECT_NE(p.reason().find("below, a sequence of its own"), std::string::npos) << p.reason();
  for (int64_t b = 1; b <= 300; ++b) ASSERT_EQ(p.predict(b).peak_bytes, b <= 64 ? b * 1024 : b * 3584) << "B=" << b;
  EXPECT_EQ(p.sequence(16).size(), 2u);
  EXPECT_EQ(p.sequence(200).size(), 4u);
  const plan::MemoryPredictor q =
      plan::MemoryPredictor::from_recordings({recs[0], recs[1], recs[2]}, rest, 0);  // 256, 128, 64
  ASSERT_TRUE(q.ok()) << q.reason();
  EXPECT_EQ(q.regime_below(), nullptr);
  EXPECT_NE(q.reason().find("left out, not matching: micro-batch 64"), std::string::npos) << q.reason();
}

// The seed MLP fused up to 64 samples and generic above, as the automatic choice runs it on CUDA
// (forced here on the CPU): predicted on both sides of the switch, exactly but for the regime
// below's 512-B rounding unit (its two largest sizes, 64 and 32, are not multiples of 128: Note
// [Memory prediction]), never under.
TEST(Prediction, TheMlpFusedUpTo64IsPredictedOnBothSides) {
  const Rig rig("mlp", Device::cpu());
  auto& mlp = static_cast<models::SeedMLP&>(*rig.model);
  auto micro_batch = [&](int64_t b) {
    mlp.set_kernels(b <= 64 ? nn::KernelChoice::fused : nn::KernelChoice::generic);
    rig.micro_batch(b);
  };
  CachingAllocator& alloc = allocator_for(Device::cpu());
  const plan::MemoryPredictor p = plan::record_micro_batch(alloc, micro_batch, 128, 256);
  ASSERT_TRUE(p.ok()) << p.reason();
  std::printf("mlp fused up to 64: %s\n", p.reason().c_str());
  EXPECT_NE(p.regime_below(), nullptr) << p.reason();
  for (int64_t b : {1, 3, 16, 64, 128, 200, 256, 300}) {
    alloc.empty_cache();
    alloc.reset_peak();
    micro_batch(b);
    const MemoryStats st = alloc.stats();
    alloc.empty_cache();
    const plan::PredictedMemory pm = p.predict(b);
    EXPECT_GE(pm.peak_bytes, st.allocated_peak) << "B=" << b;
    EXPECT_LE(pm.peak_bytes, st.allocated_peak + 512) << "B=" << b;
    EXPECT_EQ(pm.reserved_bytes, st.reserved_peak) << "B=" << b;
  }
}

// The live blocks the replay rebuilds the state at rest from add up to the bytes held by category.
TEST(Prediction, LiveBlocksAddUpToTheStats) {
  const Rig rig("cnn", Device::cpu());
  CachingAllocator& alloc = allocator_for(Device::cpu());
  std::array<int64_t, kNumMemoryCategories> sum{};
  for (const LiveBlock& b : alloc.live_blocks()) {
    EXPECT_LE(b.offset + b.bytes, b.segment_bytes);
    sum[static_cast<std::size_t>(b.category)] += b.bytes;
  }
  const MemoryStats st = alloc.stats();
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) EXPECT_EQ(sum[c], st.by_category[c].current) << c;
}

// The cheap part of the table in bench/results/2026-11-23-cpu-prediction/ (bench/prediction_table,
// which goes to 4096): every power of two up to 256 and some odd sizes, with AdamW's two copies of
// the parameters held as the planner holds them. Exact on the CPU; the target is 5%.
TEST(Prediction, TableUpTo256WithOptimizerState) {
  for (const std::string name : {"mlp", "cnn"}) {
    const Rig rig(name, Device::cpu());
    const int64_t copy_bytes = static_cast<int64_t>(rig.flat->values().allocated_bytes());
    const plan::MemoryPredictor p =
        rig.record(std::vector<plan::FixedBlock>(2, {MemoryCategory::optimizer_state, copy_bytes}));
    ASSERT_TRUE(p.ok()) << p.reason();
    for (int64_t b : {1, 2, 3, 4, 7, 8, 16, 32, 64, 100, 128, 255, 256}) {
      const plan::PredictedMemory pm = p.predict(b);
      int64_t peak = 0, reserved = 0;
      {
        std::vector<Tensor> state;
        MemoryCategoryScope scope(MemoryCategory::optimizer_state);
        for (int c = 0; c < 2; ++c) state.push_back(Tensor::empty(Shape{copy_bytes / 4}, DType::f32, Device::cpu()));
        std::tie(peak, reserved) = rig.measure(b);
      }
      allocator_for(Device::cpu()).empty_cache();
      EXPECT_LE(std::abs(rel(pm.peak_bytes, peak)), 0.05) << name << " B=" << b;
      EXPECT_LE(std::abs(rel(pm.reserved_bytes, reserved)), 0.05) << name << " B=" << b;
      EXPECT_GE(pm.peak_bytes, peak) << name << " B=" << b;
    }
  }
}

CUMULUS_INSTANTIATE_DEVICES(PredictionTest);

}  // namespace
}  // namespace cumulus
