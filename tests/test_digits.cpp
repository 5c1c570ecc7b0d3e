// apps/digits, the own-model demo (#29), end to end on a small digits-like table written here (240
// rows of 64 pixels in 0..16 and a label: ten noisy patterns), in seconds: both models train (the
// loss falls), the planner's plan and the memory table are printed, --compare prints one JSON line
// per optimizer step and writes the initial weights, and bad input ends with a message and exit 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <regex>
#include <sstream>

#include "cumulus/tensor/random.h"
#include "test_util.h"

namespace cumulus::testing {
namespace {

std::string write_table(const TempDir& dir) {
  std::vector<float> pattern(10 * 64), noise(240 * 64);
  Generator(3).fill_uniform(pattern.data(), 10 * 64, 0.0f, 16.0f);
  Generator(4).fill_normal(noise.data(), 240 * 64, 0.0f, 4.0f);
  std::ostringstream csv;
  for (int r = 0; r < 240; ++r) {
    for (int p = 0; p < 64; ++p) csv << std::clamp(std::round(pattern[r % 10 * 64 + p] + noise[r * 64 + p]), 0.0f, 16.0f) << ",";
    csv << r % 10 << "\n";
  }
  const std::string path = dir.file("digits.csv");
  std::ofstream(path) << csv.str();
  return path;
}

std::vector<double> epoch_losses(const std::string& out) {
  std::vector<double> losses;
  const std::regex line(R"(epoch +\d+  train loss ([0-9.]+)  test accuracy)");
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it) losses.push_back(std::stod((*it)[1]));
  return losses;
}

TEST(Digits, BothModelsTrainWithThePlannerAndTheTracker) {
  TempDir dir;
  const std::string data = write_table(dir);
  for (const char* model : {"resmlp", "attention"}) {
    SCOPED_TRACE(model);
    const Result r = run_command(std::string(DIGITS_BIN) + " --model " + model + " --epochs 6 --data " + quote(data) +
                                 " --effective-batch 32 2>&1");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("planner: micro-batch"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("memory per micro-batch"), std::string::npos) << r.out;
    const std::vector<double> losses = epoch_losses(r.out);
    ASSERT_EQ(losses.size(), 6u) << r.out;
    EXPECT_LT(losses.back(), 0.8 * losses.front()) << r.out;
  }
}

// 200 training rows in micro-batches of the plan, one JSON line per optimizer step.
TEST(Digits, CompareWritesTheInitialWeightsAndEveryStepsLoss) {
  TempDir dir;
  const std::string data = write_table(dir), init = dir.file("init.safetensors");
  const Result r = run_command(std::string(DIGITS_BIN) + " --model attention --epochs 2 --effective-batch 64" +
                               " --data " + quote(data) + " --compare " + quote(init) + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::smatch plan;
  ASSERT_TRUE(std::regex_search(r.out, plan, std::regex(R"(planner: micro-batch (\d+) x (\d+) steps)"))) << r.out;
  const int64_t micro = std::stoll(plan[1]), accum = std::stoll(plan[2]);
  const int64_t batches = (200 + micro - 1) / micro, steps = 2 * ((batches + accum - 1) / accum);
  const std::regex step_line(R"(\{"step": (\d+), "loss": [0-9.e+-]+\})");
  const auto lines = std::distance(std::sregex_iterator(r.out.begin(), r.out.end(), step_line), std::sregex_iterator());
  EXPECT_EQ(lines, steps) << r.out;
  EXPECT_TRUE(std::filesystem::exists(init));
}

TEST(Digits, BadInputEndsWithAMessage) {
  TempDir dir;
  Result r = run_command(std::string(DIGITS_BIN) + " --epochs 1 2>&1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--data"), std::string::npos) << r.out;
  std::ofstream(dir.file("bad.csv")) << "1,2,3\n4,x,6\n";
  r = run_command(std::string(DIGITS_BIN) + " --data " + quote(dir.file("bad.csv")) + " 2>&1");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("bad.csv: line 2, column 2: not a number"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace cumulus::testing
