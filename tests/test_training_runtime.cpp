// The run-control calls apps build on: training checkpoints and the resume point
// (cumulus/train/checkpoint.h), and from the apps' common library the metrics log that survives a
// resume (apps/common/metrics_log.h), the progress line (apps/common/progress.h), the stop on a
// signal (apps/common/stop_signal.h) and the command-line helpers (apps/common/command_line.h).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/command_line.h"
#include "common/metrics_log.h"
#include "common/progress.h"
#include "common/settings_table.h"
#include "common/stop_signal.h"
#include "cumulus/core/device.h"
#include "cumulus/data/dataset.h"
#include "cumulus/dist/communicator.h"
#include "cumulus/io/file.h"
#include "cumulus/io/run_files.h"
#include "cumulus/io/state_dict.h"
#include "cumulus/nn/activation_layers.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/layers.h"
#include "cumulus/ops/loss.h"
#include "cumulus/optim/adamw.h"
#include "cumulus/optim/lr_schedule.h"
#include "cumulus/plan/planner.h"
#include "cumulus/train/accumulation.h"
#include "cumulus/train/checkpoint.h"
#include "cumulus/train/trainer.h"
#include "cumulus/tensor/random.h"
#include "cumulus/version.h"
#include "test_util.h"

namespace cumulus {
namespace {

using testing::TempDir;

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

constexpr int64_t kRows = 90, kFeatures = 5, kClasses = 3, kBatch = 4;  // 23 micro-batches an epoch

// A small classifier trained with AdamW (state to checkpoint), groups of 3 and a cosine schedule.
struct Classifier {
  Classifier() {
    Generator gen(3);
    x = uniform({kRows, kFeatures}, -1.0f, 1.0f, gen);
    std::vector<int32_t> labels(kRows);
    for (int64_t i = 0; i < kRows; ++i) labels[static_cast<std::size_t>(i)] = static_cast<int32_t>((i * 7) % kClasses);
    y = Tensor::from_vector(labels, {kRows});
    model.add(std::make_shared<nn::Linear>(kFeatures, 6, gen));
    model.add(std::make_shared<nn::ReLU>());
    model.add(std::make_shared<nn::Linear>(6, kClasses, gen));
    optim::AdamWOptions a;
    a.lr = 0.03f;
    optimizer = std::make_shared<optim::AdamW>(std::make_shared<nn::FlatParameters>(model), a);
    train::TrainerOptions options;
    options.accum_steps = 3;
    trainer = std::make_unique<train::Trainer>(optimizer, options,
                                               std::make_shared<optim::CosineWarmupLR>(0.03f, 2, 20, 0.003f));
    loader = std::make_unique<data::DataLoader>(data::TensorDataset({x, y}, {"x", "y"}), kBatch, true, 9);
  }
  train::EpochResult epoch(int index, train::EpochOptions options = {}) {
    return trainer->train_epoch(
        *loader, index, [&](const data::Batch& b) { return ops::cross_entropy(model(b.x), b.y, ops::Reduction::Sum); },
        options);
  }
  std::vector<float> weights() { return model.parameters()[0].to_vector<float>(); }

  Tensor x, y;
  nn::Sequential model;
  std::shared_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<train::Trainer> trainer;
  std::unique_ptr<data::DataLoader> loader;
};

std::vector<train::RecordedSetting> settings(const std::string& lr) {
  return {{"batch-size", "micro_batch_size", "4"}, {"lr", "lr", lr, /*overridable=*/true}};
}

train::ResumeOptions resume_options(const std::string& lr) {
  train::ResumeOptions r;
  r.settings = settings(lr);
  r.micro_batches_per_epoch = 23;
  r.units_per_epoch = kRows;
  return r;
}

// Stopped at a group boundary mid-epoch, checkpointed and resumed in a new process's objects (a new
// model, optimizer and Trainer), the run ends with the same bits as one never stopped.
TEST(TrainingCheckpoint, AResumedRunTrainsTheSameBitsAsOneNeverStopped) {
  TempDir dir;
  Classifier whole, first, second;
  for (int e = 0; e < 2; ++e) whole.epoch(e);

  first.epoch(0);
  train::EpochOptions stop_at_9;
  stop_at_9.stop = [](int64_t next) { return next == 9; };
  ASSERT_FALSE(first.epoch(1, stop_at_9).finished);
  const train::TrainingCounters counters = first.trainer->counters();
  const train::CheckpointState state{counters, first.optimizer->updates(), counters.epoch_loss_sum,
                                     static_cast<int64_t>(counters.epoch_units_stepped)};
  train::save_training_checkpoint(dir.file("ck.st"), first.model, *first.optimizer, state, settings("0.03"),
                                  {{"app.note", "kept"}});
  EXPECT_TRUE(train::is_training_checkpoint(dir.file("ck.st")));

  const train::ResumedCheckpoint r =
      train::load_training_checkpoint(dir.file("ck.st"), second.model, *second.optimizer, resume_options("0.03"));
  EXPECT_EQ(r.state.counters.epoch, 1);
  EXPECT_EQ(r.state.counters.micro_batch_index, 9);
  EXPECT_EQ(r.state.counters.optimizer_steps, state.counters.optimizer_steps);
  EXPECT_EQ(r.state.counters.last_lr, state.counters.last_lr);
  EXPECT_EQ(std::memcmp(&r.state.epoch_loss_sum, &state.epoch_loss_sum, sizeof(double)), 0) << "bit for bit";
  EXPECT_EQ(r.state.epoch_units, 36);
  EXPECT_TRUE(r.overridden.empty());
  EXPECT_EQ(r.metadata.at("app.note"), "kept");
  second.trainer->restore(r.state.counters);
  train::EpochOptions from_9;
  from_9.first = r.state.counters.micro_batch_index;
  EXPECT_TRUE(second.epoch(1, from_9).finished);
  EXPECT_EQ(second.trainer->counters().optimizer_steps, whole.trainer->counters().optimizer_steps);
  EXPECT_EQ(second.weights(), whole.weights());
}

// An error mid-group (here at micro-batch 10, the group 9-11 in flight) leaves the point at the last
// boundary, 9: resumed from its checkpoint, the run ends with the same bits as one never stopped,
// and its mean loss for the epoch is the uninterrupted one's.
TEST(ResumePoint, AnErrorMidGroupCheckpointsTheLastBoundary) {
  TempDir dir;
  Classifier whole, failing, resumed;
  for (int e = 0; e < 2; ++e) whole.epoch(e);
  const train::TrainingCounters whole_counters = whole.trainer->counters();
  const double whole_last_loss = whole_counters.epoch_loss_sum / whole_counters.epoch_units_stepped;

  train::ResumePoint point(*failing.trainer, {});
  failing.epoch(0, point.begin_epoch(0));
  point.end_epoch();
  int64_t calls = 0;
  try {
    failing.trainer->train_epoch(
        *failing.loader, 1,
        [&](const data::Batch& b) {
          if (calls++ == 10) throw OutOfMemory("pretend");
          return ops::cross_entropy(failing.model(b.x), b.y, ops::Reduction::Sum);
        },
        point.begin_epoch(1));
    FAIL() << "no error";
  } catch (const OutOfMemory&) {
  }
  EXPECT_EQ(failing.trainer->position().micro_batch_index, 10) << "the group in flight";
  const train::CheckpointState state = point.state();
  EXPECT_EQ(state.counters.epoch, 1);
  EXPECT_EQ(state.counters.micro_batch_index, 9);
  EXPECT_EQ(state.epoch_units, 9 * kBatch);
  train::save_training_checkpoint(dir.file("ck.st"), failing.model, *failing.optimizer, state, settings("0.03"));

  const train::ResumedCheckpoint r =
      train::load_training_checkpoint(dir.file("ck.st"), resumed.model, *resumed.optimizer, resume_options("0.03"));
  resumed.trainer->restore(r.state.counters);
  train::ResumePoint resumed_point(*resumed.trainer, r.state);
  EXPECT_EQ(resumed_point.epoch(), 1);
  EXPECT_TRUE(resumed.epoch(1, resumed_point.begin_epoch(1)).finished);
  EXPECT_EQ(resumed.weights(), whole.weights());
  EXPECT_EQ(resumed_point.epoch_units(), kRows);
  EXPECT_NEAR(resumed_point.mean_loss(), whole_last_loss, 1e-12);
  resumed_point.end_epoch();
  EXPECT_EQ(resumed_point.state().counters.epoch, 2);
  EXPECT_EQ(resumed_point.state().counters.micro_batch_index, 0);
  EXPECT_EQ(resumed_point.state().epoch_loss_sum, 0.0);
}

// Equal floats give equal text, the shortest that reads back as the same float.
TEST(TrainingCheckpoint, FloatSettingsReadBackExactly) {
  EXPECT_EQ(train::setting_text(0.001f), "0.001");
  EXPECT_EQ(train::setting_text(0.9f), "0.9");
  for (float v : {0.1f + 0.2f, 1.0f / 3.0f, 3e-8f, 123456.789f})
    EXPECT_EQ(std::strtof(train::setting_text(v).c_str(), nullptr), v) << train::setting_text(v);
}

// Each use takes its rows in the table's order, a row that does not apply to the run left out; the
// checkpoint's rows carry the key, the override and the unit; overrides are the overridable names.
TEST(SettingsTable, EachUseTakesItsRowsThatApply) {
  struct Run {
    float lr = 0.5f;
    int epochs = 3;
    bool cosine = false;
  };
  using Text = cumulus::app::SettingText;
  const cumulus::app::SettingsTable<Run> table({
      {"lr", "lr", true, cumulus::app::kCheckpoint | cumulus::app::kMemoryReport, nullptr,
       [](const Run& r) -> Text { return train::setting_text(r.lr); }},
      {"epochs", "num_epochs", false, cumulus::app::kCheckpoint | cumulus::app::kRanksAgree, "1",
       [](const Run& r) -> Text { return std::to_string(r.epochs); }, " (in all)"},
      {"min-lr", "min_lr", true, cumulus::app::kCheckpoint, nullptr,
       [](const Run& r) { return r.cosine ? Text("0") : std::nullopt; }},
  });
  const Run run;
  using Named = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(table.named(cumulus::app::kMemoryReport, run), (Named{{"lr", "0.5"}}));
  EXPECT_EQ(table.named(cumulus::app::kRanksAgree, run), (Named{{"epochs", "3"}}));
  const std::vector<train::RecordedSetting> recorded = table.recorded(run);
  ASSERT_EQ(recorded.size(), 2u);  // min-lr does not apply without the cosine
  EXPECT_EQ(recorded[1].key, "num_epochs");
  EXPECT_EQ(recorded[1].before_recorded, std::optional<std::string>("1"));
  EXPECT_EQ(recorded[1].unit, " (in all)");
  EXPECT_TRUE(recorded[0].overridable && !recorded[0].before_recorded);
  EXPECT_EQ(table.recorded(Run{0.5f, 3, true}).size(), 3u);
  EXPECT_EQ(table.overridable(), (std::set<std::string>{"lr", "min-lr"}));
  EXPECT_EQ(table.parse_overrides("lr,--min-lr", "lr, min-lr"), (std::set<std::string>{"lr", "min-lr"}));
  EXPECT_TRUE(table.parse_overrides("", "lr, min-lr").empty());
  for (const char* bad : {"epochs", "lr,", "lr,bogus"}) {
    try {
      table.parse_overrides(bad, "lr, min-lr");
      ADD_FAILURE() << bad << " accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("not a setting a resumed run may change (those are: lr, min-lr)"),
                std::string::npos)
          << e.what();
    }
  }
}

// A different setting is refused naming it; an overridable one is accepted when allowed, and
// reported; plain weights are not a checkpoint.
TEST(TrainingCheckpoint, SettingsMustMatchUnlessOverridden) {
  TempDir dir;
  Classifier run, other;
  run.epoch(0);
  train::save_training_checkpoint(dir.file("ck.st"), run.model, *run.optimizer,
                                  {run.trainer->counters(), run.optimizer->updates(), 0.0, 0}, settings("0.03"));
  try {
    train::load_training_checkpoint(dir.file("ck.st"), other.model, *other.optimizer, resume_options("0.01"));
    FAIL() << "a different lr was accepted";
  } catch (const train::SettingMismatch& e) {
    EXPECT_NE(std::string(e.what()).find("--lr 0.03, this run has 0.01"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--override lr"), std::string::npos) << e.what();
  }
  train::ResumeOptions allowed = resume_options("0.01");
  allowed.overrides = {"lr"};
  const train::ResumedCheckpoint r =
      train::load_training_checkpoint(dir.file("ck.st"), other.model, *other.optimizer, allowed);
  EXPECT_EQ(r.overridden, std::vector<std::string>{"lr 0.03 -> 0.01"});

  io::save_state_dict(dir.file("plain.st"), run.model);
  EXPECT_FALSE(train::is_training_checkpoint(dir.file("plain.st")));
  EXPECT_THROW(train::load_training_checkpoint(dir.file("plain.st"), other.model, *other.optimizer, allowed), Error);
}

// A flipped byte fails the checksum, and a position outside this run's epoch is refused: both name the file.
TEST(TrainingCheckpoint, DamagedOrForeignCheckpointsNameTheFile) {
  TempDir dir;
  Classifier run, other;
  run.epoch(0);
  train::save_training_checkpoint(dir.file("ck.st"), run.model, *run.optimizer,
                                  {run.trainer->counters(), run.optimizer->updates(), 0.0, 0}, settings("0.03"));
  train::ResumeOptions shorter = resume_options("0.03");
  shorter.micro_batches_per_epoch = 10;  // the checkpoint is at micro-batch 23, the epoch's end
  try {
    train::load_training_checkpoint(dir.file("ck.st"), other.model, *other.optimizer, shorter);
    FAIL() << "a position outside the epoch was accepted";
  } catch (const train::SettingMismatch&) {
    FAIL() << "not a setting";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir.file("ck.st")), std::string::npos) << e.what();
  }
  std::string bytes = read_all(dir.file("ck.st"));
  bytes[bytes.size() - 3] ^= 0x10;
  io::write_file_atomic(dir.file("flipped.st"), bytes);
  EXPECT_THROW(
      train::load_training_checkpoint(dir.file("flipped.st"), other.model, *other.optimizer, resume_options("0.03")),
      Error);
}

// A resumed log keeps the lines up to its position and drops the later ones; a new one starts afresh.
TEST(MetricsLog, AResumeKeepsTheLinesUpToItsPosition) {
  TempDir dir;
  const std::string path = dir.file("m.jsonl");
  {
    cumulus::app::MetricsLog log(path, "step");
    for (int step = 1; step <= 4; ++step) log.append("{\"step\": " + std::to_string(step) + "}");
  }
  EXPECT_EQ(read_all(path), "{\"step\": 1}\n{\"step\": 2}\n{\"step\": 3}\n{\"step\": 4}\n");
  cumulus::app::MetricsLog resumed(path, "step", 2);
  resumed.append("{\"step\": 3, \"again\": true}");
  EXPECT_EQ(read_all(path), "{\"step\": 1}\n{\"step\": 2}\n{\"step\": 3, \"again\": true}\n");
  cumulus::app::MetricsLog fresh(path, "step");
  fresh.append("{\"step\": 1}");
  EXPECT_EQ(read_all(path), "{\"step\": 1}\n");
  cumulus::app::MetricsLog off("");
  EXPECT_FALSE(off.enabled());
  off.append("{}");
}

// Appending line by line gives the same file, the resume's cut included.
TEST(MetricsLog, AppendingWritesTheSameLines) {
  TempDir dir;
  const std::string path = dir.file("m.jsonl");
  {
    cumulus::app::MetricsLog log(path, "step", std::nullopt, cumulus::app::MetricsWrites::append);
    for (int step = 1; step <= 3; ++step) log.append("{\"step\": " + std::to_string(step) + "}");
    EXPECT_EQ(read_all(path), "{\"step\": 1}\n{\"step\": 2}\n{\"step\": 3}\n");
  }
  cumulus::app::MetricsLog resumed(path, "step", 1, cumulus::app::MetricsWrites::append);
  EXPECT_EQ(read_all(path), "{\"step\": 1}\n") << "cut when opened";
  resumed.append("{\"step\": 2}");
  EXPECT_EQ(read_all(path), "{\"step\": 1}\n{\"step\": 2}\n");
  cumulus::app::MetricsLog fresh(path, "step", std::nullopt, cumulus::app::MetricsWrites::append);
  EXPECT_EQ(read_all(path), "") << "a new run starts the file afresh";
}

TEST(MetricsLog, AFileOfAnotherKindIsRefusedNamingIt) {
  TempDir dir;
  io::write_file_atomic(dir.file("notes.txt"), "{\"step\": 1}\nnot json\n");
  try {
    cumulus::app::MetricsLog log(dir.file("notes.txt"), "step", 5);
    FAIL() << "a foreign file was taken as a metrics log";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }
}

// Narrower terminals drop the rate, then the epoch's ETA, the count, the loss; never wider than columns - 1.
TEST(TrainingProgress, TheLineFitsEveryWidth) {
  cumulus::app::ProgressLine p;
  p.epoch = 3;
  p.total_epochs = 20;
  p.done = 420;
  p.total = 938;
  p.loss = 0.61234;
  p.units_per_s = 12345;
  p.epoch_eta_s = 65;
  p.run_eta_s = 3723;
  p.unit = "tokens";
  const std::string wide = cumulus::app::format_progress_line(p, 200);
  EXPECT_NE(wide.find("12.3k tokens/s"), std::string::npos) << wide;
  EXPECT_NE(wide.find("run ETA 1:02:03"), std::string::npos) << wide;
  EXPECT_NE(wide.find("epoch ETA 1:05"), std::string::npos) << wide;
  EXPECT_NE(wide.find("loss 0.6123"), std::string::npos) << wide;
  for (int columns = 10; columns <= 120; ++columns)
    EXPECT_LT(cumulus::app::format_progress_line(p, columns).size(), static_cast<std::size_t>(columns)) << columns;
  EXPECT_EQ(cumulus::app::format_progress_line(p, 40).find("tokens"), std::string::npos);
  EXPECT_EQ(cumulus::app::format_duration(59.6), "1:00");
}

// A plain (non-terminal) stream gets a line about every 10% of the epoch, and at its end.
TEST(TrainingProgress, PlainLinesAboutEveryTenthOfTheEpoch) {
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  cumulus::app::TrainingProgress progress(out, true, 2, "samples");
  progress.begin_epoch(0, 50);
  int lines = 0;
  for (int64_t done = 1; done <= 50; ++done)
    if (progress.due(done)) {
      progress.update(done, 1.5, done * 4);
      ++lines;
    }
  progress.end_epoch();
  EXPECT_EQ(lines, 10);
  std::rewind(out);
  char buf[256] = {};
  ASSERT_NE(std::fgets(buf, sizeof buf, out), nullptr);
  EXPECT_EQ(std::string(buf).rfind("Epoch 1/2  5/50 micro-batches  loss 1.5000", 0), 0u) << buf;
  std::fclose(out);
}

// "EPOCH:STEPS,..." from epoch 0, and the steps a run of such epochs takes.
TEST(AccumulationSchedule, ParsedFromTextAndCountedOverTheRun) {
  EXPECT_EQ(cumulus::app::parse_accum_schedule("0:8,4:2"), (std::map<int, int>{{0, 8}, {4, 2}}));
  for (const char* bad : {"", "1:4", "0:4,0:2", "0:0", "0:x", "0:4,", "4", "0:4,2"}) {
    try {
      cumulus::app::parse_accum_schedule(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()).rfind("'" + std::string(bad) + "': ", 0), 0u) << e.what();
    }
  }
  EXPECT_EQ(cumulus::app::accum_schedule_text({{0, 8}, {4, 2}}), "0:8,4:2");
  EXPECT_EQ(cumulus::app::parse_accum_schedule(cumulus::app::accum_schedule_text({{0, 3}, {7, 1}, {9, 12}})),
            (std::map<int, int>{{0, 3}, {7, 1}, {9, 12}}));
  // 10 micro-batches an epoch: groups of 4 (3 steps, the last of 2) in epochs 0-1, of 2 (5 steps) after.
  EXPECT_EQ(train::optimizer_steps_in_epochs({{0, 4}, {2, 2}}, 10, 3), 3 + 3 + 5);
  EXPECT_EQ(train::optimizer_steps_in_epochs({{0, 1}}, 10, 0), 0);
}

// The plan's table: one line per weighed setting, a header, one line per row with the chosen starred,
// "fits" only against a budget, the unit named.
TEST(PlanTable, EveryRowWithItsFitAndTheChoice) {
  plan::Plan plan;
  plan.weighed.resize(1);
  plan.weighed[0].time.probes = 3;
  for (int64_t b : {32, 16}) {
    plan::PlanRow row;
    row.micro_batch = b;
    row.accum_steps = 32 / b;
    row.peak_bytes = b << 20;
    row.fits = b == 16;
    row.chosen = b == 16;
    plan.table.push_back(row);
  }
  const std::string without_budget = plan::plan_table_text(plan, 0, "token");
  EXPECT_NE(without_budget.find("budget none"), std::string::npos) << without_budget;
  EXPECT_NE(without_budget.find("ms a token (3 sizes)"), std::string::npos) << without_budget;
  const std::string with_budget = plan::plan_table_text(plan, 20 << 20);
  std::vector<std::string> rows;
  std::istringstream lines(with_budget);
  for (std::string line; std::getline(lines, line);)
    if (line.find(" 32.00 ") != std::string::npos || line.find(" 16.00 ") != std::string::npos) rows.push_back(line);
  ASSERT_EQ(rows.size(), 2u) << with_budget;
  EXPECT_NE(rows[0].find(" no "), std::string::npos) << rows[0];
  EXPECT_EQ(rows[0].back(), ' ') << "not chosen: " << rows[0];
  EXPECT_NE(rows[1].find(" yes "), std::string::npos) << rows[1];
  EXPECT_EQ(rows[1].back(), '*') << rows[1];
  EXPECT_NE(with_budget.find("budget 20.0 MiB"), std::string::npos) << with_budget;
}

// Two outputs naming one file (through a symlink too), an output that is an input, and one inside a
// data directory are refused naming both; an allowed replacement passes.
TEST(RunFiles, OutputsMustNotBeEachOtherOrAnInput) {
  TempDir dir;
  io::write_file_atomic(dir.file("in.st"), "x");
  std::filesystem::create_symlink(dir.file("a.json"), dir.file("link.json"));
  auto refusal = [](const std::function<void()>& check) {
    try {
      check();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(refusal([&] {
              io::check_outputs_distinct({{"--a", dir.file("a.json")}, {"--b", dir.file("link.json")}}, {});
            }),
            "--a '" + dir.file("a.json") + "' and --b '" + dir.file("link.json") +
                "' are the same file; give each output its own file");
  const std::vector<io::RunFile> outputs = {{"--save", dir.file("in.st")}};
  EXPECT_NE(refusal([&] {
              io::check_outputs_distinct(outputs, {{"--init", dir.file("in.st")}});
            }).find("is the --init file"),
            std::string::npos);
  EXPECT_EQ(refusal([&] {
              io::check_outputs_distinct(outputs, {{"--init", dir.file("in.st")}},
                                         [](const io::RunFile& in, const io::RunFile&) { return in.name == "--init"; });
            }),
            "");
  EXPECT_NE(
      refusal([&] { io::check_outputs_outside(outputs, dir.str(), "the dataset"); }).find("a file of the dataset"),
      std::string::npos);
  EXPECT_EQ(refusal([&] { io::check_inputs_readable({{"--init", dir.file("in.st")}, {"--resume", ""}}); }), "");
  EXPECT_EQ(refusal([&] {
              io::check_inputs_readable({{"--init", dir.file("none.st")}});
            }),
            "--init '" + dir.file("none.st") + "': no such file");
  EXPECT_EQ(refusal([&] {
              io::check_inputs_readable({{"--resume", dir.str()}});
            }),
            "--resume '" + dir.str() + "' is a directory, not a regular file");
  EXPECT_EQ(refusal([&] { io::check_outputs_writable({{"--metrics", dir.file("m.jsonl")}}); }), "");
  EXPECT_NE(refusal([&] {
              io::check_outputs_writable({{"--metrics", dir.file("missing/m.jsonl")}});
            }).rfind("--metrics: ", 0),
            std::string::npos);
  EXPECT_NE(refusal([&] {
              io::check_outputs_writable({{"--save", dir.file(std::string(300, 'n'))}});
            }).rfind("--save", 0),
            std::string::npos);
}

// Each rank's copy of a file is named before its extension; a dot in a directory is not one.
TEST(RunFiles, EachRankNamesItsOwnCopy) {
  EXPECT_EQ(io::rank_path("memory.json", 1), "memory.rank1.json");
  EXPECT_EQ(io::rank_path("out/trace", 2), "out/trace.rank2");
  EXPECT_EQ(io::rank_path("run.d/plot", 3), "run.d/plot.rank3");
  EXPECT_EQ(io::rank_path("out/.hidden", 1), "out/.hidden.rank1");
  EXPECT_EQ(io::rank_path("", 1), "");
}

// A signal only records the stop; the exit codes are the shell's.
TEST(StopSignal, ASignalIsRecordedNotFatal) {
  cumulus::app::install_stop_handlers();
  EXPECT_FALSE(cumulus::app::stop_requested());
  std::raise(SIGTERM);
  EXPECT_TRUE(cumulus::app::stop_requested());
  EXPECT_EQ(cumulus::app::stop_signal(), SIGTERM);
  EXPECT_EQ(cumulus::app::exit_code_for_stop(cumulus::app::stop_signal()), 143);
  EXPECT_EQ(cumulus::app::exit_code_for_stop(SIGINT), 130);
  EXPECT_EQ(cumulus::app::exit_code_for_stop(SIGPIPE), 141);
  EXPECT_STREQ(cumulus::app::stop_signal_name(SIGINT), "SIGINT");
  cumulus::app::request_stop(0);
  EXPECT_FALSE(cumulus::app::stop_requested());
  cumulus::app::install_stop_handlers();  // the handler was reset to the default by the first signal
}

// A stop asked for between boundaries throws Interrupted; the fault hook raises SIGINT once, at
// the point named, and nowhere else.
TEST(StopSignal, InterruptedAndTheFaultHook) {
  cumulus::app::install_stop_handlers();
  EXPECT_NO_THROW(cumulus::app::throw_if_interrupted());
  ::setenv("CUMULUS_FAULT_SIGNAL", "micro_batch:2:5", 1);
  cumulus::app::fault_signal_point("micro_batch", 2, 4);
  cumulus::app::fault_signal_point("test_pass", 2);
  EXPECT_FALSE(cumulus::app::stop_requested());
  cumulus::app::fault_signal_point("micro_batch", 2, 5);
  EXPECT_EQ(cumulus::app::stop_signal(), SIGINT);
  EXPECT_THROW(cumulus::app::throw_if_interrupted(), cumulus::app::Interrupted);
  cumulus::app::request_stop(0);
  cumulus::app::install_stop_handlers();
  cumulus::app::fault_signal_point("micro_batch", 2, 5);  // once only
  EXPECT_FALSE(cumulus::app::stop_requested());
  ::unsetenv("CUMULUS_FAULT_SIGNAL");
}

// Integers are read from the text: anything but plain decimal digits in range is refused, naming
// the range and the text.
TEST(CommandLine, IntegersAreCheckedOnTheirText) {
  EXPECT_EQ(cumulus::app::integer_text_problem("64", 1, 64), "");
  EXPECT_EQ(cumulus::app::integer_text_problem("+7", 0, 10), "");
  EXPECT_EQ(cumulus::app::integer_text_problem("65", 1, 64), "expected an integer from 1 to 64, got '65'");
  for (const char* bad : {"", "1e3", "-1", "0x10", " 5", "5 ", "99999999999999999999"})
    EXPECT_EQ(cumulus::app::integer_text_problem(bad, 0, 1000000),
              "expected an integer from 0 to 1000000, got '" + std::string(bad) + "'");
  EXPECT_EQ(cumulus::app::unsigned_64_text_problem("18446744073709551615"), "");
  for (const char* bad : {"", "-1", "+1", "18446744073709551616", "1.0"})
    EXPECT_EQ(cumulus::app::unsigned_64_text_problem(bad),
              "expected an integer from 0 to 18446744073709551615, got '" + std::string(bad) + "'");
}

// A choice flag's table both ways; a value outside it is refused naming the flag and every value.
TEST(CommandLine, AChoiceFlagNamesItsValues) {
  enum class Fruit { apple, pear, plum };
  const cumulus::app::FlagChoices<Fruit> fruit{
      "--fruit", "fruit", {{"apple", Fruit::apple}, {"pear", Fruit::pear}, {"plum", Fruit::plum}}};
  EXPECT_EQ(fruit.parse("pear"), Fruit::pear);
  EXPECT_STREQ(fruit.name(Fruit::plum), "plum");
  EXPECT_EQ(fruit.names("auto"), (std::vector<std::string>{"apple", "pear", "plum", "auto"}));
  const auto message = [](const auto& choices, const std::string& text) {
    try {
      choices.parse(text);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message(fruit, "Pear"), "--fruit 'Pear': unknown fruit (expected apple, pear or plum)");
  const cumulus::app::FlagChoices<bool> on_off{"--on", nullptr, {{"on", true}, {"off", false}}};
  EXPECT_EQ(message(on_off, ""), "--on '': expected on or off");
}

// A long option line continues under its description, any other line under its indent; a word
// longer than the width stays whole; lines that fit are left alone.
TEST(CommandLine, HelpLinesWrapUnderTheirDescription) {
  const std::string help =
      "Usage: app [OPTIONS]\n"
      "  --flag INT      one two three four five\n"
      "   text that runs on and on\n"
      "  --word          abcdefghijklmnopqrstuvwxyz\n";
  EXPECT_EQ(cumulus::app::wrap_help_text(help, 28, 18),
            "Usage: app [OPTIONS]\n"
            "  --flag INT      one two\n"
            "                  three four\n"
            "                  five\n"
            "   text that runs on and on\n"
            "  --word          abcdefghijklmnopqrstuvwxyz\n");
  EXPECT_EQ(cumulus::app::wrap_help_text("   a b c d e f\n", 8, 4), "   a b c\n   d e f\n");
  EXPECT_EQ(cumulus::app::wrap_help_text(help, 200, 18), help);
  setenv("COLUMNS", "120", 1);
  EXPECT_EQ(cumulus::app::help_columns(), isatty(STDOUT_FILENO) ? cumulus::app::help_columns() : 120);
  setenv("COLUMNS", "10", 1);  // too narrow to wrap help into: the default
  EXPECT_EQ(cumulus::app::help_columns(), isatty(STDOUT_FILENO) ? cumulus::app::help_columns() : 100);
  unsetenv("COLUMNS");
}

// "auto" takes a GPU where one is usable; anything else is parsed and must be usable now.
TEST(CommandLine, DeviceFromAFlag) {
  EXPECT_EQ(cumulus::app::device_from_flag("cpu"), Device::cpu());
  EXPECT_EQ(cumulus::app::device_from_flag("auto"), cuda_available() ? Device::cuda(0) : Device::cpu());
  EXPECT_THROW(cumulus::app::device_from_flag("tpu"), InvalidArgument);
  EXPECT_THROW(cumulus::app::device_from_flag("cuda:4096"), Error);  // no such GPU here, or no CUDA at all
}

TEST(CommandLine, VersionTextNamesTheProgramTheBuildAndTheBackends) {
  const std::string text = cumulus::app::version_text("my_app");
  EXPECT_EQ(text.rfind(std::string("my_app (cumulus) ") + CUMULUS_VERSION + "\ncommit ", 0), 0u) << text;
  EXPECT_NE(text.find(", build type "), std::string::npos) << text;
  EXPECT_NE(text.find(cuda_compiled() ? "\nCUDA: compiled, cuDNN: " : "\nCUDA: not compiled, cuDNN: "),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(dist::transports_text() + "\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace cumulus
