// Hostile and careless input to fashion_mnist, one case (or more) per class of failure found when
// the app was tried as a hostile user would: the expected exit code and a fragment of the message,
// and that nothing previously written is damaged, nothing hangs, nothing takes unbounded memory.
//   1 colliding paths          4 hangs (FIFOs, gzip bombs)     7 NaN hidden by the model
//   2 special files, symlinks  5 silently wrong resumes/flags  8 signals (test pass, closed stdout)
//   3 crashes (deep JSON)      6 silent or late write failures 9 messages that say what and where
// The app runs on small generated IDX files (toy_dataset.h), on the CPU.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "app_runner.h"
#include "cumulus/io/file.h"
#include "cumulus/io/safetensors.h"
#include "toy_dataset.h"

namespace {

namespace fs = std::filesystem;
using cumulus::testing::Args;
using cumulus::testing::operator+;
using cumulus::testing::read_file;
using cumulus::testing::Result;
using cumulus::testing::start_app;
using cumulus::testing::wait_app;
using cumulus::testing::write_file;

class CliRobustness : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ::setenv("OPENBLAS_NUM_THREADS", "1", 0);
    dir_ = fs::temp_directory_path() / ("cumulus_cli_robustness_" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "data");
    cumulus::testing::write_toy_split(dir_ / "data", "train", 256, 1);
    cumulus::testing::write_toy_split(dir_ / "data", "t10k", 64, 2);
    // A good checkpoint after 1 of 3 epochs, and its final weights, for the resume cases.
    const Result r =
        run(common() + Args{"--epochs", "1", "--checkpoint", path("good_ck.st"), "--save", path("good_w.st")});
    ASSERT_EQ(r.exit_code, 0) << r.out;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static std::string path(const std::string& name) { return (dir_ / name).string(); }
  static Args common() { return {"--data", path("data"), "--device", "cpu", "--quiet", "--batch-size", "32"}; }
  // Runs the app to its end; every case must end well within `limit` (a hang fails the test
  // instead of stalling the suite: the app is killed and the case reported).
  static Result run(const Args& args, std::chrono::seconds limit = std::chrono::seconds(60)) {
    const fs::path log = dir_ / "run.log";
    const pid_t pid = start_app(args, log);
    const auto deadline = std::chrono::steady_clock::now() + limit;
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        Result r;
        r.exit_code = -2;
        r.out = "HUNG (killed after the time limit): " + read_file(log);
        return r;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    Result r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    r.out = read_file(log);
    return r;
  }
  // Expects exit `code` and every fragment in the output; the output is one short message.
  static void expect_refused(const Args& args, int code, const std::vector<std::string>& fragments) {
    const Result r = run(common() + args);
    std::string shown;
    for (const auto& a : args) shown += " " + a;
    EXPECT_EQ(r.exit_code, code) << shown << "\n" << r.out;
    for (const auto& f : fragments)
      EXPECT_NE(r.out.find(f), std::string::npos) << shown << ": no '" << f << "' in\n" << r.out;
    EXPECT_LT(r.out.size(), 1000u) << shown << ": messages must be short\n" << r.out.substr(0, 2000);
  }
  static fs::path dir_;
};
fs::path CliRobustness::dir_;

// ---- 1. data loss through colliding paths -------------------------------------------------------

TEST_F(CliRobustness, OutputsThatCollideWithInputsOrEachOtherAreRefusedAndNothingIsTouched) {
  const std::string ck = path("good_ck.st"), w = path("good_w.st");
  const std::string ck_before = read_file(ck), w_before = read_file(w);
  expect_refused({"--epochs", "3", "--resume", ck, "--metrics", ck}, 2, {"--metrics", "--resume"});
  expect_refused({"--init", w, "--metrics", w}, 2, {"--metrics", "--init"});
  expect_refused({"--init", w, "--trace", w}, 2, {"--trace", "--init"});
  expect_refused({"--memory-report", path("x"), "--save", path("x")}, 2, {"--memory-report", "--save", "same file"});
  expect_refused({"--save", path("y"), "--checkpoint", path("y")}, 2, {"--save", "--checkpoint", "same file"});
  expect_refused({"--metrics", path("data/train-labels-idx1-ubyte.gz")}, 2, {"--metrics", "dataset"});
  // The same file under another name: a hard link and a symlink.
  fs::create_hard_link(w, path("hard_w.st"));
  expect_refused({"--init", w, "--save", path("hard_w.st")}, 2, {"--save", "--init"});
  fs::create_symlink(w, path("sym_w.st"));
  expect_refused({"--init", path("sym_w.st"), "--save", w}, 2, {"--save", "--init"});
  EXPECT_TRUE(read_file(ck) == ck_before) << "the checkpoint was changed";
  EXPECT_TRUE(read_file(w) == w_before) << "the weights were changed";
  // Resuming from a checkpoint and writing the next ones to the same file is the normal use.
  fs::copy_file(ck, path("again_ck.st"));
  const Result r =
      run(common() + Args{"--epochs", "2", "--resume", path("again_ck.st"), "--checkpoint", path("again_ck.st")});
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

// ---- 2. atomic writes over special files and symlinks -------------------------------------------

TEST_F(CliRobustness, SpecialFilesAreRefusedAsOutputsAndSymlinksAreWrittenThrough) {
  expect_refused({"--save", "/dev/null"}, 2, {"--save", "/dev/null", "character device"});
  expect_refused({"--memory-report", "/dev/stdout"}, 2, {"--memory-report", "/dev/stdout"});
  ASSERT_EQ(::mkfifo(path("fifo_out").c_str(), 0644), 0);
  expect_refused({"--save", path("fifo_out")}, 2, {"--save", "FIFO"});
  EXPECT_TRUE(fs::is_fifo(path("fifo_out")));
  // A symlink stays a symlink; its target gets the weights.
  write_file(path("link_target.st"), "old");
  fs::create_symlink("link_target.st", path("link.st"));
  const Result r = run(common() + Args{"--epochs", "1", "--save", path("link.st")});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(fs::is_symlink(path("link.st")));
  EXPECT_GT(fs::file_size(path("link_target.st")), 1000u);
  EXPECT_TRUE(read_file(path("link_target.st")) == read_file(path("good_w.st")));
}

// ---- 3. crashes on deeply nested JSON -----------------------------------------------------------

TEST_F(CliRobustness, DeeplyNestedSafetensorsHeadersAreRefusedWithAShortMessage) {
  for (const char* where : {"shape", "metadata"}) {
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    const std::string header = std::string(where) == "shape"
                                   ? R"({"w":{"dtype":"F32","shape":)" + deep + R"(,"data_offsets":[0,4]}})"
                                   : R"({"__metadata__":{"k":)" + deep + R"(}})";
    std::string file(8, '\0');
    for (int i = 0; i < 8; ++i)
      file[static_cast<std::size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    file += header + std::string(4, '\0');
    const std::string p = path(std::string("deep_") + where + ".st");
    write_file(p, file);
    for (const char* flag : {"--init", "--resume"}) {
      const Result r = run(common() + Args{flag, p});
      EXPECT_EQ(r.exit_code, 1) << flag << " " << where << "\n" << r.out.substr(0, 500);
      EXPECT_NE(r.out.find(p), std::string::npos) << r.out.substr(0, 500);
      EXPECT_LT(r.out.size(), 600u) << "the message must not quote the brackets";
    }
  }
}

// ---- 4. hangs: FIFOs and gzip bombs -------------------------------------------------------------

TEST_F(CliRobustness, AFifoNamedLikeADataFileIsRefusedWithoutHanging) {
  fs::create_directories(path("fifo_data"));
  for (const char* f : {"train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"})
    fs::copy_file(path(std::string("data/") + f), path(std::string("fifo_data/") + f));
  ASSERT_EQ(::mkfifo(path("fifo_data/train-images-idx3-ubyte.gz").c_str(), 0644), 0);
  const Result r = run(Args{"--data", path("fifo_data"), "--device", "cpu", "--quiet"}, std::chrono::seconds(20));
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.exit_code, -2) << r.out;
  EXPECT_NE(r.out.find("train-images-idx3-ubyte.gz"), std::string::npos) << r.out;
  // A FIFO, a directory or /dev/zero given as weights: named for what it is.
  expect_refused({"--init", path("fifo_data/train-images-idx3-ubyte.gz")}, 2, {"--init", "FIFO"});
  expect_refused({"--init", path("data")}, 2, {"--init", "directory"});
  expect_refused({"--resume", "/dev/zero"}, 2, {"--resume", "character device"});
}

TEST_F(CliRobustness, AGzipBombIsRefusedFastAndInBoundedMemory) {
  // A header claiming 2^31 images, then 256 MiB of zeros: about 250 KiB compressed.
  fs::create_directories(path("bomb"));
  for (const char* f : {"train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"})
    fs::copy_file(path(std::string("data/") + f), path(std::string("bomb/") + f));
  gzFile gz = gzopen(path("bomb/train-images-idx3-ubyte.gz").c_str(), "wb9");
  ASSERT_NE(gz, nullptr);
  std::string header;
  for (uint32_t v : {0x803u, 0x80000000u, 28u, 28u}) cumulus::testing::put_be32(header, v);
  gzwrite(gz, header.data(), static_cast<unsigned>(header.size()));
  const std::string zeros(1 << 20, '\0');
  for (int i = 0; i < 256; ++i) gzwrite(gz, zeros.data(), static_cast<unsigned>(zeros.size()));
  gzclose(gz);
  // The run's address space is capped at 2 GiB: inflating the claim (1.6 TB) or even the 256 MiB
  // of zeros in a quadratic loop would fail differently or take far longer.
  const auto t0 = std::chrono::steady_clock::now();
  const Result r = run(Args{"--data", path("bomb"), "--device", "cpu", "--quiet"}, std::chrono::seconds(30));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("train-images-idx3-ubyte.gz"), std::string::npos) << r.out;
  EXPECT_LT(seconds, 10.0) << r.out;
}

// Issue 30 item 12: 800,000 images of zeros (627 MB, about 600 KB gzipped: a claim the file can
// back) beside 256 labels. Both headers are read and compared before either file is inflated, so
// the run ends at once and never holds the images.
TEST_F(CliRobustness, ImagesAndLabelsAreComparedBeforeAnythingIsInflated) {
  fs::create_directories(path("mismatch"));
  for (const char* f : {"train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"})
    fs::copy_file(path(std::string("data/") + f), path(std::string("mismatch/") + f));
  gzFile gz = gzopen(path("mismatch/train-images-idx3-ubyte.gz").c_str(), "wb1");
  ASSERT_NE(gz, nullptr);
  std::string header;
  for (uint32_t v : {0x803u, 800000u, 28u, 28u}) cumulus::testing::put_be32(header, v);
  gzwrite(gz, header.data(), static_cast<unsigned>(header.size()));
  const std::string zeros(784 * 1000, '\0');
  for (int i = 0; i < 800; ++i) gzwrite(gz, zeros.data(), static_cast<unsigned>(zeros.size()));
  gzclose(gz);
  const Result r = run(Args{"--data", path("mismatch"), "--device", "cpu", "--quiet"}, std::chrono::seconds(30));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  for (const char* fragment : {"train-images-idx3-ubyte.gz", "800000 images", "train-labels-idx1-ubyte.gz", "256"})
    EXPECT_NE(r.out.find(fragment), std::string::npos) << fragment << " in " << r.out;
  rusage children{};
  ASSERT_EQ(::getrusage(RUSAGE_CHILDREN, &children), 0);
  EXPECT_LT(children.ru_maxrss, 400L * 1024) << "KiB: the largest run of this test held the inflated images";
}

// ---- 5. silently wrong resumes and flags --------------------------------------------------------

TEST_F(CliRobustness, ResumeIsAContract) {
  const std::string ck = path("good_ck.st");  // epoch 1 of a run with lr 1e-3, no momentum
  // Finished: says so and exits 0; past --epochs: a usage error.
  Result r = run(common() + Args{"--epochs", "1", "--resume", ck});
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("nothing to train"), std::string::npos) << r.out;
  fs::copy_file(ck, path("past_ck.st"));
  r = run(common() + Args{"--epochs", "2", "--resume", ck, "--checkpoint", path("past_ck.st")});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  expect_refused({"--epochs", "1", "--resume", path("past_ck.st")}, 2, {"--epochs", "past_ck.st"});
  // Settings that change the result: refused naming the flag, or changed with --override.
  expect_refused({"--epochs", "3", "--resume", ck, "--momentum", "0.9"}, 2, {"--momentum", "good_ck.st"});
  expect_refused({"--epochs", "3", "--resume", ck, "--lr", "0.01"}, 2, {"--lr", "--override lr"});
  expect_refused({"--epochs", "3", "--resume", ck, "--weight-decay", "0.1"}, 2, {"--weight-decay"});
  expect_refused({"--epochs", "3", "--resume", ck, "--clip-grad-norm", "1"}, 2, {"--clip-grad-norm"});
  expect_refused({"--epochs", "3", "--resume", ck, "--override", "momentum"}, 2, {"--override", "momentum"});
  r = run(common() + Args{"--epochs", "2", "--resume", ck, "--lr", "0.01", "--override", "lr", "--metrics",
                          path("override.jsonl")});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("--override: lr 0.001 -> 0.01"), std::string::npos) << r.out;
  EXPECT_NE(read_file(path("override.jsonl")).find(R"("overrides":["lr 0.001 -> 0.01"])"), std::string::npos);
}

TEST_F(CliRobustness, ForgedCheckpointCountersAreRefusedNamingTheFile) {
  auto forge = [&](const std::string& name, const std::string& key, const std::string& value) {
    cumulus::io::SafetensorsContents c = cumulus::io::load_safetensors(path("good_ck.st"));
    c.metadata[key] = value;
    c.metadata["checksum_crc32"] = "";  // recomputed by the writer: the forgery is internally consistent
    cumulus::io::save_safetensors(path(name), c.tensors, c.metadata);
  };
  forge("forged_epoch.st", "epoch", "4294967297");  // 2^32 + 1: would wrap to epoch 1 in an int
  expect_refused({"--epochs", "3", "--resume", path("forged_epoch.st")}, 1, {"forged_epoch.st", "epoch"});
  forge("forged_negative.st", "optimizer_steps", "-5");
  expect_refused({"--epochs", "3", "--resume", path("forged_negative.st")}, 1,
                 {"forged_negative.st", "optimizer_steps"});
  forge("forged_position.st", "next_micro_batch", "1164");  // past an epoch of 8 micro-batches
  expect_refused({"--epochs", "3", "--resume", path("forged_position.st")}, 1,
                 {"forged_position.st", "1164", "other data"});
}

// Issue 30 items 7 and 13: a checkpoint whose optimizer state holds a NaN (with a valid checksum)
// would skip every step and save NaN weights; a forged loss scale of 0 or NaN is refused too, and
// both messages name the checkpoint file (and the tensor or the key).
TEST_F(CliRobustness, ForgedOptimizerStateAndLossScaleAreRefusedNamingTheFile) {
  const Args momentum = common() + Args{"--momentum", "0.9", "--precision", "fp16", "--epochs", "3"};
  Result r = run(momentum + Args{"--epochs", "1", "--checkpoint", path("momentum_ck.st")});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto forge = [&](const std::string& name, const std::function<void(cumulus::io::SafetensorsContents&)>& change) {
    cumulus::io::SafetensorsContents c = cumulus::io::load_safetensors(path("momentum_ck.st"));
    change(c);
    c.metadata["checksum_crc32"] = "";  // recomputed: the forgery is internally consistent
    cumulus::io::save_safetensors(path(name), c.tensors, c.metadata);
  };
  forge("nan_momentum.st", [](cumulus::io::SafetensorsContents& c) {
    for (auto& [name, t] : c.tensors)
      if (name == "optimizer.momentum_buffer") t.data<float>()[3] = std::numeric_limits<float>::quiet_NaN();
  });
  expect_refused(momentum + Args{"--resume", path("nan_momentum.st")}, 1,
                 {"nan_momentum.st", "optimizer.momentum_buffer", "non-finite"});
  for (const char* bits : {"0", "2143289344" /* a quiet NaN */}) {
    forge("bad_scale.st", [&](cumulus::io::SafetensorsContents& c) { c.metadata["loss_scale_bits"] = bits; });
    expect_refused(momentum + Args{"--resume", path("bad_scale.st")}, 1, {"bad_scale.st", "loss scale"});
  }
}

// Issue 30 item 11: a checkpoint's optimizer tensor with a forged shape (over a sparse file, so
// the data section is as long as the header says) is refused from the header, naming the tensor
// and the shape the run keeps, before anything of that size is allocated.
TEST_F(CliRobustness, AForgedOptimizerTensorIsRefusedBeforeItIsAllocated) {
  const Args momentum = common() + Args{"--momentum", "0.9", "--epochs", "3"};
  const Result r = run(momentum + Args{"--epochs", "1", "--checkpoint", path("shape_ck.st")});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const cumulus::io::SafetensorsHeader good = cumulus::io::read_safetensors_header(path("shape_ck.st"));
  nlohmann::ordered_json header;
  header["__metadata__"] = good.metadata;
  uint64_t offset = 0;
  int64_t flat = 0;
  for (const auto& t : good.tensors) {
    std::vector<int64_t> shape;
    for (int d = 0; d < t.shape.ndim(); ++d) shape.push_back(t.shape[d]);
    if (t.name == "optimizer.momentum_buffer") {
      flat = t.shape.numel();
      shape = {int64_t{1} << 34};  // 64 GiB of f32
    }
    int64_t n = 1;
    for (const int64_t d : shape) n *= d;
    const uint64_t end = offset + 4 * static_cast<uint64_t>(n);  // f32 and i32 alike
    header[t.name] = {
        {"dtype", t.dtype == cumulus::DType::i32 ? "I32" : "F32"}, {"shape", shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  ASSERT_GT(flat, 0) << "the checkpoint has no momentum buffer";
  const std::string text = header.dump();
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  write_file(path("huge_ck.st"), bytes + text);
  fs::resize_file(path("huge_ck.st"), 8 + text.size() + offset);  // sparse: no disk space used
  expect_refused(momentum + Args{"--resume", path("huge_ck.st")}, 1,
                 {"huge_ck.st", "optimizer.momentum_buffer", "[" + std::to_string(flat) + "]", "expected"});
}

TEST_F(CliRobustness, OutOfRangeIntegersAreRefusedNotClamped) {
  expect_refused({"--batch-size", "1e23"}, 2, {"--batch-size", "1e23"});
  expect_refused({"--batch-size", "9223372036854775807"}, 2, {"--batch-size"});
  expect_refused({"--eval-batch-size", "9223372036854775807"}, 2, {"--eval-batch-size"});
  expect_refused({"--seed", "-1"}, 2, {"--seed", "-1"});
  expect_refused({"--seed", "1e23"}, 2, {"--seed", "1e23"});
  expect_refused({"--seed", "18446744073709551616"}, 2, {"--seed"});
  expect_refused({"--epochs", "3000000000"}, 2, {"--epochs"});
  expect_refused({"--memory-budget", "1KiB"}, 2, {"--memory-budget", "1KiB", "holds"});
}

// ---- 6. silent and late write failures ----------------------------------------------------------

// Issue 30 item 14: an empty value is a usage error naming the flag, for every flag that takes a
// value, never a silent default or 0.
TEST_F(CliRobustness, EmptyValuesAreUsageErrorsNamingTheFlag) {
  for (const char* flag : {"--lr", "--momentum", "--weight-decay", "--clip-grad-norm", "--accum-schedule",
                           "--memory-budget", "--optimizer", "--betas", "--override", "--epochs"})
    expect_refused({flag, ""}, 2, {flag, "''"});
  expect_refused({"--lr-schedule", "cosine", "--min-lr", ""}, 2, {"--min-lr", "''"});
}

TEST_F(CliRobustness, WriteFailuresAreCaughtBeforeTrainingOrReportedNamingTheFlag) {
  expect_refused({"--save", ""}, 2, {"--save"});
  expect_refused({"--metrics", ""}, 2, {"--metrics"});
  expect_refused({"--metrics", "/dev/full"}, 2, {"--metrics", "/dev/full"});
  expect_refused({"--save", "/proc/w.st"}, 2, {"--save", "/proc"});
  expect_refused({"--save", path("no_such_dir/w.st")}, 2, {"--save", "no_such_dir"});
  // A legal 250-byte name: the temporary file beside it must still fit NAME_MAX.
  const std::string long_name = path(std::string(250, 'w'));
  Result r = run(common() + Args{"--epochs", "1", "--save", long_name});
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(fs::is_regular_file(long_name));
  // A temporary file left by a writer that died is removed by the next run writing that output.
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const std::string stale = cumulus::io::temp_path_for(path("stale_w.st"), dead, 0xfeed1234);
  write_file(stale, "half a file");
  // Issue 30 item 2: a user's file that merely looks like an old temporary name stays.
  const std::string users = path("stale_w.st.tmp." + std::to_string(dead));
  write_file(users, "the user's notes");
  r = run(common() + Args{"--epochs", "1", "--save", path("stale_w.st")});
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_FALSE(fs::exists(stale)) << "the dead writer's temporary file is still there";
  EXPECT_EQ(read_file(users), "the user's notes") << "the clean-up removed a user's file";
}

// Issue 30 items 1 and 4: someone who can write in the output directory plants a link at the
// temporary name an earlier version used for the final save (after the start-up checks, the pid
// being public); the save must not go through it. A private output stays private when replaced.
TEST_F(CliRobustness, TheFinalSaveCannotBeRedirectedAndKeepsThePermissions) {
  const std::string target = path("hijack_w.st"), victim = path("hijack_victim"), metrics = path("hijack.jsonl");
  write_file(victim, "precious");
  write_file(target, "old weights");
  ASSERT_EQ(::chmod(target.c_str(), 0600), 0);
  const pid_t pid =
      start_app(common() + Args{"--epochs", "60", "--train-limit", "64", "--save", target, "--metrics", metrics},
                dir_ / "hijack.log");
  // The first epoch's metrics line says the run is past its start-up checks.
  while (!fs::exists(metrics) && ::waitpid(pid, nullptr, WNOHANG) == 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  fs::create_symlink(victim, target + ".tmp." + std::to_string(pid));
  const Result r = wait_app(pid, dir_ / "hijack.log");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(read_file(victim) == "precious") << "the final save was written through the planted link";
  EXPECT_FALSE(fs::is_symlink(target));
  EXPECT_NO_THROW(cumulus::io::load_safetensors(target));
  struct stat st {};
  ASSERT_EQ(::stat(target.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "replacing the private output widened its permissions";
}

// ---- 7. NaN hidden -------------------------------------------------------------------------------

TEST_F(CliRobustness, NonFiniteInitialWeightsAreRefusedNamingTheTensor) {
  cumulus::io::SafetensorsContents c = cumulus::io::load_safetensors(path("good_w.st"));
  for (auto& [name, t] : c.tensors)
    if (name == "linear_relu_stack.0.weight")
      t = cumulus::Tensor::full(t.shape(), std::numeric_limits<float>::quiet_NaN());
  cumulus::io::save_safetensors(path("nan_w.st"), c.tensors, c.metadata);
  expect_refused({"--init", path("nan_w.st")}, 1, {"nan_w.st", "linear_relu_stack.0.weight", "non-finite"});
}

TEST_F(CliRobustness, NonFiniteGradientsDuringTrainingAreReported) {
  // An absurd learning rate overflows the weights after the first step; every later step sees a
  // non-finite gradient, is skipped by the guard, and the run says so.
  const Result r = run(common() + Args{"--epochs", "1", "--lr", "1e38", "--momentum", "0.9"});
  EXPECT_NE(r.out.find("skipped for non-finite gradients"), std::string::npos) << r.out;
}

// Item 6 of issue 26: under fp16 every skipped step halves the loss scale, but it holds at its floor
// of 1 (Note [Loss scaling]); 32 steps of which at most one is finite would otherwise take 2^16 to
// 2^-15 or below. The run says where the scale is and why it cannot help.
TEST_F(CliRobustness, Fp16LossScaleHoldsAtItsFloorAndTheRunSaysSo) {
  const Result r = run(common() + Args{"--epochs", "1", "--batch-size", "8", "--precision", "fp16", "--lr", "1e38",
                                       "--momentum", "0.9", "--metrics", path("floor.jsonl")});
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("fp16's loss scale holds at its floor of 1, so these gradients overflow unscaled"),
            std::string::npos)
      << r.out;
  const std::string line = read_file(path("floor.jsonl"));
  ASSERT_FALSE(line.empty()) << "no metrics line";
  const nlohmann::json m = nlohmann::json::parse(line.substr(0, line.find('\n')));
  EXPECT_GE(m["skipped_steps"].get<int64_t>(), 17) << line;
  EXPECT_EQ(m["loss_scale"].get<double>(), 1.0) << line;
}

// ---- 8. signals ----------------------------------------------------------------------------------

TEST_F(CliRobustness, ClosedStdoutIsAnInterruptThatStillCheckpoints) {
  const std::string ck = path("pipe_ck.st");
  // The app's stdout goes into `head -c 1`, which exits after the first byte; the script prints
  // the app's exit status (PIPESTATUS: the status of each command of the pipeline).
  write_file(path("pipe.sh"), "'" + std::string(FASHION_MNIST_BIN) + "' --data '" + path("data") +
                                  "' --device cpu --batch-size 32 --epochs 3 --checkpoint '" + ck +
                                  "' 2>/dev/null | head -c 1 >/dev/null; echo ${PIPESTATUS[0]}\n");
  FILE* p = ::popen(("bash '" + path("pipe.sh") + "'").c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[32] = {};
  ASSERT_NE(std::fgets(buf, sizeof buf, p), nullptr);
  ::pclose(p);
  EXPECT_EQ(std::atoi(buf), 141) << "exit status of the app whose stdout closed";
  ASSERT_TRUE(fs::exists(ck)) << "no checkpoint after stdout closed";
  EXPECT_EQ(cumulus::io::load_safetensors(ck).metadata.count("checksum_crc32"), 1u);
}

TEST_F(CliRobustness, CtrlCInTheTestPassIsHonouredAndTheResumeRunsThatTestPass) {
  // A test pass much longer than an epoch of training: 2000 test samples one at a time.
  fs::create_directories(path("slow_eval"));
  cumulus::testing::write_toy_split(path("slow_eval"), "train", 64, 3);
  cumulus::testing::write_toy_split(path("slow_eval"), "t10k", 2000, 4);
  const Args args = {"--data", path("slow_eval"),   "--device", "cpu",      "--batch-size",
                     "32",     "--eval-batch-size", "1",        "--epochs", "2"};
  Result straight = run(args + Args{"--save", path("eval_straight.st")});
  ASSERT_EQ(straight.exit_code, 0) << straight.out;
  for (int attempt = 0; attempt < 5; ++attempt) {
    const std::string ck = path("eval_ck.st");
    fs::remove(ck);
    const fs::path log = dir_ / "eval.log";
    fs::remove(log);  // the poll below must not see the previous attempt's log
    const pid_t pid = start_app(args + Args{"--checkpoint", ck}, log);
    // Epoch 1's checkpoint is written after its test pass; epoch 2's training (2 micro-batches)
    // takes a few milliseconds and its test pass (2000 forwards) about a second, so a signal sent
    // 150 ms after the checkpoint lands in epoch 2's test pass unless the machine is very busy.
    while (read_file(log).find("checkpoint (epoch end)") == std::string::npos) {
      int status = 0;
      ASSERT_EQ(::waitpid(pid, &status, WNOHANG), 0) << "the app ended early: " << read_file(log);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    ::kill(pid, SIGINT);
    const Result r = wait_app(pid, log);
    // The signal may also land in epoch 2's training (then the step finishes first) or after the
    // test pass: try again.
    if (r.exit_code == 0 || r.out.find("in the test pass") == std::string::npos) {
      std::printf("[ attempt  ] %d: the signal missed the test pass (exit %d)\n", attempt, r.exit_code);
      continue;
    }
    EXPECT_EQ(r.exit_code, 130) << r.out;
    const std::string epoch2_results = "Epoch 2\n-------------------";
    EXPECT_EQ(r.out.find(epoch2_results), std::string::npos) << "epoch 2 reported although its test pass was cut";
    const Result resumed = run(args + Args{"--resume", ck, "--save", path("eval_resumed.st")});
    ASSERT_EQ(resumed.exit_code, 0) << resumed.out;
    EXPECT_NE(resumed.out.find(epoch2_results), std::string::npos) << "the resumed run runs the cut test pass";
    EXPECT_TRUE(read_file(path("eval_straight.st")) == read_file(path("eval_resumed.st")));
    return;
  }
  GTEST_SKIP() << "in 5 attempts SIGINT never arrived during the test pass";
}

// ---- 9. messages that say what and where --------------------------------------------------------

TEST_F(CliRobustness, MessagesNameTheFileAndWhatToDo) {
  // A checkpoint given to --init.
  expect_refused({"--init", path("good_ck.st")}, 2, {"good_ck.st", "--resume"});
  // A mid-epoch position beyond a smaller dataset.
  const Result r = run(common() + Args{"--epochs", "3", "--resume", path("good_ck.st"), "--train-limit", "64"});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--train-limit"), std::string::npos) << r.out;
}

TEST_F(CliRobustness, AHugeTensorInAWeightsFileIsRefusedBeforeItIsAllocated) {
  // A header claiming a 64 GiB first weight over a sparse file of that size: the names and shapes
  // are checked against the model from the header, so nothing of that size is ever allocated.
  const uint64_t huge = uint64_t{512} * 33554432 * 4;
  const std::string header =
      R"({"linear_relu_stack.0.weight":{"dtype":"F32","shape":[512,33554432],"data_offsets":[0,)" +
      std::to_string(huge) + "]}}";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  write_file(path("huge.st"), bytes + header);
  fs::resize_file(path("huge.st"), 8 + header.size() + huge);  // sparse: no disk space used
  expect_refused({"--init", path("huge.st")}, 1, {"huge.st", "linear_relu_stack.0.weight", "[512, 784]"});
}

TEST_F(CliRobustness, RepeatedFlagsTakeTheLastValue) {
  const Result r = run(common() + Args{"--epochs", "5", "--epochs", "1", "--metrics", path("last.jsonl")});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '%'), 1) << "one epoch's results\n" << r.out;
}

}  // namespace
