// apps/fashion_mnist end to end, on small generated IDX files: --help, usage errors (exit 2),
// runtime failures (exit 1), the seed's output format, metrics and reports, exact resume (also
// after SIGINT), out of memory under a budget, and weights in and out.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cumulus/core/device.h"
#include "cumulus/io/safetensors.h"
#include "test_util.h"
#include "toy_dataset.h"

namespace {

namespace fs = std::filesystem;
using cumulus::testing::quote;
using cumulus::testing::Result;
using cumulus::testing::run_command;

Result run_app(const std::string& args, const std::string& env = "") {
  return run_command((env.empty() ? "" : "env " + env + " ") + std::string(FASHION_MNIST_BIN) + " " + args + " 2>&1");
}

using cumulus::testing::put_be32;
using cumulus::testing::write_gz;
constexpr auto write_split = cumulus::testing::write_toy_split;

class AppTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("cumulus_app_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "data");
    write_split(dir_ / "data", "train", 2000, 1);
    write_split(dir_ / "data", "t10k", 300, 2);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static std::string path(const std::string& name) { return (dir_ / name).string(); }
  static std::string data_only() { return "--data " + quote(path("data")); }
  static std::string data_arg() { return data_only() + " --device cpu"; }
  static std::string read(const std::string& name) {
    std::ifstream f(path(name), std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  static fs::path dir_;
};
fs::path AppTest::dir_;

TEST_F(AppTest, HelpListsEveryOption) {
  const Result r = run_app("--help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* flag : {"--data", "--device", "--epochs", "--batch-size", "--accum-steps", "--accum-schedule",
                           "--effective-batch", "--memory-budget", "--lr", "--optimizer", "--momentum",
                           "--weight-decay", "--clip-grad-norm", "--normalize", "--shuffle", "--seed", "--init",
                           "--save", "--checkpoint", "--resume", "--memory-report", "--trace", "--memory-plot",
                           "--metrics", "--train-limit", "--test-limit", "--quiet", "--recompute", "--precision",
                           "--kernels", "--optimizer-bits", "--op-profile"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
}

TEST_F(AppTest, UsageErrorsExitTwoWithOneLine) {
  const std::string d = data_arg();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {d + " --batch-size 0", "--batch-size"},
      {d + " --batch-size -3", "--batch-size"},
      {d + " --epochs 0", "--epochs"},
      {d + " --accum-steps 0", "--accum-steps"},
      {d + " --lr -1", "--lr"},
      {"--data /nonexistent/dir", "/nonexistent/dir"},
      {data_only() + " --device tpu", "tpu"},
      {d + " --optimizer rmsprop", "rmsprop"},
      {d + " --normalize tokens", "tokens"},
      {d + " --accum-schedule 1:2", "epoch 0"},
      {d + " --accum-schedule 0:x", "0:x"},
      {d + " --memory-budget 12XB", "12XB"},
      {d + " --effective-batch 64", "--memory-budget"},
      {d + " --init /nonexistent.safetensors", "/nonexistent.safetensors"},
      {d + " --resume /nonexistent.safetensors", "/nonexistent.safetensors"},
      {d + " --save /nonexistent/dir/w.safetensors", "/nonexistent/dir"},
      {d + " --no-such-flag", "no-such-flag"},
      {d + " --epochs many", "many"},
      {d + " --precision fp8", "--precision"},
      {d + " --precision fp16 --normalize micro-batches", "--normalize samples"},
      {d + " --kernels cublas", "--kernels"},
      {d + " --optimizer-bits 16", "--optimizer-bits"},
      {d + " --optimizer-bits 8", "--optimizer-bits 8 needs optimizer state"},
      {d + " --kernels fused --model cnn", "--kernels fused"},
      {d + " --kernels fused --precision bf16", "--precision fp32"},
      {d + " --kernels fused --recompute on", "--recompute off"},
  };
  for (const auto& [args, needle] : cases) {
    const Result r = run_app(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(needle), std::string::npos) << args << "\n" << r.out;
    EXPECT_LE(std::count(r.out.begin(), r.out.end(), '\n'), 1) << args << "\n" << r.out;
  }
  if (!cumulus::cuda_available()) {
    const Result r = run_app(data_only() + " --device cuda");
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_NE(r.out.find("cuda"), std::string::npos) << r.out;
  }
}

TEST_F(AppTest, RunScriptAsTheReadmeShowsItTakesTheLastValueOfARepeatedFlag) {
  // scripts/run.sh passes --epochs 20 itself; the user's --epochs 1 after it must win.
  const fs::path bin = fs::path(FASHION_MNIST_BIN);
  const std::string cmd = "CUMULUS_SKIP_BUILD=1 CUMULUS_BUILD_DIR=" + quote(bin.parent_path().parent_path().string()) +
                          " CUMULUS_REPORTS_DIR=" + quote(path("run_sh_reports")) + " " +
                          quote(std::string(CUMULUS_SOURCE_DIR) + "/scripts/run.sh") + " --epochs 1 " + data_arg() +
                          " --train-limit 256 --test-limit 64 2>&1";
  const Result r = run_command(cmd);
  const std::string& out = r.out;
  ASSERT_EQ(r.exit_code, 0) << out;
  EXPECT_NE(out.find("Epoch 1\n---"), std::string::npos) << out;
  EXPECT_EQ(out.find("Epoch 2\n---"), std::string::npos) << out;
  for (const char* f : {"metrics.jsonl", "memory.json", "trace.json", "memory.svg", "weights.safetensors"})
    EXPECT_TRUE(fs::exists(path("run_sh_reports/" + std::string(f)))) << f;
}

TEST_F(AppTest, VersionEvalOnlyQuietAndWrappedHelp) {
  const Result version = run_app("--version");
  EXPECT_EQ(version.exit_code, 0);
  for (const char* k : {"cumulus", "commit", "build type", "CUDA", "cuDNN", "NCCL", "MPI"})
    EXPECT_NE(version.out.find(k), std::string::npos) << k << "\n" << version.out;

  // --eval-only on saved weights prints the test results the training run printed last.
  const std::string common = data_arg() + " --train-limit 512 --test-limit 100";
  const Result trained = run_app(common + " --quiet --epochs 1 --save " + quote(path("eval_w.st")));
  ASSERT_EQ(trained.exit_code, 0) << trained.out;
  const Result eval = run_app(common + " --quiet --eval-only --init " + quote(path("eval_w.st")));
  ASSERT_EQ(eval.exit_code, 0) << eval.out;
  const std::size_t at = trained.out.find("Test Results:");
  ASSERT_NE(at, std::string::npos) << trained.out;
  EXPECT_EQ(eval.out, trained.out.substr(at)) << "--eval-only must print the same result lines";

  // --quiet: the per-epoch results only, no planner, checkpoint or report lines.
  const Result quiet = run_app(common + " --quiet --epochs 1 --effective-batch 64 --memory-budget 64MiB --checkpoint " +
                               quote(path("quiet_ck.st")) + " --memory-report " + quote(path("quiet.json")));
  ASSERT_EQ(quiet.exit_code, 0) << quiet.out;
  EXPECT_EQ(quiet.out.rfind("Epoch 1\n---", 0), 0u) << quiet.out;
  for (const char* noise : {"planner", "checkpoint", "written", "memory per micro-batch"})
    EXPECT_EQ(quiet.out.find(noise), std::string::npos) << noise << "\n" << quiet.out;

  // Help fits an 80-column terminal.
  const Result help = run_app("--help", "COLUMNS=80");
  std::istringstream lines(help.out);
  for (std::string line; std::getline(lines, line);) EXPECT_LE(line.size(), 80u) << line;
}

// --recompute on keeps less for backward and trains the same weights, bit for bit on the CPU.
TEST_F(AppTest, RecomputeTrainsTheSameWeightsWithLessActivationMemory) {
  for (const char* mode : {"off", "on"}) {
    const Result r = run_app(data_arg() + " --model cnn --epochs 1 --train-limit 96 --test-limit 32 --batch-size 32 --quiet" +
                             " --recompute " + mode + " --save " + quote(path(std::string("rc_") + mode + ".safetensors")) +
                             " --memory-report " + quote(path(std::string("rc_") + mode + ".json")));
    ASSERT_EQ(r.exit_code, 0) << r.out;
  }
  EXPECT_EQ(read("rc_off.safetensors"), read("rc_on.safetensors"));
  const nlohmann::json off = nlohmann::json::parse(read("rc_off.json"));
  const nlohmann::json on = nlohmann::json::parse(read("rc_on.json"));
  EXPECT_FALSE(off["summary"].contains("recompute"));
  ASSERT_TRUE(on["summary"].contains("recompute")) << on["summary"].dump();
  EXPECT_LT(on["micro_batches"][0]["activation_bytes"].get<int64_t>(),
            off["micro_batches"][0]["activation_bytes"].get<int64_t>());
  EXPECT_LT(on["summary"]["peak_bytes"].get<int64_t>(), off["summary"]["peak_bytes"].get<int64_t>());
}

// --optimizer-state host trains the same weights bit for bit as the state on the device; the
// memory report shows the state in the host's own pool, none of it in the device's figures, and a
// peak lower by about the state (AdamW's moments: 8 bytes per parameter).
TEST_F(AppTest, HostResidentOptimizerStateTrainsTheSameWeights) {
  std::vector<std::string> devices = {"cpu"};
  if (cumulus::cuda_available()) devices.push_back("cuda");
  for (const std::string& device : devices) {
    for (const char* where : {"device", "host"}) {
      const std::string tag = device + "_" + where;
      const Result r = run_app(data_only() + " --device " + device + " --graphs off --epochs 1 --batch-size 16" +
                               " --accum-steps 4 --optimizer adamw --clip-grad-norm 1 --quiet --optimizer-state " +
                               where + " --save " + quote(path("os_" + tag + ".safetensors")) +
                               " --memory-report " + quote(path("os_" + tag + ".json")) + " --memory-plot " +
                               quote(path("os_" + tag + ".svg")));
      ASSERT_EQ(r.exit_code, 0) << tag << "\n" << r.out;
    }
    EXPECT_NE(read("os_" + device + "_host.svg").find("optimizer state on the host"), std::string::npos);
    EXPECT_EQ(read("os_" + device + "_device.svg").find("optimizer state on the host"), std::string::npos);
    EXPECT_EQ(read("os_" + device + "_device.safetensors"), read("os_" + device + "_host.safetensors")) << device;
    const nlohmann::json on_device = nlohmann::json::parse(read("os_" + device + "_device.json"))["summary"];
    const nlohmann::json on_host = nlohmann::json::parse(read("os_" + device + "_host.json"))["summary"];
    const int64_t moments = on_device["optimizer_state_bytes"].get<int64_t>();
    EXPECT_GT(moments, 2 * on_device["parameters_bytes"].get<int64_t>() - 4096) << on_device.dump();
    EXPECT_EQ(on_device["host_optimizer_state_bytes"].get<int64_t>(), 0);
    EXPECT_EQ(on_host["optimizer_state_bytes"].get<int64_t>(), 0) << on_host.dump();
    // The moments and the host copies of the weights and gradients.
    EXPECT_EQ(on_host["host_optimizer_state_bytes"].get<int64_t>(), 2 * moments) << on_host.dump();
    EXPECT_LE(on_host["peak_bytes"].get<int64_t>(), on_device["peak_bytes"].get<int64_t>() - moments);
  }
}

// --data-on host trains the same weights bit for bit as device-resident data. On the CPU the
// option only changes nothing; on CUDA (when present) the dataset leaves the device: the data
// category holds the two staging slots, eagerly and with CUDA graphs.
TEST_F(AppTest, HostResidentDataTrainsTheSameWeights) {
  std::vector<std::string> devices = {"cpu"};
  if (cumulus::cuda_available()) devices.push_back("cuda");
  for (const std::string& device : devices) {
    std::vector<std::string> graph_modes = {"off"};
    if (device == "cuda") graph_modes.push_back("on");
    for (const std::string& graphs : graph_modes) {
      for (const char* where : {"device", "host"}) {
        const std::string tag = device + "_" + graphs + "_" + where;
        // 2000 / 16 = 125 micro-batches: 31 steps of 4 and a partial last group; shuffled.
        const Result r = run_app(data_only() + " --device " + device + " --graphs " + graphs +
                                 " --epochs 2 --batch-size 16 --accum-steps 4 --shuffle --momentum 0.9 --quiet" +
                                 " --data-on " + where + " --save " + quote(path("dh_" + tag + ".safetensors")) +
                                 " --memory-report " + quote(path("dh_" + tag + ".json")));
        ASSERT_EQ(r.exit_code, 0) << tag << "\n" << r.out;
      }
      const std::string tag = device + "_" + graphs + "_";
      EXPECT_EQ(read("dh_" + tag + "device.safetensors"), read("dh_" + tag + "host.safetensors")) << tag;
      const nlohmann::json on_device = nlohmann::json::parse(read("dh_" + tag + "device.json"));
      const nlohmann::json on_host = nlohmann::json::parse(read("dh_" + tag + "host.json"));
      EXPECT_EQ(on_host["settings"]["data-on"], "host");
      EXPECT_EQ(on_device["settings"]["data-on"], "device");
      if (device == "cuda") {
        // The dataset (2300 x 784 B) is gone from the device; two slots of 16 samples stay.
        EXPECT_GT(on_device["summary"]["data_bytes"].get<int64_t>(), 2000 * 784);
        EXPECT_LT(on_host["summary"]["data_bytes"].get<int64_t>(), 200 * 1024) << on_host["summary"].dump();
        EXPECT_LT(on_host["summary"]["peak_bytes"].get<int64_t>(), on_device["summary"]["peak_bytes"].get<int64_t>());
      }
    }
  }
}

// --recompute auto: the planner predicts every divisor with every subset of the CNN's two
// segments and takes the fastest plan that fits. Which one is fastest is measured (the probes'
// times), so the test holds the memory side exactly and the run to the choice the planner announced.
TEST_F(AppTest, PlannerPredictsEveryRecomputeSubsetAndTheRunFollowsItsChoice) {
  const std::string args = data_arg() + " --model cnn --epochs 1 --train-limit 512 --test-limit 32 --effective-batch 512" +
                           " --recompute auto --memory-budget ";
  // 130 MiB: 256 reserves ~160 MiB as is, ~120 MiB with recompute (CPU, 512-B rounding, 2 MiB segments).
  for (const auto& [budget, without, with_all] :
       {std::tuple<std::string, std::string, std::string>{"130MiB", "128", "256"}, {"400MiB", "512", "512"}}) {
    const Result r = run_app(args + budget);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    for (const auto& [setting, largest] : {std::pair<std::string, std::string>{"recompute off,", without},
                                           {"recompute conv1+bn1,", ""},
                                           {"recompute conv2+bn2,", ""},
                                           {"recompute all,", with_all}}) {
      const std::size_t line = r.out.find("  " + setting);
      ASSERT_NE(line, std::string::npos) << setting << " not weighed\n" << r.out;
      const std::string text = r.out.substr(line, r.out.find('\n', line) - line);
      if (!largest.empty()) EXPECT_NE(text.find("largest fitting " + largest), std::string::npos) << text;
    }
    const std::size_t choice = r.out.find("planner: micro-batch ");  // "...: predicted peak ..."
    ASSERT_NE(choice, std::string::npos) << r.out;
    const std::string plan = r.out.substr(choice, r.out.find(": predicted", choice) - choice);
    const bool on = plan.find(" with recompute ") != std::string::npos;
    EXPECT_EQ(r.out.find("recompute: on (activations of segments ") != std::string::npos, on) << r.out;
    EXPECT_EQ(r.out.find("recompute on: ") != std::string::npos, on) << r.out;  // the memory table
  }
  Result r = run_app(data_arg() + " --recompute auto --epochs 1");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--recompute auto lets the planner decide"), std::string::npos) << r.out;
}

// --precision auto: bf16 is weighed beside fp32 (the table has both), and the run trains in the
// precision the planner chose; without the opt-in no bf16 row is predicted.
TEST_F(AppTest, PlannerWeighsBf16OnlyWithPrecisionAuto) {
  const std::string args = data_arg() + " --epochs 1 --train-limit 512 --test-limit 32 --effective-batch 128" +
                           " --memory-budget 64MiB --metrics ";
  const Result r = run_app(args + quote(path("auto_precision.jsonl")) + " --precision auto");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("  recompute off, data on device, bf16"), std::string::npos) << r.out;
  const nlohmann::json m =
      nlohmann::json::parse(read("auto_precision.jsonl").substr(0, read("auto_precision.jsonl").find('\n')));
  const bool bf16 = r.out.find("effective batch 128 with bf16:") != std::string::npos;
  EXPECT_EQ(m["precision"], bf16 ? "bf16" : "fp32") << r.out;
  const Result plain = run_app(args + quote(path("plain_precision.jsonl")));
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  EXPECT_EQ(plain.out.find("bf16"), std::string::npos) << plain.out;
  EXPECT_EQ(run_app(data_arg() + " --precision auto --epochs 1").exit_code, 2);
}

// --optimizer-bits auto and --optimizer-state auto are the planner's levers: without the planner a
// usage error naming the flag; under a budget every f32 plan fits, the planner keeps the state as
// it is and the run trains the weights of the explicit flags (the 8-bit and host choices
// themselves: test_planner.cpp).
TEST_F(AppTest, StateLeversAreThePlannersAndKeepTheStateWhenItFits) {
  for (const char* flag : {"--optimizer-bits", "--optimizer-state"}) {
    const Result r = run_app(data_arg() + " --optimizer adamw --epochs 1 " + flag + " auto");
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_NE(r.out.find(std::string(flag) + " auto lets the planner decide"), std::string::npos) << r.out;
  }
  const std::string run = data_arg() + " --optimizer adamw --epochs 1 --effective-batch 64 --memory-budget 256MiB";
  Result r = run_app(run + " --optimizer-bits auto --optimizer-state auto --memory-report " +
                     quote(path("levers_auto.json")) + " --save " + quote(path("levers_auto.safetensors")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = run_app(run + " --optimizer-bits 32 --optimizer-state device --save " + quote(path("levers_set.safetensors")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(read("levers_auto.safetensors"), read("levers_set.safetensors"));
  const nlohmann::json report = nlohmann::json::parse(read("levers_auto.json"));
  EXPECT_EQ(report["settings"]["optimizer-bits"], "32");
  EXPECT_EQ(report["settings"]["optimizer-state"], "device");
}

TEST_F(AppTest, PlanOnlyPrintsOneRowPerCandidateAndTrainsNothing) {
  const Result r = run_app(data_arg() + " --effective-batch 64 --memory-budget 64MiB --plan-only --metrics " +
                           quote(path("plan_only.jsonl")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.find("Epoch 1"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(path("plan_only.jsonl"))) << "--plan-only trained";
  // One row per divisor of 64: the size, recompute, data placement, precision, where the optimizer
  // state lives and its bits, the peak in MiB,
  // reserved bytes, fits, the accumulation steps, the predicted time of an effective batch (ms),
  // of it the collectives (ms: none in one process), its spread over the repeated timings (ms,
  // "low-high") and of an epoch (s), and a '*' on the chosen row.
  std::istringstream lines(r.out);
  std::vector<long> sizes;
  int chosen = 0;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream row(line);
    long size = 0, reserved = 0, accum = 0;
    double peak_mib = 0, batch_ms = 0, comm_ms = -1, epoch_s = 0;
    long bits = 0, zero = -1;
    std::string recompute, data, precision, state, fits, spread, star;
    if (row >> size >> recompute >> data >> precision >> state >> bits >> zero >> peak_mib >> reserved >> fits >>
        accum >> batch_ms >> comm_ms >> spread >> epoch_s) {
      sizes.push_back(size);
      if (row >> star) chosen += star == "*" ? 1 : 0;
      EXPECT_EQ(recompute, "off") << line;
      EXPECT_EQ(data, "device") << line;
      EXPECT_EQ(precision, "fp32") << line;
      EXPECT_EQ(state, "device") << line;
      EXPECT_EQ(bits, 32) << line;
      EXPECT_EQ(zero, 0) << line;
      EXPECT_GT(peak_mib, 0.0) << line;
      EXPECT_TRUE(fits == "yes" || fits == "no") << line;
      EXPECT_EQ(size * accum, 64) << line;
      EXPECT_GT(batch_ms, 0.0) << line;
      EXPECT_EQ(comm_ms, 0.0) << "one process communicates nothing: " << line;
      const std::size_t dash = spread.find('-');
      ASSERT_NE(dash, std::string::npos) << line;
      EXPECT_LE(std::stod(spread.substr(0, dash)), batch_ms + 1e-3) << line;
      EXPECT_GE(std::stod(spread.substr(dash + 1)), batch_ms - 1e-3) << line;
      EXPECT_GT(epoch_s, 0.0) << line;
    }
  }
  EXPECT_EQ(sizes, (std::vector<long>{64, 32, 16, 8, 4, 2, 1})) << r.out;
  EXPECT_EQ(chosen, 1) << r.out;
  EXPECT_NE(r.out.find("planner: micro-batch "), std::string::npos) << "no choice printed\n" << r.out;
}

TEST_F(AppTest, LearningRateScheduleFlagsReachTheOptimizer) {
  // 256 samples in micro-batches of 32: 8 optimizer steps per epoch. StepLR halves the rate every
  // 3 steps, so the last step of epoch 2 (step 15) runs at lr / 2^5.
  const Result r = run_app(data_arg() + " --quiet --train-limit 256 --test-limit 64 --batch-size 32 --epochs 2 "
                           "--lr 0.1 --lr-schedule step --lr-step-size 3 --lr-gamma 0.5 --metrics " +
                           quote(path("sched.jsonl")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::istringstream lines(read("sched.jsonl"));
  std::string first, second;
  std::getline(lines, first);
  std::getline(lines, second);
  EXPECT_FLOAT_EQ(nlohmann::json::parse(first)["lr"].get<float>(), 0.1f / 4);   // step 7: 2 halvings
  EXPECT_FLOAT_EQ(nlohmann::json::parse(second)["lr"].get<float>(), 0.1f / 32);  // step 15: 5 halvings
  // Cosine with warmup, AdamW betas and eps, SGD Nesterov: accepted and trained.
  EXPECT_EQ(run_app(data_arg() + " --quiet --train-limit 256 --test-limit 64 --epochs 1 --lr-schedule cosine "
                    "--warmup-steps 2 --min-lr 1e-5 --optimizer adamw --betas 0.8,0.99 --eps 1e-6 --threads 1")
                .exit_code,
            0);
  EXPECT_EQ(run_app(data_arg() + " --quiet --train-limit 256 --test-limit 64 --epochs 1 --momentum 0.9 --nesterov")
                .exit_code,
            0);
  EXPECT_EQ(run_app(data_arg() + " --lr-schedule step").exit_code, 2);
  EXPECT_EQ(run_app(data_arg() + " --nesterov").exit_code, 2);
  EXPECT_EQ(run_app(data_arg() + " --betas 0.9").exit_code, 2);
}

TEST_F(AppTest, CorruptDataIsARuntimeFailureNamingTheFile) {
  fs::create_directories(path("bad"));
  for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                        "t10k-labels-idx1-ubyte.gz"})
    fs::copy_file(path("data/") + f, path("bad/") + f, fs::copy_options::overwrite_existing);
  std::string wrong_magic;
  put_be32(wrong_magic, 0x999);
  write_gz(path("bad/train-labels-idx1-ubyte.gz"), wrong_magic + std::string(100, '\0'));
  const Result r = run_app("--data " + quote(path("bad")) + " --device cpu --epochs 1");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("train-labels-idx1-ubyte.gz"), std::string::npos) << r.out;
}

TEST_F(AppTest, TrainsPrintsTheSeedFormatAndWritesEveryReport) {
  const Result r = run_app(data_arg() + " --epochs 2 --batch-size 16 --accum-steps 4 --lr 0.05 --metrics " +
                           quote(path("m.jsonl")) + " --memory-report " + quote(path("mem.json")) + " --trace " +
                           quote(path("trace.json")) + " --memory-plot " + quote(path("plot.svg")) + " --save " +
                           quote(path("w.safetensors")) + " --op-profile " + quote(path("ops.json")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("Epoch 1\n-------------------\nTest Results:\n Accuracy: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Epoch 2\n-------------------\nTest Results:\n Accuracy: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("micro-batch 16 x 4 steps = effective batch 64"), std::string::npos) << r.out;

  std::istringstream lines(read("m.jsonl"));
  std::string line;
  std::vector<nlohmann::json> epochs;
  while (std::getline(lines, line)) epochs.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(epochs.size(), 2u);
  for (const char* k : {"epoch", "train_loss", "test_loss", "test_accuracy", "samples_per_s", "optimizer_steps", "peak_bytes"})
    EXPECT_TRUE(epochs[0].contains(k)) << k;
  EXPECT_FALSE(epochs[0].contains("predicted_epoch_seconds"));  // only when the planner chose the plan
  EXPECT_EQ(epochs[1]["optimizer_steps"], 2 * 32);  // 2000 / 16 = 125 micro-batches: 31 groups of 4 and one of 1
  // The toy is learnable: the second epoch must be well above chance.
  EXPECT_GT(epochs[1]["test_accuracy"].get<double>(), 0.5) << r.out;
  EXPECT_LT(epochs[1]["train_loss"].get<double>(), epochs[0]["train_loss"].get<double>());

  const auto mem = nlohmann::json::parse(read("mem.json"));
  EXPECT_EQ(mem["micro_batches"].size(), 250u);
  EXPECT_FALSE(mem.contains("planner"));
  EXPECT_EQ(mem["steps"].size(), 64u);
  EXPECT_TRUE(nlohmann::json::parse(read("trace.json")).contains("traceEvents"));
  EXPECT_NE(read("plot.svg").find("</svg>"), std::string::npos);
  EXPECT_GT(fs::file_size(path("w.safetensors")), 669706u * 4);
  // The op profile of the second epoch: its 32 updates, 125 micro-batches of three Linears.
  const auto ops = nlohmann::json::parse(read("ops.json"));
  EXPECT_EQ(ops["per"], 1);
  EXPECT_EQ(ops["per_name"], "epoch");
  std::map<std::string, int64_t> calls;
  for (const auto& op : ops["ops"]) calls[op["op"].get<std::string>()] = op["calls"].get<int64_t>();
  EXPECT_EQ(calls["optimizer update"], 32) << ops.dump();
  EXPECT_EQ(calls["linear+relu"] + calls["linear"], 3 * 125) << ops.dump();
  EXPECT_EQ(calls["cross_entropy backward"], 125) << ops.dump();
  EXPECT_NE(r.out.find("op time on cpu: "), std::string::npos) << r.out;
}

TEST_F(AppTest, ResumeIsBitwiseExact) {
  const std::string common = data_arg() + " --quiet --batch-size 16 --accum-steps 4 --optimizer adamw --shuffle --seed 9";
  ASSERT_EQ(run_app(common + " --epochs 2 --save " + quote(path("straight.safetensors"))).exit_code, 0);
  ASSERT_EQ(run_app(common + " --epochs 1 --checkpoint " + quote(path("ck.safetensors"))).exit_code, 0);
  const Result r = run_app(common + " --epochs 2 --resume " + quote(path("ck.safetensors")) + " --save " +
                           quote(path("resumed.safetensors")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.find("Epoch 1\n"), std::string::npos) << "the resumed run must start at epoch 2";
  EXPECT_TRUE(read("straight.safetensors") == read("resumed.safetensors")) << "weights differ after resume";

  // Resuming with other settings is refused.
  const Result other = run_app(data_arg() + " --quiet --batch-size 32 --accum-steps 2 --optimizer adamw --shuffle "
                               "--seed 9 --epochs 2 --resume " + quote(path("ck.safetensors")));
  EXPECT_EQ(other.exit_code, 2) << other.out;
  EXPECT_NE(other.out.find("was made with"), std::string::npos) << other.out;
}

// --optimizer-bits 8 (Note [8-bit optimizer state]): the 8-bit AdamW moments go through the
// checkpoint, so a resumed run ends with the straight run's bits; resumed with fp32 state it is refused.
TEST_F(AppTest, EightBitOptimizerStateResumesBitwiseExact) {
  const std::string common = data_arg() + " --quiet --batch-size 16 --accum-steps 4 --optimizer adamw --shuffle --seed 9";
  const std::string eight = common + " --optimizer-bits 8";
  ASSERT_EQ(run_app(eight + " --epochs 2 --save " + quote(path("straight8.safetensors"))).exit_code, 0);
  ASSERT_EQ(run_app(eight + " --epochs 1 --checkpoint " + quote(path("ck8.safetensors"))).exit_code, 0);
  const Result r = run_app(eight + " --epochs 2 --resume " + quote(path("ck8.safetensors")) + " --save " +
                           quote(path("resumed8.safetensors")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(read("straight8.safetensors") == read("resumed8.safetensors")) << "weights differ after resume";
  const Result other = run_app(common + " --epochs 2 --resume " + quote(path("ck8.safetensors")));
  EXPECT_EQ(other.exit_code, 2) << other.out;
  EXPECT_NE(other.out.find("--optimizer-bits 8, this run has 32"), std::string::npos) << other.out;
}

// Note [Mixed precision]: bf16 and fp16 learn the toy as fp32 does, keep half the activation bytes
// per sample, and fp16's loss scale and its count of clean steps go through a checkpoint.
// --kernels fused (Note [Fused MLP] in engine/ops/fused_mlp.cpp) trains the weights of the generic
// path: the same bits on the CPU, within 1e-5 relative per tensor on CUDA after 2 epochs; two fused
// runs give the same bits. The banner, the metrics and the memory report name the path.
TEST_F(AppTest, FusedKernelsTrainTheGenericPathsWeights) {
  std::vector<std::string> devices = {"cpu"};
  if (cumulus::cuda_available()) devices.push_back("cuda");
  for (const std::string& device : devices) {
    const std::string common = data_only() + " --device " + device +
                               " --epochs 2 --batch-size 16 --accum-steps 4 --shuffle --momentum 0.9";
    auto run = [&](const std::string& kernels, const std::string& tag) {
      const std::string name = "k_" + device + "_" + tag;
      const Result r = run_app(common + " --kernels " + kernels + " --save " + quote(path(name + ".safetensors")) +
                               " --metrics " + quote(path(name + ".jsonl")) + " --memory-report " +
                               quote(path(name + ".json")));
      EXPECT_EQ(r.exit_code, 0) << name << "\n" << r.out;
      EXPECT_NE(r.out.find("kernels: " + kernels), std::string::npos) << name << ": the banner names the path\n"
                                                                      << r.out;
      const nlohmann::json report = nlohmann::json::parse(read(name + ".json"));
      EXPECT_EQ(report["settings"]["kernels"], kernels) << name;
      // What the fused op keeps for backward, analytically: two hidden outputs of 16 x 512 floats,
      // the head's 16 x 10 and the loss scalar, each in 512-byte blocks.
      if (kernels == "fused")
        EXPECT_EQ(report["micro_batches"][0]["activation_bytes"].get<int64_t>(), 2 * 32768 + 1024 + 512) << name;
      std::istringstream lines(read(name + ".jsonl"));
      std::string first;
      std::getline(lines, first);
      EXPECT_EQ(nlohmann::json::parse(first)["kernels"], kernels) << name;
      return name + ".safetensors";
    };
    const std::string generic = run("generic", "generic");
    const std::string fused = run("fused", "fused");
    const std::string again = run("fused", "fused_again");
    EXPECT_TRUE(read(fused) == read(again)) << device << ": two fused runs differ";
    if (device == "cpu") {
      EXPECT_TRUE(read(fused) == read(generic)) << "on the CPU the fused op is the generic arithmetic";
      continue;
    }
    const auto a = cumulus::io::load_safetensors(path(fused)).tensors;
    const auto b = cumulus::io::load_safetensors(path(generic)).tensors;
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      const std::vector<float> va = a[i].second.to_vector<float>(), vb = b[i].second.to_vector<float>();
      EXPECT_LT(cumulus::testing::max_rel_diff(va, vb), 1e-5) << a[i].first;
    }
  }
}

TEST_F(AppTest, MixedPrecisionTrainsHalvesActivationsAndResumesTheLossScaleExactly) {
  const std::string common = data_arg() + " --quiet --batch-size 16 --accum-steps 4 --lr 0.05";
  std::map<std::string, double> per_sample, accuracy;
  for (const std::string p : {"fp32", "bf16", "fp16"}) {
    const Result r = run_app(common + " --epochs 2 --precision " + p + " --metrics " + quote(path(p + ".jsonl")) +
                             " --memory-report " + quote(path(p + ".json")));
    ASSERT_EQ(r.exit_code, 0) << p << "\n" << r.out;
    std::istringstream lines(read(p + ".jsonl"));
    nlohmann::json last;
    for (std::string line; std::getline(lines, line);) last = nlohmann::json::parse(line);
    EXPECT_EQ(last["precision"], p);
    accuracy[p] = last["test_accuracy"].get<double>();
    per_sample[p] = nlohmann::json::parse(read(p + ".json"))["summary"]["activation_bytes_per_unit"].get<double>();
    if (p == "fp16") EXPECT_EQ(last["loss_scale"].get<double>(), 65536.0) << "no overflow on the toy: unchanged";
  }
  for (const char* p : {"bf16", "fp16"}) {
    EXPECT_NEAR(accuracy[p], accuracy["fp32"], 0.05) << p;
    // One micro-batch size: bytes / samples, with the 512-byte rounding of the loss and logits.
    EXPECT_NEAR(per_sample[p], per_sample["fp32"] / 2, 512.0 / 16) << p;
  }
  // The CNN too; its per-channel batch-norm statistics stay f32 (four 512-byte blocks per micro-batch).
  for (const std::string p : {"fp32", "bf16"}) {
    const Result r = run_app(common + " --model cnn --epochs 1 --train-limit 192 --test-limit 64 --precision " + p +
                             " --memory-report " + quote(path("cnn_" + p + ".json")));
    ASSERT_EQ(r.exit_code, 0) << p << "\n" << r.out;
    per_sample["cnn_" + p] =
        nlohmann::json::parse(read("cnn_" + p + ".json"))["summary"]["activation_bytes_per_unit"].get<double>();
  }
  EXPECT_NEAR(per_sample["cnn_bf16"], per_sample["cnn_fp32"] / 2, 4 * 512.0 / 16);
  const std::string fp16 = common + " --precision fp16";
  ASSERT_EQ(run_app(fp16 + " --epochs 2 --save " + quote(path("straight.safetensors"))).exit_code, 0);
  ASSERT_EQ(run_app(fp16 + " --epochs 1 --checkpoint " + quote(path("ck.safetensors"))).exit_code, 0);
  const Result r = run_app(fp16 + " --epochs 2 --resume " + quote(path("ck.safetensors")) + " --save " +
                           quote(path("resumed.safetensors")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(read("straight.safetensors") == read("resumed.safetensors")) << "fp16 weights differ after resume";
  // The scale (65536's bits) and the epoch's 32 clean steps, which the resumed run continues from.
  const std::string ck = read("ck.safetensors");
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = header_bytes << 8 | static_cast<unsigned char>(ck[i]);
  const auto meta = nlohmann::json::parse(ck.substr(8, header_bytes))["__metadata__"];
  EXPECT_EQ(meta["loss_scale_bits"], "1199570944");
  EXPECT_EQ(meta["loss_scale_clean_steps"], "32");
  const Result other = run_app(data_arg() + " --quiet --batch-size 16 --accum-steps 4 --lr 0.05 --epochs 2 "
                               "--precision bf16 --resume " + quote(path("ck.safetensors")));
  EXPECT_EQ(other.exit_code, 2) << other.out;
  EXPECT_NE(other.out.find("--precision fp16"), std::string::npos) << other.out;
}

TEST_F(AppTest, SigintFinishesTheStepWritesTheCheckpointAndResumesExactly) {
  const std::string loud =
      data_arg() + " --batch-size 2 --accum-steps 3 --momentum 0.9 --lr 0.01 --epochs 2 --train-limit 800";
  const std::string common = loud + " --quiet";
  ASSERT_EQ(run_app(common + " --save " + quote(path("s3.safetensors"))).exit_code, 0);
  fs::remove(path("ck_int.safetensors"));
  for (int attempt = 0; attempt < 4; ++attempt) {
    // Not quiet: the banner on stdout says the run is past loading (its signal handlers are in
    // place since the start of run()); SIGINT follows it by a delay, never by a guess at start-up.
    const std::string cmd = std::string(FASHION_MNIST_BIN) + " " + loud + " --checkpoint " +
                            quote(path("ck_int.safetensors")) + " 2> /dev/null";
    int out[2];
    ASSERT_EQ(::pipe(out), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      ::close(out[0]);
      ::close(out[1]);
      ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(out[1]);
    FILE* stdout_of_app = ::fdopen(out[0], "r");
    ASSERT_NE(stdout_of_app, nullptr);
    char line[4096];
    while (std::fgets(line, sizeof line, stdout_of_app) != nullptr && std::string(line).rfind("device:", 0) != 0) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50 + 150 * attempt));
    ::kill(pid, SIGINT);
    while (std::fgets(line, sizeof line, stdout_of_app) != nullptr) {  // drain: the app never blocks on a write
    }
    std::fclose(stdout_of_app);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status)) << "the app must exit, not die of the signal";
    if (WEXITSTATUS(status) == 0) continue;  // finished before the signal: try again later in the run
    EXPECT_EQ(WEXITSTATUS(status), 130);
    ASSERT_TRUE(fs::exists(path("ck_int.safetensors")));
    const Result r = run_app(common + " --resume " + quote(path("ck_int.safetensors")) + " --save " +
                             quote(path("r3.safetensors")));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_TRUE(read("s3.safetensors") == read("r3.safetensors")) << "weights differ after SIGINT and resume";
    return;
  }
  GTEST_SKIP() << "the run always finished before SIGINT arrived";
}

TEST_F(AppTest, OutOfMemoryUnderABudgetReportsSavesAndExitsOne) {
  // What the run holds at rest (12 MiB reserved: parameters, gradients, data) fits in 14 MiB; a
  // micro-batch of 2000 samples does not.
  const Result r = run_app(data_arg() + " --epochs 1 --batch-size 2000 --memory-budget 14MiB --checkpoint " +
                           quote(path("oom.safetensors")) + " --memory-report " + quote(path("oom.json")));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("out of memory on cpu"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("activations"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(path("oom.safetensors"))) << r.out;
  EXPECT_TRUE(nlohmann::json::parse(read("oom.json")).contains("summary"));
}

TEST_F(AppTest, PlannerFitsTheEffectiveBatchToTheBudget) {
  // 13 MiB: reserved at rest is 12 MiB here (parameters and gradients in 4 MiB segments, data in 2
  // MiB ones); 128 x 2 fits in it, 256 x 1 reserves 14 MiB (predicted and measured).
  const Result r = run_app(data_arg() + " --epochs 1 --effective-batch 256 --memory-budget 13MiB "
                           "--metrics " + quote(path("plan.jsonl")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("planner: micro-batch"), std::string::npos) << r.out;
  const auto m = nlohmann::json::parse(read("plan.jsonl").substr(0, read("plan.jsonl").find('\n')));
  EXPECT_LT(m["micro_batch_size"].get<int64_t>(), 256);
  EXPECT_EQ(256 % m["micro_batch_size"].get<int64_t>(), 0);
  EXPECT_LE(m["peak_bytes"].get<int64_t>(), 13 << 20);
}

TEST_F(AppTest, PlannerComparesItsPredictionWithTheFirstEpoch) {
  const Result r = run_app(data_arg() + " --epochs 2 --effective-batch 256 --memory-budget 13MiB --metrics " +
                           quote(path("plan_check.jsonl")) + " --memory-report " + quote(path("plan_check.json")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  // One line, after the first epoch only.
  const std::string marker = " s an epoch and peak ";
  const std::size_t at = r.out.find(marker);
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(marker, at + 1), std::string::npos) << r.out;
  const std::size_t start = r.out.rfind('\n', at) + 1;
  const std::string line = r.out.substr(start, r.out.find('\n', at) - start);
  EXPECT_EQ(line.rfind("planner: predicted ", 0), 0u) << line;
  EXPECT_NE(line.find(", measured "), std::string::npos) << line;
  EXPECT_NE(line.find(" s and peak "), std::string::npos) << line;
  EXPECT_LT(at, r.out.find("Epoch 1\n")) << r.out;

  std::istringstream lines(read("plan_check.jsonl"));
  std::string text;
  std::vector<nlohmann::json> epochs;
  while (std::getline(lines, text)) epochs.push_back(nlohmann::json::parse(text));
  ASSERT_EQ(epochs.size(), 2u);
  for (const nlohmann::json& m : epochs) {
    EXPECT_GT(m["predicted_epoch_seconds"].get<double>(), 0.0);
    EXPECT_GT(m["epoch_seconds"].get<double>(), 0.0);
    // The planner's peak is the recorded sequence's; the loop adds a few KiB it does not see (the
    // Trainer's learning-rate table and loss seed, Note [Planning a micro-batch]).
    const int64_t predicted = m["predicted_peak_bytes"].get<int64_t>(), measured = m["peak_bytes"].get<int64_t>();
    EXPECT_GT(predicted, 0);
    EXPECT_LE(predicted, measured);
    EXPECT_LE(measured - predicted, 64 << 10);
  }
  const auto report = nlohmann::json::parse(read("plan_check.json"));
  ASSERT_TRUE(report.contains("planner")) << read("plan_check.json");
  const nlohmann::json& p = report["planner"];
  EXPECT_EQ(p["predicted_epoch_seconds"], epochs[0]["predicted_epoch_seconds"]);
  EXPECT_EQ(p["predicted_peak_bytes"], epochs[0]["predicted_peak_bytes"]);
  EXPECT_EQ(p["measured_epoch"], 1);
  EXPECT_EQ(p["measured_epoch_seconds"], epochs[0]["epoch_seconds"]);
  EXPECT_EQ(p["measured_peak_bytes"], epochs[0]["peak_bytes"]);
  EXPECT_TRUE(report.contains("summary"));
}

TEST_F(AppTest, TrainsTheCnnAndResumesItExactly) {
  const std::string common = data_arg() + " --model cnn --optimizer adamw --batch-size 16 --accum-steps 2 "
                             "--train-limit 192 --test-limit 64 --shuffle --seed 4";
  const Result r = run_app(common + " --epochs 2 --metrics " + quote(path("cnn.jsonl")) + " --save " +
                           quote(path("cnn_straight.safetensors")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("batch norm: statistics per micro-batch"), std::string::npos) << r.out;
  const auto m = nlohmann::json::parse(read("cnn.jsonl").substr(0, read("cnn.jsonl").find('\n')));
  EXPECT_EQ(m["model"], "cnn");
  EXPECT_EQ(m["batch_norm_statistics_samples"], 16);
  // Batch-norm buffers travel with the weights, and resuming restores them exactly.
  EXPECT_NE(read("cnn_straight.safetensors").find("1.running_mean"), std::string::npos);
  ASSERT_EQ(run_app(common + " --quiet --epochs 1 --checkpoint " + quote(path("cnn_ck.safetensors"))).exit_code, 0);
  const Result resumed = run_app(common + " --quiet --epochs 2 --resume " + quote(path("cnn_ck.safetensors")) +
                                 " --save " + quote(path("cnn_resumed.safetensors")));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out;
  EXPECT_TRUE(read("cnn_straight.safetensors") == read("cnn_resumed.safetensors"));
}

TEST_F(AppTest, InitLoadsSavedWeights) {
  ASSERT_EQ(run_app(data_arg() + " --quiet --epochs 1 --save " + quote(path("w0.safetensors"))).exit_code, 0);
  // Zero epochs of further training is not allowed, so compare: init from w0 and train 1 epoch at lr
  // tiny vs. the saved weights' test accuracy printed by a run from them.
  const Result a = run_app(data_arg() + " --epochs 1 --lr 1e-30 --init " + quote(path("w0.safetensors")) + " --save " +
                           quote(path("w1.safetensors")));
  ASSERT_EQ(a.exit_code, 0) << a.out;
  EXPECT_TRUE(read("w0.safetensors") == read("w1.safetensors")) << "lr 1e-30 must leave the initial weights";
  std::ofstream(path("not_weights.safetensors")) << "this is not a safetensors file";
  const Result bad = run_app(data_arg() + " --epochs 1 --init " + quote(path("not_weights.safetensors")));
  EXPECT_EQ(bad.exit_code, 1) << bad.out;
}

}  // namespace

TEST_F(AppTest, OutOfMemoryReportShowsTheFailingOpAndMicroBatch) {
  // The first micro-batch fails: the report must show the failure, not an empty run: the op that
  // asked, the peak reached and the micro-batch in progress. A batch of 500 is loaded (1.5 MiB of
  // data fits the 2 MiB above the 12 MiB held at rest); the first layer's outputs no longer do.
  const Result r = run_app(data_arg() + " --epochs 1 --batch-size 500 --memory-budget 14MiB --memory-report " +
                           quote(path("oom_op.json")));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  const auto j = nlohmann::ordered_json::parse(read("oom_op.json"));  // keeps the key order
  ASSERT_TRUE(j.contains("out_of_memory")) << j.dump(1);
  const auto& oom = j["out_of_memory"];
  const std::string op = oom["op"].get<std::string>();
  EXPECT_TRUE(op == "linear" || op == "relu" || op == "linear+relu") << op;  // the fused op on the generic path
  EXPECT_NE(r.out.find("(activations) in " + op + ";"), std::string::npos) << r.out;  // the terminal names it
  EXPECT_EQ(oom["category"], "activations");
  EXPECT_GT(j["summary"]["peak_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(j["summary"]["peak_bytes"], oom["peak_bytes"]);
  ASSERT_TRUE(oom["micro_batch"].is_object()) << oom.dump(1);
  EXPECT_EQ(oom["micro_batch"]["phase"], "forward");
  EXPECT_EQ(oom["micro_batch"]["epoch"], 1);
  EXPECT_EQ(oom["micro_batch"]["index"], 0);
  EXPECT_EQ(oom["micro_batch"]["units"], 500);
  EXPECT_GT(oom["requested_bytes"].get<int64_t>() + oom["reserved_bytes"].get<int64_t>(),
            oom["limit_bytes"].get<int64_t>());
  // Right after the summary, as documented.
  std::string after_summary;
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() == "summary" && std::next(it) != j.end()) after_summary = std::next(it).key();
  EXPECT_EQ(after_summary, "out_of_memory");
}
