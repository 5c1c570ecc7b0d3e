// The app against its environment, without the network: no curl on $PATH (a clear message, nothing
// created), a download that fails or brings a wrong file (no .part file, no empty directory left),
// and the progress bar on a narrow terminal (a pseudo-terminal: no line as wide as the terminal).
#include <gtest/gtest.h>
#include <pty.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using cumulus::testing::quote;
using cumulus::testing::Result;
using cumulus::testing::run_command;
using cumulus::testing::TempDir;

// The app's binary: FASHION_MNIST_BIN where the build defines it, else beside this test (both land
// in the build's bin/, CMAKE_RUNTIME_OUTPUT_DIRECTORY).
std::string app_binary() {
#ifdef FASHION_MNIST_BIN
  return FASHION_MNIST_BIN;
#else
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : (self.parent_path() / "fashion_mnist").string();
#endif
}

// Runs the app in `cwd` with $PATH set to `path` and no $CUMULUS_DATA, so it must download.
Result run_app(const std::string& cwd, const std::string& path, const std::string& args) {
  const std::string cmd = "cd " + quote(cwd) + " && /usr/bin/env -u CUMULUS_DATA PATH=" + quote(path) + " " +
                          quote(app_binary()) + " " + args + " 2>&1";
  return run_command(cmd);
}

void write_file(const fs::path& path, const std::string& text, bool executable = false) {
  std::ofstream(path) << text;
  if (executable) fs::permissions(path, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec);
}

// Every file under `dir` whose name ends in `suffix`.
std::vector<std::string> files_ending(const fs::path& dir, const std::string& suffix) {
  std::vector<std::string> found;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return found;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      found.push_back(e.path().string());
  }
  return found;
}

class DownloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::error_code ec;
    if (app_binary().empty() || !fs::exists(app_binary(), ec)) GTEST_SKIP() << "fashion_mnist not built";
    fs::create_directories(cwd());
    fs::create_directories(bin());
  }
  std::string cwd() const { return tmp_.file("cwd"); }
  std::string bin() const { return tmp_.file("bin"); }
  // A fake curl in bin(): writes `body` to its -o file and exits with `code`; the real sha256sum.
  void fake_curl(const std::string& body, int code) {
    write_file(fs::path(bin()) / "curl",
               "#!/bin/sh\n"
               "while [ $# -gt 0 ]; do if [ \"$1\" = -o ]; then shift; printf '" + body + "' > \"$1\"; fi; shift; done\n"
               "echo 'curl: (6) Could not resolve host' >&2\n"
               "exit " + std::to_string(code) + "\n",
               true);
    for (const char* dir : {"/usr/bin", "/bin"})
      if (fs::exists(fs::path(dir) / "sha256sum")) {
        fs::create_symlink(fs::path(dir) / "sha256sum", fs::path(bin()) / "sha256sum");
        return;
      }
    GTEST_SKIP() << "no sha256sum";
  }
  TempDir tmp_;
};

TEST_F(DownloadTest, WithoutCurlItSaysWhatToInstallAndCreatesNothing) {
  const Result r = run_app(cwd(), bin(), "--device cpu --epochs 1");  // bin() is empty: no curl
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("curl"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("is not installed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("apt-get install curl ca-certificates"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--data DIR"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(fs::path(cwd()) / "data")) << "nothing may be created before the download can work";
}

TEST_F(DownloadTest, AFailedDownloadLeavesNoPartFileAndNoEmptyDirectory) {
  fake_curl("partial", 6);
  if (IsSkipped()) return;
  const Result r = run_app(cwd(), bin(), "--device cpu --epochs 1");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("could not download train-images-idx3-ubyte.gz"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--data DIR"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(fs::path(cwd()) / "data")) << "the directories the app created are removed";

  // A data/ the user made stays; the app's fashion-mnist/ inside it goes.
  fs::create_directories(fs::path(cwd()) / "data");
  const Result again = run_app(cwd(), bin(), "--device cpu --epochs 1 --quiet");
  EXPECT_EQ(again.exit_code, 1) << again.out;
  EXPECT_TRUE(fs::exists(fs::path(cwd()) / "data"));
  EXPECT_FALSE(fs::exists(fs::path(cwd()) / "data" / "fashion-mnist"));
  EXPECT_TRUE(files_ending(cwd(), ".part").empty());
}

TEST_F(DownloadTest, AFileWithTheWrongChecksumIsDiscarded) {
  fake_curl("not the dataset", 0);
  if (IsSkipped()) return;
  const Result r = run_app(cwd(), bin(), "--device cpu --epochs 1");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("SHA-256"), std::string::npos) << r.out;
  EXPECT_TRUE(files_ending(cwd(), ".part").empty());
  EXPECT_TRUE(files_ending(cwd(), ".gz").empty());
  EXPECT_FALSE(fs::exists(fs::path(cwd()) / "data"));
}

// ---- the progress bar on a terminal ---------------------------------------------------------------

void put_be32(std::string& s, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) s.push_back(static_cast<char>((v >> shift) & 0xff));
}

// Plain (not gzipped) IDX files of `n` random samples.
void write_split(const fs::path& dir, const std::string& prefix, int n) {
  std::string images, labels;
  put_be32(images, 0x803);
  put_be32(images, static_cast<uint32_t>(n));
  put_be32(images, 28);
  put_be32(images, 28);
  put_be32(labels, 0x801);
  put_be32(labels, static_cast<uint32_t>(n));
  uint32_t state = 5;
  for (int i = 0; i < n; ++i) {
    labels.push_back(static_cast<char>(i % 10));
    for (int p = 0; p < 28 * 28; ++p) images.push_back(static_cast<char>((state = state * 1664525u + 1013904223u) >> 24));
  }
  std::ofstream(dir / (prefix + "-images-idx3-ubyte"), std::ios::binary) << images;
  std::ofstream(dir / (prefix + "-labels-idx1-ubyte"), std::ios::binary) << labels;
}

// Runs the app with stderr on a pseudo-terminal of `columns` columns (0: size unset) and returns
// what it drew there.
std::string run_on_terminal(const std::string& data, unsigned short columns, const std::string& columns_env) {
  int master = -1, slave = -1;
  winsize ws{};
  ws.ws_row = 24;
  ws.ws_col = columns;
  if (::openpty(&master, &slave, nullptr, nullptr, &ws) != 0) return "openpty failed";
  const std::string bin = app_binary();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(master);
    ::dup2(slave, 2);
    std::FILE* null = std::fopen("/dev/null", "w");
    if (null != nullptr) ::dup2(::fileno(null), 1);
    if (columns_env.empty()) ::unsetenv("COLUMNS");
    else ::setenv("COLUMNS", columns_env.c_str(), 1);
    ::execl(bin.c_str(), bin.c_str(), "--data", data.c_str(), "--device", "cpu", "--epochs", "2", "--batch-size", "8",
            "--test-limit", "100", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(slave);
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(master, buf, sizeof buf);
    if (n > 0) out.append(buf, static_cast<std::size_t>(n));
    else if (n < 0 && errno == EINTR) continue;
    else break;  // EIO once the child has gone
  }
  ::close(master);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return out;
}

// The bar's redraws: the text between carriage returns and newlines, without the erase-line code.
std::vector<std::string> drawn_lines(const std::string& out) {
  std::vector<std::string> lines;
  std::string cur;
  for (char c : out) {
    if (c == '\r' || c == '\n') {
      if (!cur.empty()) lines.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) lines.push_back(cur);
  for (std::string& l : lines)
    for (std::size_t i; (i = l.find("\033[K")) != std::string::npos;) l.erase(i, 3);
  return lines;
}

class ProgressTerminalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::error_code ec;
    if (app_binary().empty() || !fs::exists(app_binary(), ec)) GTEST_SKIP() << "fashion_mnist not built";
    fs::create_directories(tmp_.file("data"));
    write_split(tmp_.file("data"), "train", 1000);
    write_split(tmp_.file("data"), "t10k", 100);
  }
  void expect_fits(const std::string& out, std::size_t columns) {
    int bars = 0;
    for (const std::string& l : drawn_lines(out)) {
      if (l.rfind("Epoch ", 0) != 0 || l.find('[') == std::string::npos) continue;  // the bar's lines
      ++bars;
      EXPECT_LT(l.size(), columns) << "wider than the terminal would wrap: '" << l << "'";
    }
    EXPECT_GE(bars, 2) << out;
  }
  TempDir tmp_;
};

TEST_F(ProgressTerminalTest, TheBarFitsANarrowTerminal) {
  const std::string out = run_on_terminal(tmp_.file("data"), 60, "");
  expect_fits(out, 60);
  EXPECT_NE(out.find("ETA"), std::string::npos) << out;
}

TEST_F(ProgressTerminalTest, WithoutASizeItFollowsColumns) {
  expect_fits(run_on_terminal(tmp_.file("data"), 0, "48"), 48);
}

}  // namespace
