// The memory reports as a person reads them: memory.json's order (schema version, settings,
// device, versions, summary, the planner's check when given one, then records), epochs from 1
// everywhere, and the SVG plot's two panels, markers and a title that names exactly the
// micro-batches and steps drawn.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cumulus/core/error.h"
#include "cumulus/io/run_files.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/memory/report.h"
#include "cumulus/memory/tracker.h"
#include "cumulus/nn/activation_layers.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/layers.h"
#include "cumulus/ops/loss.h"
#include "cumulus/optim/adamw.h"
#include "cumulus/optim/sgd.h"
#include "cumulus/plan/plan_check.h"
#include "cumulus/version.h"
#include "cumulus/train/trainer.h"
#include "test_util.h"

namespace cumulus {
namespace {

using testing::DeviceTest;

// A small MLP (32-64-10) over random data: enough to allocate activations, backward temporaries
// and, with AdamW, optimizer state.
struct Rig {
  explicit Rig(Device device, bool adamw = false) : gen(3) {
    model.add(std::make_shared<nn::Linear>(32, 64, gen, device));
    model.add(std::make_shared<nn::ReLU>());
    model.add(std::make_shared<nn::Linear>(64, 10, gen, device));
    flat = std::make_shared<nn::FlatParameters>(model);
    std::vector<float> xs(static_cast<std::size_t>(kSamples * 32));
    gen.fill_uniform(xs.data(), kSamples * 32, -1.0f, 1.0f);
    std::vector<int32_t> ys(static_cast<std::size_t>(kSamples));
    for (int64_t i = 0; i < kSamples; ++i) ys[static_cast<std::size_t>(i)] = static_cast<int32_t>(i % 10);
    {
      MemoryCategoryScope scope(MemoryCategory::data);
      x = Tensor::from_vector(xs, Shape{kSamples, 32}, device);
      y = Tensor::from_vector(ys, Shape{kSamples}, device);
    }
    std::shared_ptr<optim::Optimizer> opt;
    if (adamw) opt = std::make_shared<optim::AdamW>(flat, optim::AdamWOptions{});
    else opt = std::make_shared<optim::SGD>(flat, optim::SGDOptions{});
    train::TrainerOptions ao;
    ao.accum_steps = 4;
    acc = std::make_unique<train::Trainer>(opt, ao);
  }

  // One epoch of micro-batches of `b`, tracked; `slow_first` sleeps inside the first forward (a
  // warm-up as long as a first CUDA call).
  void epoch(memory::MemoryTracker& tracker, int e, int64_t b, bool slow_first = false) {
    const int64_t mbs = kSamples / b;
    acc->begin_epoch(e, mbs);
    for (int64_t i = 0; i < mbs; ++i) {
      tracker.begin_micro_batch(e, i, b);
      Tensor loss = ops::cross_entropy(model(x.narrow_rows(i * b, b)), y.narrow_rows(i * b, b), ops::Reduction::Sum);
      if (slow_first && e == 0 && i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      tracker.end_forward();
      acc->backward(loss, b);
      loss = Tensor();
      tracker.end_backward();
      if (acc->ready()) {
        tracker.begin_step();
        acc->step_if_ready();
        tracker.end_step(acc->counters().optimizer_steps, acc->optimizer().state_bytes());
      }
    }
  }

  static constexpr int64_t kSamples = 64;
  Generator gen;
  nn::Sequential model;
  std::shared_ptr<nn::FlatParameters> flat;
  Tensor x, y;
  std::unique_ptr<train::Trainer> acc;
};

memory::MemoryTracker::Options options(int timeline_steps) {
  memory::MemoryTracker::Options o;
  o.model = "mlp_32_64_10";
  o.micro_batch_size = 8;
  o.accum_steps = 4;
  o.timeline_steps = timeline_steps;
  o.settings = {{"optimizer", "sgd"}, {"lr", "0.001"}, {"epochs", "2"}};
  return o;
}

std::vector<std::string> keys(const nlohmann::ordered_json& j) {
  std::vector<std::string> k;
  for (auto it = j.begin(); it != j.end(); ++it) k.push_back(it.key());
  return k;
}

std::size_t count(const std::string& haystack, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t i = haystack.find(needle); i != std::string::npos; i = haystack.find(needle, i + 1)) ++n;
  return n;
}

// The text of the SVG's <title> (the plot's title).
std::string svg_title(const std::string& svg) {
  const std::size_t a = svg.find("<title>"), b = svg.find("</title>");
  return a == std::string::npos || b == std::string::npos ? "" : svg.substr(a + 7, b - a - 7);
}

class ReportTest : public DeviceTest {};

TEST_P(ReportTest, JsonPutsVersionSettingsDeviceAndSummaryBeforeTheRecords) {
  Rig rig(device());
  memory::MemoryTracker tracker(device(), options(2));
  rig.epoch(tracker, 0, 8);
  const std::string text = memory::memory_report_json(tracker);
  const auto j = nlohmann::ordered_json::parse(text);

  const std::vector<std::string> k = keys(j);
  ASSERT_GE(k.size(), 8u);
  EXPECT_EQ(k[0], "schema_version");
  EXPECT_EQ(k[1], "settings");
  EXPECT_EQ(j["schema_version"], memory::kMemoryReportSchemaVersion);
  auto pos = [&](const std::string& key) { return std::find(k.begin(), k.end(), key) - k.begin(); };
  for (const char* key : {"device", "device_name", "versions", "model", "summary", "micro_batches", "steps"})
    EXPECT_LT(pos(key), static_cast<std::ptrdiff_t>(k.size())) << key;
  EXPECT_LT(pos("device"), pos("summary"));
  EXPECT_LT(pos("versions"), pos("summary"));
  EXPECT_LT(pos("summary"), pos("micro_batches"));
  EXPECT_LT(pos("summary"), pos("steps"));
  // In the text too: a person opening the file sees the summary before 10,000 records.
  EXPECT_LT(text.find("\"summary\""), text.find("\"micro_batches\""));

  // Settings keep the order they were given in.
  EXPECT_EQ(keys(j["settings"]), (std::vector<std::string>{"optimizer", "lr", "epochs"}));
  EXPECT_EQ(j["settings"]["lr"], "0.001");
  EXPECT_EQ(j["device"], device().str());
  EXPECT_FALSE(j["device_name"].get<std::string>().empty());
  EXPECT_EQ(j["versions"]["cumulus"], CUMULUS_VERSION);
  EXPECT_TRUE(j["versions"].contains("openblas"));
  if (device().is_cuda()) {
    EXPECT_TRUE(j["versions"].contains("cuda_runtime"));
    EXPECT_NE(j["device_name"], "cpu");
  }
  // Category order in peak_by_category follows the enum, not the alphabet.
  EXPECT_EQ(keys(j["micro_batches"][0]["peak_by_category"]).front(), "parameters");
}

TEST_P(ReportTest, EpochsCountFromOneInJsonTraceAndPlot) {
  Rig rig(device());
  memory::MemoryTracker tracker(device(), options(3));  // the window spans both epochs: 2 steps per epoch
  rig.epoch(tracker, 0, 8);
  rig.epoch(tracker, 1, 8);

  const auto j = nlohmann::json::parse(memory::memory_report_json(tracker));
  std::set<int> epochs;
  for (const auto& r : j["micro_batches"]) epochs.insert(r["epoch"].get<int>());
  EXPECT_EQ(epochs, (std::set<int>{1, 2}));
  EXPECT_EQ(j["micro_batches"][0]["index"], 0) << "index counts from 0 within the epoch";
  ASSERT_EQ(j["steps"].size(), 4u);
  EXPECT_EQ(j["steps"][0]["epoch"], 1);
  EXPECT_EQ(j["steps"][3]["epoch"], 2);

  const auto t = nlohmann::json::parse(memory::memory_trace_json(tracker));
  std::set<int> trace_epochs;
  for (const auto& e : t["traceEvents"])
    if (e["ph"] == "X") trace_epochs.insert(e["args"]["epoch"].get<int>());
  EXPECT_EQ(trace_epochs, (std::set<int>{1, 2}));

  // 3 steps of 4 micro-batches of 8: epoch 1's 8 micro-batches, then 4 of epoch 2.
  const std::string svg = memory::memory_plot_svg(tracker);
  EXPECT_EQ(svg_title(svg), "memory by category, epoch 1 micro-batch 1 to epoch 2 micro-batch 4 (12 micro-batches), "
                            "optimizer steps 1-3");
  EXPECT_NE(svg.find(">epoch 2</text>"), std::string::npos) << "the epoch boundary is marked";
  EXPECT_EQ(svg.find("epoch 0"), std::string::npos);
}

TEST_P(ReportTest, PlotHasBothPanelsMarkersAndATitleNamingWhatIsDrawn) {
  Rig rig(device());
  memory::MemoryTracker tracker(device(), options(2));
  rig.epoch(tracker, 0, 8);  // 8 micro-batches, 2 steps: all inside the window

  const std::string svg = memory::memory_plot_svg(tracker);
  EXPECT_EQ(svg_title(svg), "memory by category, micro-batches 1-8 of epoch 1, optimizer steps 1-2");
  EXPECT_NE(svg.find("all allocated memory"), std::string::npos);
  EXPECT_NE(svg.find("what changes"), std::string::npos);
  // Top panel: one area per category. Lower panel: only what moves (no parameters, gradients or
  // data: those are fixed here).
  EXPECT_EQ(count(svg, "<path "), kNumMemoryCategories);
  EXPECT_NE(svg.find("<title>activations</title></polygon>"), std::string::npos);
  EXPECT_NE(svg.find("<title>backward temporaries</title></polygon>"), std::string::npos);
  for (const char* fixed : {"parameters", "gradients", "data"})
    EXPECT_EQ(svg.find(std::string("<title>") + fixed + "</title></polygon>"), std::string::npos) << fixed;
  // Markers: a label per step, a dashed line per micro-batch in each panel, micro-batches numbered.
  EXPECT_NE(svg.find(">step 1</text>"), std::string::npos);
  EXPECT_NE(svg.find(">step 2</text>"), std::string::npos);
  EXPECT_EQ(svg.find(">step 3</text>"), std::string::npos);
  EXPECT_EQ(count(svg, "stroke-dasharray=\"2,3\"/>"), 2u * 8u + 1u);  // + the legend's sample
  EXPECT_NE(svg.find(">micro-batch</text>"), std::string::npos);
}

TEST_P(ReportTest, OneTimeGrowthLargerThanTheSawtoothIsNamedNotDrawn) {
  Rig rig(device(), /*adamw=*/true);
  memory::MemoryTracker tracker(device(), options(2));
  rig.epoch(tracker, 0, 8);
  // AdamW's two moments for 2,762 parameters (about 22 KiB) appear at step 1 and stay; the
  // sawtooth of micro-batches of 8 is a few KiB.
  const std::string svg = memory::memory_plot_svg(tracker);
  EXPECT_NE(svg.find("not drawn (see the top panel): optimizer state"), std::string::npos);
  EXPECT_NE(svg.find("allocated once in optimizer step 1"), std::string::npos);
  EXPECT_EQ(svg.find("<title>optimizer state</title></polygon>"), std::string::npos);
}

TEST_P(ReportTest, ALongWarmUpIsDrawnShortenedAndSaysSo) {
  Rig rig(device());
  memory::MemoryTracker tracker(device(), options(2));
  rig.epoch(tracker, 0, 8, /*slow_first=*/true);
  const std::string svg = memory::memory_plot_svg(tracker);
  EXPECT_NE(svg.find("drawn shortened on the time axis: forward of micro-batch 1 (epoch 1)"), std::string::npos);
  EXPECT_NE(svg.find("fill=\"url(#shortened)\""), std::string::npos);
}

TEST_P(ReportTest, NoTimelineStillGivesAValidPlotThatSaysSo) {
  Rig rig(device());
  memory::MemoryTracker tracker(device(), options(0));
  rig.epoch(tracker, 0, 8);
  const std::string svg = memory::memory_plot_svg(tracker);
  EXPECT_NE(svg.find("no timeline was recorded"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

TEST_P(ReportTest, JsonHasThePlannerObjectAfterTheSummaryOnlyWithAPlanCheck) {
  Rig rig(device());
  memory::MemoryTracker tracker(device(), options(2));
  rig.epoch(tracker, 0, 8);
  EXPECT_FALSE(nlohmann::json::parse(memory::memory_report_json(tracker)).contains("planner"));

  plan::PlanCheck check;
  check.micro_batch = 8;
  check.accum_steps = 4;
  check.setting = "recompute on";
  check.predicted_epoch_seconds = 1.25;
  check.predicted_peak_bytes = 123456;
  tracker.set_plan_check(check);
  auto j = nlohmann::ordered_json::parse(memory::memory_report_json(tracker));
  const std::vector<std::string> k = keys(j);
  const auto summary = std::find(k.begin(), k.end(), "summary");
  ASSERT_NE(summary, k.end());
  ASSERT_NE(summary + 1, k.end());
  EXPECT_EQ(*(summary + 1), "planner");
  EXPECT_EQ(keys(j["planner"]), (std::vector<std::string>{"micro_batch", "accum_steps", "setting",
                                                          "predicted_epoch_seconds", "predicted_peak_bytes"}))
      << "no measurement before measure_plan";
  EXPECT_EQ(j["planner"]["micro_batch"], 8);
  EXPECT_EQ(j["planner"]["accum_steps"], 4);
  EXPECT_EQ(j["planner"]["setting"], "recompute on");
  EXPECT_EQ(j["planner"]["predicted_epoch_seconds"], 1.25);
  EXPECT_EQ(j["planner"]["predicted_peak_bytes"], 123456);

  tracker.measure_plan(0, 1.5, 120000);  // epoch 0 as the tracker counts: the report says 1
  j = nlohmann::ordered_json::parse(memory::memory_report_json(tracker));
  EXPECT_EQ(j["planner"]["predicted_epoch_seconds"], 1.25);
  EXPECT_EQ(j["planner"]["measured_epoch"], 1);
  EXPECT_EQ(j["planner"]["measured_epoch_seconds"], 1.5);
  EXPECT_EQ(j["planner"]["measured_peak_bytes"], 120000);
}

TEST(PlanCheck, MeasuringNeedsAPredictionFirst) {
  memory::MemoryTracker tracker(Device::cpu(), options(0));
  EXPECT_FALSE(tracker.plan_check().has_value());
  try {
    tracker.measure_plan(0, 1.0, 1);
    FAIL() << "measure_plan without set_plan_check";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("set_plan_check"), std::string::npos) << e.what();
  }
}

TEST(PlanCheck, LineSaysThePredictionAndTheMeasurement) {
  plan::PlanCheck check;
  check.predicted_epoch_seconds = 12.345;
  check.predicted_peak_bytes = 3 << 20;
  EXPECT_EQ(plan::plan_check_line(check), "predicted 12.3 s an epoch and peak 3.0 MiB");
  check.measured = true;
  check.measured_epoch_seconds = 0.5;
  check.measured_peak_bytes = 512;
  EXPECT_EQ(plan::plan_check_line(check), "predicted 12.3 s an epoch and peak 3.0 MiB, measured 0.5 s and peak 512 B");
}

// Each report given a path is written, in order, and reported; one not given is not; a failed
// write names its file.
TEST_P(ReportTest, WrittenToTheFilesGivenAndAFailureNamesTheFile) {
  Rig rig(device());
  memory::MemoryTracker tracker(device(), options(2));
  rig.epoch(tracker, 0, 8);
  testing::TempDir dir;
  memory::MemoryReportFiles files;
  files.report.path = dir.file("memory.json");
  files.plot.path = dir.file("memory.svg");
  std::vector<std::string> written;
  memory::write_memory_reports(
      tracker, files, [&](const char* what, const std::string& path) { written.push_back(what + (" " + path)); });
  EXPECT_EQ(written,
            (std::vector<std::string>{"memory report " + files.report.path, "memory plot " + files.plot.path}));
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"memory.json", "memory.svg"}));
  std::ifstream report(files.report.path);
  EXPECT_EQ(nlohmann::ordered_json::parse(report)["schema_version"], memory::kMemoryReportSchemaVersion);
  files = memory::MemoryReportFiles();
  files.trace = {"rank 1's --trace", dir.file("missing/trace.json")};
  try {
    memory::write_memory_reports(tracker, files);
    FAIL() << "a trace written into a missing directory";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("rank 1's --trace: ", 0), 0u) << e.what();
  }
}

CUMULUS_INSTANTIATE_DEVICES(ReportTest);

}  // namespace
}  // namespace cumulus
