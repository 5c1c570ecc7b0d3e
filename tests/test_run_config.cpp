// fashion_mnist's resolution (Note [Run configuration] in apps/fashion_mnist/run_config.h): a
// command line becomes a RunConfig of enums with every derived value computed by the resolution,
// and what the ranks and the planner find is folded into a new configuration, never written into
// one. Runs the app's own code, not the app.
#include <gtest/gtest.h>

#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "run_config.h"
#include "test_util.h"

namespace {

using namespace fmnist;

// The command line of `args` (after the program name), parsed and checked as the app does.
CommandLine parse(std::vector<std::string> args) {
  args.insert(args.begin(), "fashion_mnist");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  const ParseResult parsed = parse_command_line(static_cast<int>(argv.size()), argv.data());
  EXPECT_TRUE(parsed.proceed) << "exit code " << parsed.exit_code;
  return parsed.command_line;
}

RunConfig resolve(const std::vector<std::string>& args) {
  std::vector<std::string> all = {"--device", "cpu"};
  all.insert(all.end(), args.begin(), args.end());
  return resolve_run_config(parse(all));
}

std::string setting(const RunConfig& c, const std::string& name) {
  for (const auto& [n, value] : settings_table().named(cumulus::app::kCheckpoint, {c, ""}))
    if (n == name) return value;
  return "(absent)";
}

// What resolving throws, or "" when it does not.
template <class F>
std::string usage_error(F f) {
  return cumulus::testing::thrown_message<UsageFailure>(f);
}

TEST(RunConfig, ChoicesBecomeEnums) {
  const RunConfig c = resolve({"--model", "cnn", "--optimizer", "adamw", "--lr-schedule", "cosine", "--precision",
                               "bf16", "--recompute", "on", "--data-on", "host", "--normalize", "micro-batches"});
  EXPECT_EQ(c.model, ModelKind::cnn);
  EXPECT_EQ(c.optimizer, OptimizerKind::adamw);
  EXPECT_EQ(c.lr_schedule, LrScheduleKind::cosine);
  EXPECT_EQ(c.precision, cumulus::Precision::bf16);
  EXPECT_EQ(c.recompute, RecomputeChoice::on);
  EXPECT_EQ(c.data_on, DataOnChoice::host);
  EXPECT_EQ(c.normalization, cumulus::train::Normalization::micro_batches);
  EXPECT_TRUE(c.device.is_cpu());
  EXPECT_FALSE(c.use_graphs);                       // the CPU has none
  EXPECT_FLOAT_EQ(c.weight_decay, 0.01f);           // AdamW's default, resolved once
  EXPECT_FLOAT_EQ(resolve({}).weight_decay, 0.0f);  // SGD's
}

TEST(RunConfig, ChoiceErrorsNameTheFlag) {
  EXPECT_EQ(usage_error([] { parse_choice<ModelKind>("resnet"); }),
            "--model 'resnet': unknown model (expected mlp or cnn)");
  EXPECT_EQ(usage_error([] { parse_choice<OptimizerKind>("adam"); }), "--optimizer 'adam': expected sgd or adamw");
  EXPECT_EQ(usage_error([] { parse_choice<cumulus::Precision>("fp8"); }),
            "--precision 'fp8': expected fp32, bf16 or fp16");
  // The resolution of a command line whose text was never checked by CLI11 says the same.
  CommandLine cli = parse({"--device", "cpu"});
  cli.graphs = "sometimes";
  EXPECT_EQ(usage_error([&] { resolve_run_config(cli); }), "--graphs 'sometimes': expected auto, on or off");
  cli = parse({"--device", "cpu"});
  cli.kernels = "fast";
  EXPECT_EQ(usage_error([&] { resolve_run_config(cli); }), "--kernels 'fast': expected auto, fused or generic");
  // Choices that go together only on some settings, checked at resolution.
  EXPECT_EQ(usage_error([] {
              resolve({"--model", "cnn", "--kernels", "fused"});
            }),
            "--kernels fused runs the MLP only (the model is cnn)");
}

TEST(RunConfig, ChoiceNamesReadBack) {
  for (const char* name : {"mlp", "cnn"}) EXPECT_STREQ(choice_name(parse_choice<ModelKind>(name)), name);
  for (const char* name : {"off", "on", "auto"}) EXPECT_STREQ(choice_name(parse_choice<RecomputeChoice>(name)), name);
  for (const char* name : {"samples", "micro-batches"})
    EXPECT_STREQ(choice_name(parse_choice<cumulus::train::Normalization>(name)), name);
  for (const char* name : {"auto", "fused", "generic"})
    EXPECT_STREQ(choice_name(parse_choice<cumulus::nn::KernelChoice>(name)), name);
}

TEST(RunConfig, AccumulationStepsAreDerivedOnce) {
  const RunConfig flags = resolve({"--accum-steps", "4"});
  EXPECT_EQ(flags.batch_source, BatchSource::flags);
  EXPECT_EQ(flags.accum_steps_at(0), 4);
  EXPECT_EQ(flags.accum_steps_at(7), 4);
  EXPECT_EQ(setting(flags, "accum-steps"), "4");
  // On two ranks the steps per rank stay; the checkpoint records those of all ranks together.
  const RunConfig two = on_ranks(flags, RankPlacement{0, 2, cumulus::Device::cpu()});
  EXPECT_EQ(two.accum_steps_at(0), 4);
  EXPECT_EQ(two.accum_schedule_all_ranks(), (std::map<int, int>{{0, 8}}));
  EXPECT_EQ(setting(two, "accum-steps"), "8");

  const RunConfig scheduled = resolve({"--accum-schedule", "0:8,4:2"});
  EXPECT_EQ(scheduled.accum_steps_at(3), 8);
  EXPECT_EQ(scheduled.accum_steps_at(4), 2);
  EXPECT_EQ(setting(on_ranks(scheduled, RankPlacement{0, 2, cumulus::Device::cpu()}), "accum-steps"), "0:16,4:4");
  EXPECT_EQ(setting(resolve({"--accum-schedule", "0:8"}), "accum-steps"), "0:8");  // a schedule stays one
}

TEST(RunConfig, EffectiveBatchWithBatchSizeFollowsTheRanks) {
  const RunConfig base = resolve({"--effective-batch", "64", "--batch-size", "16"});
  EXPECT_EQ(base.batch_source, BatchSource::elastic);
  const cumulus::Device cpu = cumulus::Device::cpu();
  EXPECT_EQ(on_ranks(base, RankPlacement{0, 1, cpu}).accum_steps_at(0), 4);
  EXPECT_EQ(on_ranks(base, RankPlacement{0, 2, cpu}).accum_steps_at(0), 2);
  EXPECT_EQ(on_ranks(base, RankPlacement{1, 4, cpu}).accum_steps_at(0), 1);
  EXPECT_EQ(usage_error([&] {
              on_ranks(base, RankPlacement{0, 3, cpu});
            }),
            "--effective-batch 64 is not a multiple of --batch-size 16 x 3 rank(s) = 48");
  EXPECT_EQ(base.accum_steps_at(0), 1);  // folding made new configurations; this one is as resolved
}

TEST(RunConfig, RanksGetTheirOwnOutputs) {
  const RunConfig base = resolve({"--memory-report", "out/memory.json", "--trace", "trace", "--checkpoint", "ck",
                                  "--save", "w.safetensors", "--metrics", "m.jsonl"});
  const RunConfig root = on_ranks(base, RankPlacement{0, 2, cumulus::Device::cpu()});
  EXPECT_EQ(root.memory_report_path, "out/memory.json");
  EXPECT_EQ(root.checkpoint_path, "ck");
  const RunConfig other = on_ranks(base, RankPlacement{1, 2, cumulus::Device::cpu()});
  EXPECT_EQ(other.rank, 1);
  EXPECT_EQ(other.memory_report_path, "out/memory.rank1.json");
  EXPECT_EQ(other.trace_path, "trace.rank1");
  EXPECT_TRUE(other.checkpoint_path.empty() && other.save_path.empty() && other.metrics_path.empty());
}

// A plan with the given levers.
BatchPlan plan_of(int64_t micro_batch, int accum, uint32_t recompute, cumulus::plan::DataPlacement data = {},
                  cumulus::Precision precision = cumulus::Precision::fp32) {
  BatchPlan p{micro_batch, accum};
  p.setting.recompute = recompute;
  p.setting.data = data;
  p.setting.precision = precision;
  return p;
}

TEST(RunConfig, ThePlannersChoiceIsFoldedIn) {
  const RunConfig base =
      resolve({"--effective-batch", "64", "--memory-budget", "8MiB", "--recompute", "auto", "--model", "cnn"});
  EXPECT_EQ(base.batch_source, BatchSource::planner);
  EXPECT_EQ(base.recompute, RecomputeChoice::planner);
  EXPECT_EQ(base.memory_budget_bytes, 8 << 20);
  const RunConfig planned = with_plan(base, plan_of(32, 2, 1));
  EXPECT_EQ(planned.batch_size, 32);
  EXPECT_EQ(planned.accum_steps_at(0), 2);
  EXPECT_EQ(planned.recompute, RecomputeChoice::on);
  EXPECT_EQ(planned.recompute_segments, 1u);
  EXPECT_EQ(setting(planned, "batch-size"), "32");
  EXPECT_EQ(with_plan(base, plan_of(64, 1, 0)).recompute, RecomputeChoice::off);
  // --recompute given: the planner's decision does not apply.
  const RunConfig fixed = resolve({"--effective-batch", "64", "--memory-budget", "8MiB", "--recompute", "on"});
  EXPECT_EQ(with_plan(fixed, plan_of(64, 1, 0)).recompute, RecomputeChoice::on);
}

// --precision auto and --data-on auto: fp32 and the device until the plan says otherwise; on the
// CPU the data's placement is the device (the host is the device). Only with the planner.
TEST(RunConfig, PrecisionAndPlacementAutoAreThePlannersToDecide) {
  const RunConfig base =
      resolve({"--effective-batch", "64", "--memory-budget", "8MiB", "--precision", "auto", "--data-on", "auto"});
  EXPECT_TRUE(base.precision_by_planner);
  EXPECT_EQ(base.precision, cumulus::Precision::fp32);
  EXPECT_EQ(base.data_on, DataOnChoice::device);
  const RunConfig planned =
      with_plan(base, plan_of(64, 1, 0, cumulus::plan::DataPlacement::device, cumulus::Precision::bf16));
  EXPECT_EQ(planned.precision, cumulus::Precision::bf16);
  EXPECT_FALSE(planned.precision_by_planner);
  EXPECT_EQ(with_plan(base, plan_of(64, 1, 0)).precision, cumulus::Precision::fp32);
  // Given, the precision stays whatever the plan carries.
  const RunConfig fixed = resolve({"--effective-batch", "64", "--memory-budget", "8MiB", "--precision", "fp32"});
  EXPECT_EQ(with_plan(fixed, plan_of(64, 1, 0, {}, cumulus::Precision::bf16)).precision, cumulus::Precision::fp32);
  for (const std::string flag : {"--precision", "--data-on", "--recompute"}) {  // no planner: a usage error
    std::vector<std::string> args = {"fashion_mnist", flag, "auto"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    const ParseResult parsed = parse_command_line(static_cast<int>(argv.size()), argv.data());
    EXPECT_FALSE(parsed.proceed) << flag;
    EXPECT_EQ(parsed.exit_code, 2) << flag;
  }
  EXPECT_THROW(
      resolve({"--effective-batch", "64", "--memory-budget", "8MiB", "--precision", "auto", "--kernels", "fused"}),
      UsageFailure);
}

// --help and a wrong --override list the settings a resumed run may change: the table's overridable ones.
TEST(Settings, TheOverridableListIsTheTables) {
  std::set<std::string> listed;
  std::stringstream text(overridable_settings_text());
  for (std::string name; std::getline(text >> std::ws, name, ',');) listed.insert(name);
  EXPECT_EQ(listed, settings_table().overridable());
}

}  // namespace
