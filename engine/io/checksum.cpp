#include "cumulus/io/checksum.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "cumulus/core/error.h"

namespace cumulus::io {

namespace {

// `text` as one shell word: in single quotes, each ' as '\''.
std::string shell_quoted(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

}  // namespace

bool program_on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return false;
  std::stringstream dirs(path);
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::filesystem::path candidate = std::filesystem::path(dir.empty() ? "." : dir) / program;
    std::error_code ec;
    if (std::filesystem::is_regular_file(candidate, ec) && ::access(candidate.c_str(), X_OK) == 0) return true;
  }
  return false;
}

std::string sha256_of_file(const std::string& path) {
  const std::string command = "sha256sum " + shell_quoted(path) + " 2>/dev/null";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) throw Error("cannot run sha256sum to verify " + path);
  char sum[65] = {};
  const std::size_t read = std::fread(sum, 1, 64, pipe);
  const int status = ::pclose(pipe);
  if (read != 64 || status != 0) throw Error("sha256sum failed on " + path);
  return std::string(sum, 64);
}

}  // namespace cumulus::io
