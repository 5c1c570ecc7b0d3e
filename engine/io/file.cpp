#include "cumulus/io/file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "cumulus/core/error.h"

namespace cumulus::io {

namespace {
[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw Error("cannot " + what + " '" + path + "': " + std::strerror(errno));
}

// Test hook (tests/test_faults.cpp), not a feature: CUMULUS_FAULT_INJECT simulates a process
// that dies while writing, by _exit(86) without unwinding, as a kill or a power cut would:
//   mid_write      after half the content is in the temporary file (not flushed, not renamed)
//   before_rename  after the temporary file is complete and fsync'ed, before the rename
// The target must then be exactly what it was before the call. Unset in normal use.
constexpr int kFaultExitCode = 86;
void fault_point(const char* point) {
  const char* inject = std::getenv("CUMULUS_FAULT_INJECT");
  if (inject != nullptr && std::strcmp(inject, point) == 0) ::_exit(kFaultExitCode);
}

std::string parent_dir(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}
}  // namespace

void write_file_atomic(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("create", tmp);
  std::size_t done = 0;
  bool halfway = false;
  while (done < content.size()) {
    if (!halfway && done >= content.size() / 2) {
      halfway = true;
      fault_point("mid_write");
    }
    // The first half, then the rest: the mid_write fault point falls between them.
    const std::size_t limit = halfway ? content.size() : content.size() / 2;
    const ssize_t n = ::write(fd, content.data() + done, limit - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int saved = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      errno = saved;
      fail("write", tmp);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int saved = errno;
    ::unlink(tmp.c_str());
    errno = saved;
    fail("flush", tmp);
  }
  fault_point("before_rename");
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int saved = errno;
    ::unlink(tmp.c_str());
    errno = saved;
    fail("rename a temporary file onto", path);
  }
  const int dir = ::open(parent_dir(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);  // best effort: some filesystems refuse fsync on directories
    ::close(dir);
  }
}

}  // namespace cumulus::io
