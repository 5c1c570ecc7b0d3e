// Shared test helpers: the device parameterization (every case on CPU, the same case on CUDA when
// a GPU is present, skipped otherwise) and comparisons.
#pragma once

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "cumulus/core/device.h"
#include "cumulus/memory/report.h"
#include "cumulus/memory/tracker.h"

namespace cumulus::testing {

inline std::vector<Device> all_devices() { return {Device::cpu(), Device::cuda(0)}; }

inline std::string device_name(const ::testing::TestParamInfo<Device>& info) {
  return info.param.is_cpu() ? "cpu" : "cuda";
}

// A child process's outcome.
struct Result {
  int exit_code = -1;  // when it exited (run_command: 128 + the signal when one ended it)
  int signal = 0;      // when a signal ended it (start_app / wait_app)
  std::string out;     // stdout and stderr together
};

// `s` quoted for /bin/sh.
inline std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs a shell command line; its stdout is the result's output (add 2>&1 for stderr).
inline Result run_command(const std::string& cmd) {
  Result r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// The message of the E that `fn` throws, or "" when it throws none (an exception of another type
// propagates and fails the test).
template <typename E, typename Fn>
std::string thrown_message(Fn fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

// A Python that imports torch and safetensors, for tests against a PyTorch twin:
// $CUMULUS_TORCH_PYTHON, python3 on PATH, or the development machine's /work/venv; "" when none does.
inline std::string python_with_torch() {
  std::vector<std::string> candidates = {"python3", "/work/venv/bin/python"};
  if (const char* chosen = std::getenv("CUMULUS_TORCH_PYTHON")) candidates.insert(candidates.begin(), chosen);
  for (const std::string& python : candidates)
    if (run_command(quote(python) + " -c 'import torch, safetensors' 2>&1").exit_code == 0) return python;
  return "";
}

// Runs `fn`, which must refuse the FIFO at `fifo`, on a thread, and fails if it has not returned
// within 5 s. A reader stuck in open() is then released by opening the FIFO for writing, so a
// regression fails the test instead of hanging the binary.
template <typename Fn>
void expect_returns_promptly(const std::string& fifo, Fn fn) {
  std::promise<void> done;
  std::future<void> finished = done.get_future();
  std::thread worker([&] {
    fn();
    done.set_value();
  });
  if (finished.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    ADD_FAILURE() << "reading the FIFO " << fifo << " hangs";
    while (finished.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready) {
      const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
      if (fd >= 0) ::close(fd);
    }
  }
  worker.join();
}

// Fixture for tests parameterized over devices.
class DeviceTest : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (GetParam().is_cuda() && !cuda_available())
      GTEST_SKIP() << "no CUDA device" << (cuda_compiled() ? "" : " (built without CUDA)");
  }
  Device device() const { return GetParam(); }
};

#define CUMULUS_INSTANTIATE_DEVICES(Suite)                                              \
  INSTANTIATE_TEST_SUITE_P(Devices, Suite, ::testing::ValuesIn(::cumulus::testing::all_devices()), \
                           ::cumulus::testing::device_name)

// A fresh directory per test (named after the test and the process), removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string("cumulus_") + info->test_suite_name() + "_" + info->name() + "_" +
                       std::to_string(::getpid());
    std::replace(name.begin(), name.end(), '/', '_');
    path_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }
  // Names of the entries in the directory, sorted.
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  std::filesystem::path path_;
};

// What print_memory_table writes for `tracker` (the text report the app prints at the end).
inline std::string memory_table_text(memory::MemoryTracker& tracker) {
  std::FILE* f = std::tmpfile();
  EXPECT_NE(f, nullptr);
  if (f == nullptr) return {};
  memory::print_memory_table(tracker, f);
  std::rewind(f);
  std::string table(4096, '\0');
  table.resize(std::fread(table.data(), 1, table.size(), f));
  std::fclose(f);
  return table;
}

// max |a - b| / max(max |b|, floor): the relative error measure the issues use.
inline double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b, double floor = 1e-12) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, scale = floor;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return diff / scale;
}

}  // namespace cumulus::testing
