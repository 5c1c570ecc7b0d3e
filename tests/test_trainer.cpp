// The training API (train::Trainer, Note [Training API] in engine/train/trainer.cpp): eager, its
// micro_batch is backward(loss, units) driven by hand, bit for bit; set_accum_steps mid-run keeps
// the optimizer's step count and the LR schedule's position (a new Trainer would restart both), is
// deferred to the group boundary, outlives the per-epoch schedule and survives a checkpoint; the memory tracker's
// records appear without a call of the user's; train_epoch is the user's own loop over a DataLoader
// and evaluate_classifier a test pass. CUDA graphs are covered by test_graphs.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cumulus/autograd/grad_mode.h"
#include "cumulus/data/dataset.h"
#include "cumulus/memory/tracker.h"
#include "cumulus/nn/activation_layers.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/layers.h"
#include "cumulus/ops/loss.h"
#include "cumulus/ops/shape.h"
#include "cumulus/optim/adamw.h"
#include "cumulus/optim/lr_schedule.h"
#include "cumulus/train/trainer.h"
#include "cumulus/tensor/random.h"
#include "cumulus/train/trainer.h"
#include "test_util.h"

namespace cumulus {
namespace {

using testing::DeviceTest;

constexpr int64_t kRows = 94, kFeatures = 6, kClasses = 3, kBatch = 4;
constexpr int64_t kMicroBatches = 24;  // an epoch: 23 micro-batches of 4 and one of 2

// A model of the test's own: Linear-ReLU-Linear on a fixed synthetic problem, AdamW with clipping
// and warmup + cosine. Two of these start from the same weights.
struct Problem {
  explicit Problem(Device device) : device(device) {
    Generator gen(11);
    x = uniform({kRows, kFeatures}, -1.0f, 1.0f, gen, device);
    std::vector<int32_t> labels(kRows);
    for (int64_t i = 0; i < kRows; ++i) labels[static_cast<std::size_t>(i)] = static_cast<int32_t>((i * 5) % kClasses);
    y = Tensor::from_vector(labels, {kRows}, device);
    model.add(std::make_shared<nn::Linear>(kFeatures, 8, gen, device));
    model.add(std::make_shared<nn::ReLU>());
    model.add(std::make_shared<nn::Linear>(8, kClasses, gen, device));
    flat = std::make_shared<nn::FlatParameters>(model);
    optim::AdamWOptions a;
    a.lr = 0.02f;
    optimizer = std::make_shared<optim::AdamW>(flat, a);
    options.clip_grad_norm = 0.5f;
  }
  int64_t samples(int64_t i) const { return std::min(kBatch, kRows - i * kBatch); }
  Tensor loss(int64_t i) {
    return ops::cross_entropy(model(x.narrow_rows(i * kBatch, samples(i))), y.narrow_rows(i * kBatch, samples(i)),
                              ops::Reduction::Sum);
  }
  std::vector<float> weights() const { return flat->values().to_vector<float>(); }

  Device device;
  Tensor x, y;
  nn::Sequential model;
  std::shared_ptr<nn::FlatParameters> flat;
  std::shared_ptr<optim::Optimizer> optimizer;
  train::TrainerOptions options;
  std::shared_ptr<const optim::LRSchedule> schedule = std::make_shared<optim::CosineWarmupLR>(0.02f, 3, 20, 0.002f);
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// What each optimizer step reports: the micro-batches in its group, the step count after it and
// the learning rate it used.
struct StepLog {
  std::vector<int> group;
  std::vector<int64_t> steps;
  std::vector<float> lr;
  // `driver`: a Trainer driven through micro_batch, or one a reference drives by backward.
  template <class Driver>
  void add(int group_size, const Driver& driver) {
    group.push_back(group_size);
    steps.push_back(driver.counters().optimizer_steps);
    lr.push_back(driver.counters().last_lr);
  }
};

class TrainerTest : public DeviceTest {};

// Both drive the same micro-batches (with a set_accum_steps mid-epoch, at an empty group); the
// micro_batch without graphs must be backward's calls, nothing added or reordered.
TEST_P(TrainerTest, WithoutGraphsMicroBatchIsBackwardDrivenByHandBitForBit) {
  Problem by_hand(device()), with_trainer(device());
  by_hand.options.accum_steps = with_trainer.options.accum_steps = 3;
  train::Trainer acc(by_hand.optimizer, by_hand.options, by_hand.schedule);
  train::Trainer trainer(with_trainer.optimizer, with_trainer.options, with_trainer.schedule);
  ASSERT_TRUE(same_bits(by_hand.weights(), with_trainer.weights()));
  for (int epoch = 0; epoch < 2; ++epoch) {
    acc.begin_epoch(epoch, kMicroBatches);
    trainer.begin_epoch(epoch, kMicroBatches);
    for (int64_t i = 0; i < kMicroBatches; ++i) {
      if (epoch == 1 && i == 6) {
        acc.set_accum_steps(4);
        trainer.set_accum_steps(4);
      }
      acc.backward(by_hand.loss(i), by_hand.samples(i));
      trainer.micro_batch(with_trainer.samples(i), [&] { return with_trainer.loss(i); });
      ASSERT_EQ(acc.step_if_ready(), trainer.step_if_ready()) << "epoch " << epoch << ", micro-batch " << i;
    }
    EXPECT_EQ(acc.counters().epoch_loss_sum, trainer.counters().epoch_loss_sum);
  }
  const train::Trainer& t = trainer;
  EXPECT_EQ(t.counters().optimizer_steps, acc.counters().optimizer_steps);
  EXPECT_EQ(t.counters().optimizer_steps, 8 + 2 + 5);  // 8 of 3; then 2 of 3 and 5 of 4 (the last of 2)
  EXPECT_EQ(t.counters().last_lr, acc.counters().last_lr);
  EXPECT_EQ(t.counters().last_grad_norm, acc.counters().last_grad_norm);
  EXPECT_TRUE(same_bits(by_hand.weights(), with_trainer.weights())) << "the Trainer's weights differ";
  EXPECT_EQ(trainer.stats().eager_micro_batches, 2 * kMicroBatches);
  EXPECT_EQ(trainer.stats().replayed_micro_batches, 0);
}

// Groups of 2 until micro-batch 7 of epoch 0, where set_accum_steps(4) comes mid-group: the group
// {6, 7} still steps at 2, then groups of 4, in epoch 1 too. The reference reaches the same
// groups with today's per-epoch schedule ({0: 2, 1: 4}, epoch 0 cut after micro-batch 7), where
// one Trainer lives through the change. The step count and the learning rate must go on
// across it; a new Trainer would restart both.
TEST_P(TrainerTest, SetAccumStepsMidRunKeepsTheStepCountAndTheSchedule) {
  Problem s(device());
  s.options.accum_steps = 2;
  train::Trainer trainer(s.optimizer, s.options, s.schedule);
  StepLog log;
  for (int epoch = 0; epoch < 2; ++epoch) {
    trainer.begin_epoch(epoch, kMicroBatches);
    for (int64_t i = 0; i < kMicroBatches; ++i) {
      if (epoch == 0 && i == 7) {
        ASSERT_EQ(trainer.position().micro_batches_in_group, 1);
        trainer.set_accum_steps(4);
        EXPECT_EQ(trainer.position().accum_steps, 2) << "the group in progress keeps its size";
      }
      trainer.micro_batch(s.samples(i), [&] { return s.loss(i); });
      const int in_group = trainer.position().micro_batches_in_group;
      if (trainer.step_if_ready()) log.add(in_group, trainer);
    }
  }

  Problem r(device());
  r.options.schedule = {{0, 2}, {1, 4}};
  train::Trainer ref(r.optimizer, r.options, r.schedule);
  StepLog expected;
  const std::vector<std::pair<int64_t, int64_t>> epochs = {{0, 8}, {8, kMicroBatches}, {0, kMicroBatches}};
  for (std::size_t e = 0; e < epochs.size(); ++e) {
    ref.begin_epoch(static_cast<int>(e), epochs[e].second - epochs[e].first);
    for (int64_t i = epochs[e].first; i < epochs[e].second; ++i) {
      ref.backward(r.loss(i), r.samples(i));
      const int in_group = ref.position().micro_batches_in_group;
      if (ref.step_if_ready()) expected.add(in_group, ref);
    }
  }

  const std::vector<int> groups = {2, 2, 2, 2, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4};
  EXPECT_EQ(log.group, groups);
  EXPECT_EQ(expected.group, groups);
  EXPECT_EQ(log.steps, expected.steps) << "the step count restarted at the change";
  EXPECT_EQ(log.steps.back(), 14);
  EXPECT_EQ(log.lr, expected.lr) << "the LR schedule restarted at the change";
  for (std::size_t k = 0; k < log.lr.size(); ++k) EXPECT_EQ(log.lr[k], s.schedule->lr_at(static_cast<int64_t>(k)));
  EXPECT_TRUE(same_bits(s.weights(), r.weights())) << "the weights differ from the reference's";
  EXPECT_EQ(trainer.counters().accum_steps_override, 4);
}

TEST_P(TrainerTest, SetAccumStepsAtABoundaryAppliesAtOnceAndOutlivesTheEpochSchedule) {
  Problem s(device());
  s.options.schedule = {{0, 2}, {1, 3}};
  train::Trainer trainer(s.optimizer, s.options, s.schedule);
  trainer.begin_epoch(0, 4);
  for (int64_t i = 0; i < 2; ++i) {
    trainer.micro_batch(s.samples(i), [&] { return s.loss(i); });
    trainer.step_if_ready();
  }
  EXPECT_EQ(trainer.counters().optimizer_steps, 1);
  trainer.set_accum_steps(5);
  EXPECT_EQ(trainer.position().accum_steps, 5) << "an empty group takes the new size at once";
  for (int64_t i = 2; i < 4; ++i) {
    trainer.micro_batch(s.samples(i), [&] { return s.loss(i); });
    trainer.step_if_ready();
  }
  EXPECT_EQ(trainer.counters().optimizer_steps, 2) << "the epoch's end steps the partial group";
  trainer.begin_epoch(1, 10);
  EXPECT_EQ(trainer.position().accum_steps, 5) << "the schedule's 3 for epoch 1 would undo the change";
  EXPECT_THROW(trainer.set_accum_steps(0), InvalidArgument);
  EXPECT_THROW(trainer.set_accum_steps(-2), InvalidArgument);
  EXPECT_EQ(trainer.position().accum_steps, 5);
}

// A checkpoint at a group boundary after set_accum_steps(3): a fresh Trainer configured with 2
// restores the counters (the new steps with them) and the optimizer's state, and ends where the
// uninterrupted run ends, bit for bit, at the same step and learning rate.
TEST_P(TrainerTest, CountersCarryTheNewStepsThroughACheckpoint) {
  Problem a(device()), b(device());
  a.options.accum_steps = b.options.accum_steps = 2;
  train::Trainer first(a.optimizer, a.options, a.schedule);
  train::TrainingCounters saved;
  Tensor weights;
  std::vector<std::pair<std::string, Tensor>> state;
  int64_t updates = 0;
  first.begin_epoch(0, kMicroBatches);
  for (int64_t i = 0; i < kMicroBatches; ++i) {
    if (i == 4) first.set_accum_steps(3);
    first.micro_batch(a.samples(i), [&] { return a.loss(i); });
    first.step_if_ready();
    if (i == 9) {  // groups {0, 1}, {2, 3}, {4, 5, 6}, {7, 8, 9}: a boundary
      ASSERT_EQ(first.position().micro_batches_in_group, 0);
      saved = first.counters();
      weights = a.flat->values().clone();
      for (const auto& [name, t] : a.optimizer->state()) state.emplace_back(name, t.clone());
      updates = a.optimizer->updates();
    }
  }
  EXPECT_EQ(saved.accum_steps_override, 3);
  EXPECT_EQ(saved.optimizer_steps, 4);
  EXPECT_EQ(saved.micro_batch_index, 10);

  Tensor values = b.flat->values();  // a handle on the flat buffer
  values.copy_from(weights);
  b.optimizer->load_state(state, updates);
  train::Trainer resumed(b.optimizer, b.options, b.schedule);
  resumed.restore(saved);
  resumed.begin_epoch(saved.epoch, kMicroBatches, saved.micro_batch_index);
  EXPECT_EQ(resumed.position().accum_steps, 3);
  for (int64_t i = saved.micro_batch_index; i < kMicroBatches; ++i) {
    resumed.micro_batch(b.samples(i), [&] { return b.loss(i); });
    resumed.step_if_ready();
  }
  EXPECT_EQ(resumed.counters().optimizer_steps, first.counters().optimizer_steps);
  EXPECT_EQ(resumed.counters().optimizer_steps, 4 + 5);  // {10-12} ... {19-21}, {22, 23}
  EXPECT_EQ(resumed.counters().last_lr, first.counters().last_lr);
  EXPECT_TRUE(same_bits(a.weights(), b.weights())) << "the resumed run's weights differ";
}

// The Trainer makes MemoryTracker's calls: one record per micro-batch with its epoch, index and
// samples, one per optimizer step, and a tracker attached later sees only what follows.
TEST_P(TrainerTest, TrackerRecordsEveryMicroBatchAndStepWithoutManualCalls) {
  Problem s(device());
  memory::MemoryTracker::Options to;
  to.timeline_steps = 2;
  memory::MemoryTracker tracker(device(), to);
  to.timeline_steps = 0;  // one allocator observer at a time: the first tracker's
  memory::MemoryTracker later(device(), to);
  s.options.accum_steps = 5;
  s.options.tracker = &tracker;
  train::Trainer trainer(s.optimizer, s.options, s.schedule);
  for (int epoch = 0; epoch < 2; ++epoch) {
    if (epoch == 1) trainer.set_tracker(&later);
    trainer.begin_epoch(epoch, kMicroBatches);
    for (int64_t i = 0; i < kMicroBatches; ++i) {
      trainer.micro_batch(s.samples(i), [&] { return s.loss(i); });
      trainer.step_if_ready();
    }
  }
  EXPECT_EQ(tracker.micro_batches_seen(), kMicroBatches);
  EXPECT_EQ(tracker.steps_seen(), 5);  // 4 groups of 5 and one of 4
  EXPECT_EQ(later.micro_batches_seen(), kMicroBatches);
  EXPECT_EQ(later.steps_seen(), 5);
  const std::vector<memory::MicroBatchRecord>& records = tracker.micro_batches();
  ASSERT_EQ(records.size(), static_cast<std::size_t>(kMicroBatches));
  for (int64_t i = 0; i < kMicroBatches; ++i) {
    const memory::MicroBatchRecord& r = records[static_cast<std::size_t>(i)];
    EXPECT_EQ(r.epoch, 0);
    EXPECT_EQ(r.index, i);
    EXPECT_EQ(r.units, s.samples(i));
    EXPECT_GT(r.activation_bytes, 0) << "micro-batch " << i;
    EXPECT_GE(r.peak_bytes, r.activation_bytes);
  }
  EXPECT_EQ(later.micro_batches().front().epoch, 1);
  const std::vector<memory::StepRecord>& steps = later.steps();
  ASSERT_EQ(steps.size(), 5u);
  EXPECT_EQ(steps.front().step, 6);  // the run's sixth step: the count goes on
  EXPECT_GT(steps.front().optimizer_state_bytes, 0);
  EXPECT_FALSE(tracker.slices().empty()) << "the timeline of the first steps was not recorded";
}

TEST_P(TrainerTest, RefusesGraphsWithoutACudaDevice) {
  if (device().is_cuda()) GTEST_SKIP() << "graphs are allowed on CUDA (test_graphs.cpp)";
  Problem s(device());
  s.options.use_graphs = true;
  EXPECT_THROW(train::Trainer(s.optimizer, s.options, s.schedule), InvalidArgument);
}

// ---- conveniences over a DataLoader (train_epoch, evaluate_classifier) ------------------------

// The problem's rows as a TensorDataset (f32 x, i32 y), shuffled in batches of kBatch.
data::DataLoader problem_loader(const Problem& s) {
  return data::DataLoader(data::TensorDataset({s.x, s.y}, {"x", "y"}), kBatch, /*shuffle=*/true, /*seed=*/5);
}

// train_epoch makes the calls a loop of the user's own makes (set_epoch, seek, begin_epoch, then
// micro_batch with the loader's next(i) and step_if_ready), bit for bit over two shuffled epochs
// whose last group is partial (24 micro-batches in groups of 5), and returns the epoch's mean loss.
TEST_P(TrainerTest, TrainEpochIsTheUsersOwnLoopOverTheLoader) {
  Problem by_hand(device()), with_helper(device());
  by_hand.options.accum_steps = with_helper.options.accum_steps = 5;
  train::Trainer reference(by_hand.optimizer, by_hand.options, by_hand.schedule);
  train::Trainer trainer(with_helper.optimizer, with_helper.options, with_helper.schedule);
  data::DataLoader reference_loader = problem_loader(by_hand), loader = problem_loader(with_helper);
  ASSERT_EQ(loader.num_batches(), kMicroBatches);
  auto loss_of = [&](const data::Batch& b) {
    return ops::cross_entropy(with_helper.model(b.x), b.y, ops::Reduction::Sum);
  };
  for (int epoch = 0; epoch < 2; ++epoch) {
    reference_loader.set_epoch(epoch);
    reference_loader.seek(0);
    reference.begin_epoch(epoch, kMicroBatches);
    for (int64_t i = 0; i < kMicroBatches; ++i) {
      reference.micro_batch(by_hand.samples(i), [&] {
        const data::Batch b = reference_loader.next(i);
        return ops::cross_entropy(by_hand.model(b.x), b.y, ops::Reduction::Sum);
      });
      reference.step_if_ready();
    }
    const double mean_loss = trainer.train_epoch(loader, epoch, loss_of);
    const train::Trainer& r = reference;
    EXPECT_EQ(mean_loss, r.counters().epoch_loss_sum / r.counters().epoch_units_stepped) << "epoch " << epoch;
    EXPECT_EQ(trainer.counters().optimizer_steps, 5 * (epoch + 1)) << "four groups of 5, one of 4";
    EXPECT_TRUE(same_bits(by_hand.weights(), with_helper.weights())) << "epoch " << epoch;
  }
  EXPECT_EQ(trainer.counters().last_lr, reference.counters().last_lr);
}

// on_step reports every step taken: its count, epoch and lr as the Trainer's after it, and the
// group's loss as summed here from each micro-batch's loss over the group's samples (the partial
// last group of 4 included), across two epochs (the epoch sums restart at begin_epoch).
TEST_P(TrainerTest, OnStepReportsEveryStepsGroupLoss) {
  Problem by_hand(device()), logged(device());
  by_hand.options.accum_steps = logged.options.accum_steps = 5;
  std::vector<train::StepLog> logs;
  logged.options.on_step = [&](const train::StepLog& l) { logs.push_back(l); };
  train::Trainer reference(by_hand.optimizer, by_hand.options, by_hand.schedule);
  train::Trainer trainer(logged.optimizer, logged.options, logged.schedule);
  data::DataLoader reference_loader = problem_loader(by_hand), loader = problem_loader(logged);
  auto loss_of = [&](const data::Batch& b) { return ops::cross_entropy(logged.model(b.x), b.y, ops::Reduction::Sum); };
  std::vector<double> group_losses, lrs;
  for (int epoch = 0; epoch < 2; ++epoch) {
    reference_loader.set_epoch(epoch);
    reference_loader.seek(0);
    reference.begin_epoch(epoch, kMicroBatches);
    double group_sum = 0, group_samples = 0;
    for (int64_t i = 0; i < kMicroBatches; ++i) {
      reference.micro_batch(by_hand.samples(i), [&] {
        const data::Batch b = reference_loader.next(i);
        Tensor l = ops::cross_entropy(by_hand.model(b.x), b.y, ops::Reduction::Sum);
        group_sum += l.item();
        group_samples += static_cast<double>(by_hand.samples(i));
        return l;
      });
      if (!reference.step_if_ready()) continue;
      group_losses.push_back(group_sum / group_samples);
      lrs.push_back(reference.counters().last_lr);
      group_sum = group_samples = 0;
    }
    trainer.train_epoch(loader, epoch, loss_of);
  }
  ASSERT_EQ(logs.size(), 10u) << "five steps an epoch";
  for (std::size_t k = 0; k < logs.size(); ++k) {
    EXPECT_EQ(logs[k].step, static_cast<int64_t>(k + 1));
    EXPECT_EQ(logs[k].epoch, static_cast<int>(k / 5));
    EXPECT_EQ(logs[k].lr, lrs[k]) << "step " << k + 1;
    EXPECT_NEAR(logs[k].loss, group_losses[k], 1e-6 * group_losses[k]) << "step " << k + 1;
  }
}

// An epoch stopped at a group boundary (EpochOptions::stop) and resumed there (EpochOptions::first)
// trains the same bits as one never stopped, and the next epoch too: 24 shuffled micro-batches in
// groups of 5, stopped before micro-batch 10 (after two groups).
TEST_P(TrainerTest, TrainEpochStoppedAndResumedAtABoundaryTrainsTheSameBits) {
  Problem whole(device()), split(device());
  whole.options.accum_steps = split.options.accum_steps = 5;
  train::Trainer reference(whole.optimizer, whole.options, whole.schedule);
  train::Trainer trainer(split.optimizer, split.options, split.schedule);
  data::DataLoader reference_loader = problem_loader(whole), loader = problem_loader(split);
  auto whole_loss = [&](const data::Batch& b) {
    return ops::cross_entropy(whole.model(b.x), b.y, ops::Reduction::Sum);
  };
  auto split_loss = [&](const data::Batch& b) {
    return ops::cross_entropy(split.model(b.x), b.y, ops::Reduction::Sum);
  };
  for (int epoch = 0; epoch < 2; ++epoch) {
    reference.train_epoch(reference_loader, epoch, whole_loss);
    train::EpochOptions stop_at_10;
    stop_at_10.stop = [](int64_t next) { return next == 10; };
    const train::EpochResult first_part = trainer.train_epoch(loader, epoch, split_loss, stop_at_10);
    EXPECT_FALSE(first_part.finished);
    EXPECT_EQ(first_part.next_micro_batch, 10);
    EXPECT_EQ(trainer.position().micro_batches_in_group, 0);
    EXPECT_EQ(trainer.counters().micro_batch_index, 10);
    train::EpochOptions resume;
    resume.first = first_part.next_micro_batch;
    const train::EpochResult rest = trainer.train_epoch(loader, epoch, split_loss, resume);
    EXPECT_TRUE(rest.finished);
    EXPECT_EQ(rest.next_micro_batch, kMicroBatches);
    EXPECT_EQ(trainer.counters().optimizer_steps, reference.counters().optimizer_steps) << "epoch " << epoch;
    EXPECT_TRUE(same_bits(whole.weights(), split.weights())) << "epoch " << epoch;
  }
  EXPECT_EQ(trainer.counters().last_lr, reference.counters().last_lr);
}

// The hooks: on_micro_batch after each of the 24 micro-batches (its index, units and the units so
// far), on_step after each of the 5 steps (groups of 5, the last of 4), before that micro-batch's
// on_micro_batch; stop asked at each group boundary before a micro-batch (5 times, not after the last).
TEST_P(TrainerTest, TrainEpochHooksAreCalledPerMicroBatchStepAndBoundary) {
  Problem s(device());
  s.options.accum_steps = 5;
  train::Trainer trainer(s.optimizer, s.options, s.schedule);
  data::DataLoader loader = problem_loader(s);
  std::vector<int64_t> asked, stepped_after, seen;
  int64_t units = 0;
  train::EpochOptions options;
  options.stop = [&](int64_t next) {
    asked.push_back(next);
    return false;
  };
  options.on_step = [&](const train::MicroBatchDone& d) {
    EXPECT_TRUE(d.stepped);
    EXPECT_EQ(static_cast<int64_t>(seen.size()), d.index) << "before its on_micro_batch";
    stepped_after.push_back(d.index);
  };
  options.on_micro_batch = [&](const train::MicroBatchDone& d) {
    EXPECT_EQ(d.index, static_cast<int64_t>(seen.size()));
    EXPECT_EQ(d.units, s.samples(d.index));
    units += d.units;
    EXPECT_EQ(d.units_done, units);
    EXPECT_TRUE(d.trained_here);
    EXPECT_EQ(d.stepped, d.index % 5 == 4 || d.index == kMicroBatches - 1);
    seen.push_back(d.index);
  };
  const train::EpochResult r = trainer.train_epoch(
      loader, 0, [&](const data::Batch& b) { return ops::cross_entropy(s.model(b.x), b.y, ops::Reduction::Sum); },
      options);
  EXPECT_TRUE(r.finished);
  EXPECT_EQ(r.next_micro_batch, kMicroBatches);
  EXPECT_EQ(r.loss, trainer.counters().epoch_loss_sum / trainer.counters().epoch_units_stepped);
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(kMicroBatches));
  EXPECT_EQ(units, kRows);
  EXPECT_EQ(stepped_after, (std::vector<int64_t>{4, 9, 14, 19, 23}));
  EXPECT_EQ(asked, (std::vector<int64_t>{0, 5, 10, 15, 20}));
  EXPECT_EQ(trainer.counters().optimizer_steps, 5);
}

// A stop requested mid-group (after micro-batch 6 of the group 5..9) waits for the group's step:
// the call ends before micro-batch 10, with nothing in flight.
TEST_P(TrainerTest, TrainEpochStopRequestedMidGroupWaitsForTheBoundary) {
  Problem s(device());
  s.options.accum_steps = 5;
  train::Trainer trainer(s.optimizer, s.options, s.schedule);
  data::DataLoader loader = problem_loader(s);
  bool requested = false;
  int64_t micro_batches = 0;
  train::EpochOptions options;
  options.stop = [&](int64_t) { return requested; };
  options.on_micro_batch = [&](const train::MicroBatchDone& d) {
    ++micro_batches;
    if (d.index == 6) requested = true;
  };
  const train::EpochResult r = trainer.train_epoch(
      loader, 0, [&](const data::Batch& b) { return ops::cross_entropy(s.model(b.x), b.y, ops::Reduction::Sum); },
      options);
  EXPECT_FALSE(r.finished);
  EXPECT_EQ(r.next_micro_batch, 10);
  EXPECT_EQ(micro_batches, 10);
  EXPECT_EQ(trainer.position().micro_batches_in_group, 0);
  EXPECT_EQ(trainer.counters().optimizer_steps, 2);
  EXPECT_EQ(r.loss, trainer.counters().epoch_loss_sum / trainer.counters().epoch_units_stepped);
}

// evaluate_classifier's before_batch hook sees every batch index, and an exception it throws ends
// the pass with the model's mode and grad mode restored.
TEST_P(TrainerTest, EvaluateClassifierBeforeBatchHook) {
  Problem s(device());
  data::DataLoader loader(data::TensorDataset({s.x, s.y}), 10);
  std::vector<int64_t> seen;
  train::evaluate_classifier(s.model, loader, [&](int64_t i) { seen.push_back(i); });
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  struct Stop {};
  s.model.train(true);
  EXPECT_THROW(train::evaluate_classifier(s.model, loader,
                                          [](int64_t i) {
                                            if (i == 3) throw Stop{};
                                          }),
               Stop);
  EXPECT_TRUE(s.model.is_training());
  EXPECT_TRUE(GradMode::enabled());
}

// Accuracy and mean loss over every batch (10 of 10 rows, the last of 4), against the same
// numbers computed here from the logits on the host, from any cursor position and again after a
// pass; the model's mode is restored either way and no graph is recorded.
TEST_P(TrainerTest, EvaluateClassifierCountsEveryBatch) {
  Problem s(device());
  data::DataLoader loader(data::TensorDataset({s.x, s.y}), 10);
  int64_t correct = 0;
  double loss_sum = 0.0;
  const std::vector<int32_t> labels = s.y.to_vector<int32_t>();
  for (int64_t i = 0; i < loader.num_batches(); ++i) {
    const int64_t rows = std::min<int64_t>(10, kRows - 10 * i);
    NoGradGuard no_grad;
    const Tensor logits = s.model(s.x.narrow_rows(10 * i, rows));
    loss_sum += ops::cross_entropy(logits, s.y.narrow_rows(10 * i, rows), ops::Reduction::Mean).item();
    const std::vector<float> l = logits.to_vector<float>();
    for (int64_t r = 0; r < rows; ++r) {
      const auto row = l.begin() + r * kClasses;
      correct += std::max_element(row, row + kClasses) - row == labels[static_cast<std::size_t>(10 * i + r)];
    }
  }
  loader.seek(3);  // the pass reads from the first batch wherever the cursor was
  for (const bool training : {true, false}) {
    s.model.train(training);
    const train::Evaluation e = train::evaluate_classifier(s.model, loader);
    EXPECT_EQ(s.model.is_training(), training) << "the mode is restored";
    EXPECT_EQ(e.samples, kRows);
    EXPECT_EQ(e.correct, correct);
    EXPECT_DOUBLE_EQ(e.accuracy, static_cast<double>(correct) / kRows);
    EXPECT_NEAR(e.loss, loss_sum / 10.0, 1e-6) << "the mean over 10 batches of each batch's mean";
    EXPECT_GT(e.loss, 0.0);
  }
  EXPECT_TRUE(GradMode::enabled());
}

CUMULUS_INSTANTIATE_DEVICES(TrainerTest);

}  // namespace
}  // namespace cumulus
