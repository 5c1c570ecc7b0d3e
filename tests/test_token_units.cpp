// The unit of accumulation is the user's (Note [Units] in engine/train/trainer.cpp): a token-level
// model (embedding -> linear over [B, T, C] -> cross_entropy over [B, T, V], summed over the
// tokens) trained through the Trainer over sequences of T tokens (TensorDataset::set_units_per_row)
// steps on the mean gradient per token of each group, a partial last group and an uneven last
// micro-batch included: bit for bit what a hand-written loop gives that sums the tokens' losses,
// divides by the group's tokens and steps the optimizer. The planner's request and the memory
// tracker count the same tokens, and a tracker told sequences but fed tokens says so.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "cumulus/core/error.h"
#include "cumulus/data/dataset.h"
#include "cumulus/memory/tracker.h"
#include "cumulus/nn/embedding.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/layers.h"
#include "cumulus/nn/module.h"
#include "cumulus/nn/norm_layers.h"
#include "cumulus/ops/loss.h"
#include "cumulus/optim/adamw.h"
#include "cumulus/optim/sgd.h"
#include "cumulus/plan/planner.h"
#include "cumulus/train/trainer.h"
#include "cumulus/tensor/random.h"

namespace cumulus {
namespace {

// 10 sequences of 5 tokens in micro-batches of 3 sequences: 15 + 15 + 15 tokens, then 5 (uneven);
// with 3 micro-batches a group, the second group is partial (one micro-batch of 5 tokens).
constexpr int64_t kSequences = 10, kTokens = 5, kVocab = 11, kWidth = 6, kRowsPerBatch = 3, kAccum = 3;

struct TokenModel : nn::Module {
  TokenModel(Generator& gen, Device device)
      : embed(register_module("embed", std::make_shared<nn::Embedding>(kVocab, kWidth, gen, device))),
        head(register_module("head", std::make_shared<nn::Linear>(kWidth, kVocab, gen, device))) {}
  Tensor forward(const Tensor& tokens) override { return (*head)((*embed)(tokens)); }  // [B, T, V]
  std::shared_ptr<nn::Embedding> embed;
  std::shared_ptr<nn::Linear> head;
};

// Inputs (i32 tokens) and next-token-like labels (i64), [kSequences, kTokens].
data::TensorDataset token_dataset() {
  std::vector<int32_t> tokens(kSequences * kTokens);
  std::vector<int64_t> labels(kSequences * kTokens);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>((i * 7 + i / kTokens) % kVocab);
    labels[i] = static_cast<int64_t>((i * 3 + 1) % kVocab);
  }
  data::TensorDataset d({Tensor::from_vector(tokens, {kSequences, kTokens}, Device::cpu()),
                         Tensor::from_vector(labels, {kSequences, kTokens}, Device::cpu())},
                        {"tokens", "labels"});
  d.set_units_per_row(kTokens);
  return d;
}

Tensor summed_loss(TokenModel& model, const Tensor& x, const Tensor& y) {
  return ops::cross_entropy(model(x), y, ops::Reduction::Sum);  // over B x T tokens
}

struct TokenRun {
  std::vector<float> weights;
  std::vector<double> step_losses;  // per step: the group's mean loss per token
  std::vector<int64_t> group_units;
};

enum class Opt { sgd, adamw };

std::shared_ptr<optim::Optimizer> make_optimizer(Opt kind, std::shared_ptr<nn::FlatParameters> flat) {
  if (kind == Opt::sgd) {
    optim::SGDOptions o;
    o.lr = 0.5f;
    o.momentum = 0.9f;
    return std::make_shared<optim::SGD>(std::move(flat), o);
  }
  optim::AdamWOptions o;
  o.lr = 0.05f;
  o.weight_decay = 0.1f;
  return std::make_shared<optim::AdamW>(std::move(flat), o);
}

// Through the Trainer: train_epoch over a DataLoader of the token dataset.
TokenRun trainer_run(Opt kind, int epochs, memory::MemoryTracker* tracker = nullptr) {
  Generator gen(5);
  TokenModel model(gen, Device::cpu());
  auto flat = std::make_shared<nn::FlatParameters>(model);
  const data::TensorDataset set = token_dataset();
  data::DataLoader loader(set, kRowsPerBatch);
  TokenRun run;
  train::TrainerOptions options;
  options.accum_steps = kAccum;
  options.tracker = tracker;
  options.on_step = [&](const train::StepLog& log) { run.step_losses.push_back(log.loss); };
  train::Trainer trainer(make_optimizer(kind, flat), options);
  auto loss = [&](const data::Batch& b) { return summed_loss(model, b.x, b.y); };
  for (int e = 0; e < epochs; ++e) trainer.train_epoch(loader, e, loss);
  run.weights = flat->values().to_vector<float>();
  return run;
}

// By hand: each group's micro-batches backward into the gradient buffers, their tokens counted,
// then one update with the gradient scaled by 1 / (the group's tokens): the mean per token.
TokenRun reference_run(Opt kind, int epochs) {
  Generator gen(5);
  TokenModel model(gen, Device::cpu());
  auto flat = std::make_shared<nn::FlatParameters>(model);
  auto opt = make_optimizer(kind, flat);
  const data::TensorDataset set = token_dataset();
  const Tensor& x = set.tensor(0);
  const Tensor& y = set.tensor(1);
  TokenRun run;
  const int64_t micro_batches = (kSequences + kRowsPerBatch - 1) / kRowsPerBatch;
  for (int e = 0; e < epochs; ++e)
    for (int64_t first = 0; first < micro_batches; first += kAccum) {
      flat->mark_gradients_stale();
      int64_t tokens = 0;
      double loss_sum = 0.0;
      for (int64_t i = first; i < std::min(first + kAccum, micro_batches); ++i) {
        const int64_t rows = std::min(kRowsPerBatch, kSequences - i * kRowsPerBatch);
        Tensor l = summed_loss(model, x.narrow_rows(i * kRowsPerBatch, rows), y.narrow_rows(i * kRowsPerBatch, rows));
        l.backward();
        loss_sum += static_cast<double>(l.item());
        tokens += rows * kTokens;
      }
      opt->step(1.0f / static_cast<float>(tokens), opt->lr());
      run.step_losses.push_back(loss_sum / static_cast<double>(tokens));
      run.group_units.push_back(tokens);
    }
  run.weights = flat->values().to_vector<float>();
  return run;
}

TEST(TokenUnits, BatchesCountTokens) {
  const data::TensorDataset set = token_dataset();
  EXPECT_EQ(set.units_per_row(), kTokens);
  EXPECT_EQ(set.units(), kSequences * kTokens);
  EXPECT_EQ(set.slice(0, 4).units_per_row(), kTokens);
  data::DataLoader loader(set, kRowsPerBatch);
  ASSERT_EQ(loader.num_batches(), 4);
  loader.seek(0);
  for (int64_t i = 0; i < 4; ++i) {
    const int64_t rows = i < 3 ? kRowsPerBatch : 1;
    EXPECT_EQ(loader.units(i), rows * kTokens);
    EXPECT_EQ(loader.next(i).units, rows * kTokens);
  }
  data::TensorDataset samples_set({Tensor::zeros(Shape{4, 2}, DType::f32, Device::cpu())});
  data::DataLoader samples_loader(samples_set, 3);
  samples_loader.seek(1);
  EXPECT_EQ(samples_loader.next(1).units, 1);  // default: a row is a unit
  EXPECT_THROW(samples_set.set_units_per_row(0), InvalidArgument);
}

// Exact: the same gradients summed in the same order, the same scale 1 / tokens, the same update.
TEST(TokenUnits, TrainerStepsOnTheMeanPerTokenOfEachGroupExactly) {
  for (Opt kind : {Opt::sgd, Opt::adamw}) {
    SCOPED_TRACE(kind == Opt::sgd ? "sgd" : "adamw");
    const TokenRun trained = trainer_run(kind, 2);
    const TokenRun reference = reference_run(kind, 2);
    ASSERT_EQ(reference.group_units, (std::vector<int64_t>{45, 5, 45, 5}));  // a partial, uneven last group
    ASSERT_EQ(trained.weights.size(), reference.weights.size());
    for (std::size_t i = 0; i < trained.weights.size(); ++i)
      ASSERT_EQ(trained.weights[i], reference.weights[i]) << "weight " << i;
    ASSERT_EQ(trained.step_losses.size(), reference.step_losses.size());
    for (std::size_t s = 0; s < trained.step_losses.size(); ++s)  // StepLog::loss: the mean per token
      EXPECT_NEAR(trained.step_losses[s], reference.step_losses[s], 1e-12 * reference.step_losses[s]) << "step " << s;
  }
}

// A group normalized per sequence instead would step 5 times as far: the test tells them apart.
TEST(TokenUnits, PerSequenceNormalizationWouldDiffer) {
  Generator gen(5);
  TokenModel model(gen, Device::cpu());
  auto flat = std::make_shared<nn::FlatParameters>(model);
  auto opt = make_optimizer(Opt::sgd, flat);
  const data::TensorDataset set = token_dataset();
  summed_loss(model, set.tensor(0).narrow_rows(0, 9), set.tensor(1).narrow_rows(0, 9)).backward();
  opt->step(1.0f / 9.0f, opt->lr());  // per sequence
  const TokenRun reference = reference_run(Opt::sgd, 1);
  const std::vector<float> w = flat->values().to_vector<float>();
  bool differs = false;
  for (std::size_t i = 0; i < w.size(); ++i) differs = differs || w[i] != reference.weights[i];
  EXPECT_TRUE(differs);
}

// The planner's request counts tokens: effective batch and limit in tokens, micro-batches of whole
// sequences, no probe larger than the effective batch.
TEST(TokenUnits, PlannerRequestCountsTokens) {
  Generator gen(5);
  TokenModel model(gen, Device::cpu());
  auto flat = std::make_shared<nn::FlatParameters>(model);
  auto opt = make_optimizer(Opt::adamw, flat);
  const data::TensorDataset set = token_dataset();
  auto loss = [&](const data::Batch& b) { return summed_loss(model, b.x, b.y); };
  const int64_t effective = 6 * kTokens;  // 6 sequences, 30 tokens
  plan::PlanRequest r = train::plan_request(*opt, set, loss, effective);
  EXPECT_EQ(r.units_per_row, kTokens);
  EXPECT_EQ(r.unit_limit, kSequences * kTokens);
  EXPECT_EQ(r.effective_batch, effective);
  std::vector<int64_t> probed;
  auto run_one = r.micro_batch;
  r.micro_batch = [&](int64_t units) {
    probed.push_back(units);
    run_one(units);
  };
  const plan::Plan plan = plan::plan_batch(r);
  ASSERT_GT(plan.micro_batch, 0);
  EXPECT_EQ(plan.micro_batch % kTokens, 0);
  EXPECT_EQ(plan.micro_batch * plan.accum_steps, effective);
  std::vector<int64_t> sizes;
  for (const plan::PlanRow& row : plan.table) sizes.push_back(row.micro_batch);
  EXPECT_EQ(sizes, (std::vector<int64_t>{30, 15, 10, 5}));  // the divisors of 6 sequences, in tokens
  ASSERT_FALSE(probed.empty());
  for (int64_t units : probed) {
    EXPECT_EQ(units % kTokens, 0) << units;
    EXPECT_LE(units, effective) << units;
  }
  EXPECT_EQ(plan.largest_probe, *std::max_element(probed.begin(), probed.end()));
  EXPECT_GT(plan.probe_seconds, 0.0);
  EXPECT_NE(plan.reason.find("probes took"), std::string::npos) << plan.reason;
  EXPECT_THROW(plan::plan_batch(train::plan_request(*opt, set, loss, 7)), InvalidArgument);  // not whole sequences
}

// The tracker records the tokens the Trainer counts; one told sequences and fed tokens says so.
TEST(TokenUnits, TrackerCountsTokensAndChecksWhatItIsFed) {
  memory::MemoryTracker::Options o;
  o.micro_batch_size = kRowsPerBatch * kTokens;
  o.accum_steps = kAccum;
  o.timeline_steps = 0;
  memory::MemoryTracker tracker(Device::cpu(), o);
  trainer_run(Opt::sgd, 1, &tracker);
  std::vector<int64_t> units;
  for (const memory::MicroBatchRecord& r : tracker.micro_batches()) units.push_back(r.units);
  EXPECT_EQ(units, (std::vector<int64_t>{15, 15, 15, 5}));
  const memory::MemorySummary s = tracker.summary();
  EXPECT_TRUE(s.warning.empty()) << s.warning;
  EXPECT_GT(s.peak_at_micro_batch, 0);

  memory::MemoryTracker::Options told_sequences = o;
  told_sequences.micro_batch_size = kRowsPerBatch;  // 3 sequences, fed 15 tokens
  memory::MemoryTracker wrong(Device::cpu(), told_sequences);
  testing::internal::CaptureStderr();
  trainer_run(Opt::sgd, 1, &wrong);
  const std::string printed = testing::internal::GetCapturedStderr();
  EXPECT_NE(printed.find("told micro-batches of 3 units"), std::string::npos) << printed;
  EXPECT_NE(printed.find("fed one of 15 units"), std::string::npos) << printed;
  const std::string warning = wrong.summary().warning;
  EXPECT_NE(warning.find("told micro-batches of 3 units"), std::string::npos) << warning;
  EXPECT_NE(warning.find("5 to 15"), std::string::npos) << warning;

  told_sequences.strict_units = true;
  memory::MemoryTracker strict(Device::cpu(), told_sequences);
  try {
    trainer_run(Opt::sgd, 1, &strict);
    FAIL() << "a strict tracker took 15 units when told 3";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("told micro-batches of 3 units"), std::string::npos) << what;
    EXPECT_NE(what.find("fed one of 15 units"), std::string::npos) << what;
  }

  // Told more than it is ever fed: the summary says the peak at the micro-batch is not measured.
  memory::MemoryTracker::Options told_more = o;
  told_more.micro_batch_size = 512;
  memory::MemoryTracker unfed(Device::cpu(), told_more);
  trainer_run(Opt::sgd, 1, &unfed);
  EXPECT_NE(unfed.summary().warning.find("told micro-batches of 512 units and fed none"), std::string::npos)
      << unfed.summary().warning;
}

}  // namespace
}  // namespace cumulus
