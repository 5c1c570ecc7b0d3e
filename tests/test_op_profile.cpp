// The op time profile (cumulus/core/op_profile.h): each op's self time by its OpScope, the rows
// adding up to the profiled stretches, nothing from other threads or from between stretches, and
// the ops and Trainer parts of a real training step named in it.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <map>
#include <string>
#include <thread>

#include "cumulus/core/op_profile.h"
#include "cumulus/memory/category.h"
#include "cumulus/models/mlp.h"
#include "cumulus/ops/loss.h"
#include "cumulus/optim/sgd.h"
#include "cumulus/tensor/random.h"
#include "cumulus/train/trainer.h"
#include "test_util.h"

namespace cumulus {
namespace {

using testing::DeviceTest;

// Keeps the thread busy for at least `ms` of the host clock.
void busy_for(double ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double, std::milli>(ms);
  while (std::chrono::steady_clock::now() < end) {
  }
}

std::map<std::string, OpTime> by_op(const OpProfile& profile) {
  std::map<std::string, OpTime> rows;
  for (const OpTime& r : profile.rows()) rows[r.op] = r;
  return rows;
}

double sum_of_rows(const OpProfile& profile) {
  double ms = 0.0;
  for (const OpTime& r : profile.rows()) ms += r.ms;
  return ms;
}

TEST(OpProfile, NestedOpsGetTheirOwnTimeAndTheRowsAddUp) {
  OpProfile profile(Device::cpu());
  {
    OpProfileScope timed(profile);
    busy_for(1.0);  // between ops
    OpScope outer("profile_test_outer");
    busy_for(2.0);
    {
      OpScope inner("profile_test_inner");
      busy_for(40.0);
    }
    {
      OpScope inner_backward("profile_test_inner", /*backward=*/true);
      busy_for(3.0);
    }
    busy_for(1.0);
  }
  const auto rows = by_op(profile);
  ASSERT_EQ(rows.count("profile_test_outer"), 1u);
  ASSERT_EQ(rows.count("profile_test_inner"), 1u);
  ASSERT_EQ(rows.count("profile_test_inner backward"), 1u);
  ASSERT_EQ(rows.count(OpProfile::kBetweenOps), 1u);
  EXPECT_EQ(rows.at("profile_test_outer").calls, 1);
  EXPECT_EQ(rows.at("profile_test_inner").calls, 1);
  EXPECT_EQ(rows.at("profile_test_inner backward").calls, 1);
  EXPECT_EQ(rows.at(OpProfile::kBetweenOps).calls, 0);
  // Each got at least the time it spent itself; the outer op none of its nested ops' 43 ms.
  EXPECT_GE(rows.at("profile_test_inner").ms, 40.0);
  EXPECT_GE(rows.at("profile_test_inner backward").ms, 3.0);
  EXPECT_GE(rows.at("profile_test_outer").ms, 3.0);
  EXPECT_LT(rows.at("profile_test_outer").ms, 30.0);
  EXPECT_GE(rows.at(OpProfile::kBetweenOps).ms, 1.0);
  EXPECT_NEAR(sum_of_rows(profile), profile.total_ms(), 1e-9);
  EXPECT_EQ(profile.stretches(), 1);
  // The largest first.
  EXPECT_EQ(profile.rows().front().op, "profile_test_inner");
}

TEST(OpProfile, OnlyTheStretchesAndTheProfiledThreadCount) {
  OpProfile profile(Device::cpu());
  for (int i = 0; i < 3; ++i) {
    {
      OpProfileScope timed(profile);
      OpScope op("profile_test_op");
      busy_for(1.0);
      // Another thread's ops are its own, even while this thread is profiled.
      std::thread other([] {
        OpScope elsewhere("profile_test_other_thread");
        busy_for(1.0);
      });
      other.join();
    }
    OpScope unprofiled("profile_test_unprofiled");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const auto rows = by_op(profile);
  EXPECT_EQ(rows.count("profile_test_other_thread"), 0u);
  EXPECT_EQ(rows.count("profile_test_unprofiled"), 0u);
  ASSERT_EQ(rows.count("profile_test_op"), 1u);
  EXPECT_EQ(rows.at("profile_test_op").calls, 3);
  EXPECT_EQ(profile.stretches(), 3);
  // Three stretches of a few milliseconds; the 60 ms slept between them belong to nobody.
  EXPECT_GE(profile.total_ms(), 3.0);
  EXPECT_LT(profile.total_ms(), 45.0);
  EXPECT_NEAR(sum_of_rows(profile), profile.total_ms(), 1e-9);
}

TEST(OpProfile, AStretchOpenedInsideAnOpStartsWithThatOp) {
  OpProfile profile(Device::cpu());
  OpScope enclosing("profile_test_enclosing");
  {
    OpProfileScope timed(profile);
    busy_for(2.0);
  }
  const auto rows = by_op(profile);
  ASSERT_EQ(rows.count("profile_test_enclosing"), 1u);
  EXPECT_EQ(rows.at("profile_test_enclosing").calls, 0);  // opened before the stretch
  EXPECT_GE(rows.at("profile_test_enclosing").ms, 2.0);
  EXPECT_EQ(rows.count(OpProfile::kBetweenOps), 0u);
}

TEST(OpProfile, OneScopeAtATimeOnAThread) {
  OpProfile a(Device::cpu()), b(Device::cpu());
  OpProfileScope timed(a);
  EXPECT_THROW(OpProfileScope again(b), InvalidArgument);
  EXPECT_THROW(OpProfileScope again(a), InvalidArgument);
}

TEST(OpProfile, TableAndJsonSayWhatTheRowsSay) {
  OpProfile profile(Device::cpu());
  {
    OpProfileScope timed(profile);
    for (const char* name : {"profile_test_a", "profile_test_b", "profile_test_c"}) {
      OpScope op(name);
      busy_for(1.0);
    }
  }
  const std::string table = profile.table(2, 4, "step");
  EXPECT_NE(table.find("op time on cpu:"), std::string::npos) << table;
  EXPECT_NE(table.find("ms/step"), std::string::npos) << table;
  EXPECT_NE(table.find("other op labels"), std::string::npos) << table;  // 4 labels, 2 rows shown
  const nlohmann::json j = nlohmann::json::parse(profile.json(4, "step"));
  EXPECT_EQ(j.at("device"), "cpu");
  EXPECT_EQ(j.at("per"), 4);
  EXPECT_EQ(j.at("stretches"), 1);
  double ms = 0.0;
  for (const auto& op : j.at("ops")) ms += op.at("ms").get<double>();
  EXPECT_NEAR(ms, j.at("total_ms").get<double>(), 1e-9);
  EXPECT_EQ(j.at("ops").size(), 4u);  // three ops and the time between them
}

class OpProfileTraining : public DeviceTest {};

// Two optimizer steps of the seed MLP, 2 micro-batches each: its ops forward and backward, the
// loss and the Trainer's update, each called as often as the step made it.
TEST_P(OpProfileTraining, ATrainingStepNamesItsOpsAndTheUpdate) {
  Generator gen(3);
  models::SeedMLP model(gen, device());
  auto params = std::make_shared<nn::FlatParameters>(model);
  train::TrainerOptions options;
  options.accum_steps = 2;
  train::Trainer trainer(std::make_shared<optim::SGD>(params, optim::SGDOptions{}), options);
  const Tensor x = normal({8, 784}, 0.0f, 1.0f, gen, device());
  const Tensor y = Tensor::from_vector<int32_t>({0, 1, 2, 3, 4, 5, 6, 7}, {8}, device());
  OpProfile profile(device());
  trainer.begin_epoch(0);
  for (int i = 0; i < 4; ++i) {
    OpProfileScope timed(profile);
    trainer.micro_batch(8, [&] { return ops::cross_entropy(model(x), y, ops::Reduction::Sum); });
    trainer.step_if_ready();
  }
  const auto rows = by_op(profile);
  std::string labels;
  for (const auto& [op, row] : rows) labels += op + " (" + std::to_string(row.calls) + "), ";
  ASSERT_EQ(rows.count("optimizer update"), 1u) << labels;
  EXPECT_EQ(rows.at("optimizer update").calls, 2) << labels;
  EXPECT_EQ(rows.at("step decision").calls, 2) << labels;
  ASSERT_EQ(rows.count("cross_entropy"), 1u) << labels;
  EXPECT_EQ(rows.at("cross_entropy").calls, 4) << labels;
  ASSERT_EQ(rows.count("cross_entropy backward"), 1u) << labels;
  EXPECT_EQ(rows.at("cross_entropy backward").calls, 4) << labels;
  int64_t linear_forward = 0, linear_backward = 0;
  for (const auto& [op, row] : rows) {
    if (op.rfind("linear", 0) != 0) continue;
    (op.find(" backward") != std::string::npos ? linear_backward : linear_forward) += row.calls;
  }
  EXPECT_EQ(linear_forward, 3 * 4) << labels;  // three Linears, four micro-batches
  EXPECT_EQ(linear_backward, 3 * 4) << labels;
  EXPECT_EQ(profile.stretches(), 4);
  EXPECT_GT(profile.total_ms(), 0.0);
  EXPECT_NEAR(sum_of_rows(profile), profile.total_ms(), 1e-6);
}

CUMULUS_INSTANTIATE_DEVICES(OpProfileTraining);

}  // namespace
}  // namespace cumulus
