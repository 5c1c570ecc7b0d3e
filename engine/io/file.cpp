#include "cumulus/io/file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

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

std::string base_name(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

// Note [Temporary files]
// A temporary file is created beside its target with O_CREAT|O_EXCL|O_NOFOLLOW under a name no
// one can predict (a random part), so nothing planted at that name (a file or a symbolic link to
// someone's file) can receive the write: the open fails and another name is drawn. Its name,
//   <target name>.cumulus-tmp.<host>.<pid>.<random>
// says who made it: <host> is a hash of this machine's host name, so a run on another host that
// shares the directory never takes this host's live temporary for a dead one. Start-up clean-up
// removes only files of exactly that form, for this host, whose process is gone, that are regular
// files owned by this user and no longer than the largest output a writer leaves; a user's own
// "<target>.tmp.123" is never touched.
constexpr const char* kTempMarker = ".cumulus-tmp.";
constexpr std::size_t kHostDigits = 16, kRandomDigits = 8;
// The marker, the host hash, a pid of up to 10 digits, the random part and their dots.
constexpr std::size_t kTempSuffixRoom = 13 + kHostDigits + 1 + 10 + 1 + kRandomDigits;

std::string hex(uint64_t v, std::size_t digits) {
  static const char* kDigits = "0123456789abcdef";
  std::string out(digits, '0');
  for (std::size_t i = digits; i-- > 0; v >>= 4) out[i] = kDigits[v & 15];
  return out;
}

// FNV-1a of the host name: fixed length whatever the name, and the same in every process.
const std::string& host_tag() {
  static const std::string tag = [] {
    char name[256] = {};
    if (::gethostname(name, sizeof(name) - 1) != 0) std::strcpy(name, "unknown-host");
    uint64_t h = 1469598103934665603ull;
    for (const char* c = name; *c != '\0'; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 1099511628211ull;
    return hex(h, kHostDigits);
  }();
  return tag;
}

std::string temp_prefix(const std::string& target) {
  const std::string base = base_name(target);
  const std::string dir = parent_dir(target);
  const std::string kept = base.substr(0, std::min<std::size_t>(base.size(), NAME_MAX - kTempSuffixRoom));
  return (target.find('/') == std::string::npos ? "" : dir + (dir == "/" ? "" : "/")) + kept + kTempMarker;
}

std::string temp_name(const std::string& target, long pid, uint64_t random) {
  return temp_prefix(target) + host_tag() + "." + std::to_string(pid) + "." + hex(random, kRandomDigits);
}

// Random bits for temporary names: from the kernel, and never the same twice in a process.
uint64_t random_bits() {
  static std::atomic<uint64_t> counter{0};
  uint64_t v = 0;
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    if (::read(fd, &v, sizeof(v)) != static_cast<ssize_t>(sizeof(v))) v = 0;
    ::close(fd);
  }
  const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  return v ^ (static_cast<uint64_t>(now) * 0x9e3779b97f4a7c15ull) ^ (++counter << 40);
}

// Creates a new temporary file for `target` (see Note [Temporary files]) and returns its
// descriptor, its name in `tmp`. An existing name, a link included, is never opened: another is drawn.
int create_temp_file(const std::string& target, mode_t mode, std::string& tmp) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    tmp = temp_name(target, ::getpid(), random_bits());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  errno = EEXIST;
  return -1;
}
}  // namespace

std::string resolve_output_path(const std::string& path) {
  std::string current = path;
  for (int hops = 0;; ++hops) {
    struct stat st {};
    if (::lstat(current.c_str(), &st) != 0) {
      if (errno == ENOENT) return current;  // a new file (or a dangling link's target): created by the write
      fail("inspect", current);
    }
    if (S_ISREG(st.st_mode)) return current;
    if (!S_ISLNK(st.st_mode))
      throw Error("cannot write '" + path + "'" + (current == path ? "" : " (a link to '" + current + "')") +
                  ": it is " + kind_of(st.st_mode) + "; outputs must be regular files");
    if (hops >= 40) throw Error("cannot write '" + path + "': too many levels of symbolic links");
    std::vector<char> buf(static_cast<std::size_t>(st.st_size > 0 ? st.st_size : PATH_MAX) + 1);
    const ssize_t n = ::readlink(current.c_str(), buf.data(), buf.size() - 1);
    if (n < 0) fail("read the symbolic link", current);
    std::string target(buf.data(), static_cast<std::size_t>(n));
    // A relative link is relative to the directory holding it.
    current = target.front() == '/' || current.find('/') == std::string::npos
                  ? target
                  : parent_dir(current) + (parent_dir(current) == "/" ? "" : "/") + target;
  }
}

std::string temp_path_for(const std::string& target, long pid, uint64_t random) {
  return temp_name(target, pid, random);
}

namespace {
bool all_of(const std::string& s, const char* chars) {
  return !s.empty() && s.find_first_not_of(chars) == std::string::npos;
}

// The pid of a temporary file this host's writers name "<prefix><host>.<pid>.<random>"; 0 for
// any other name.
long temp_file_pid(const std::string& name, const std::string& name_prefix) {
  if (name.size() <= name_prefix.size() || name.compare(0, name_prefix.size(), name_prefix) != 0) return 0;
  const std::string rest = name.substr(name_prefix.size());
  const std::size_t dot1 = rest.find('.'), dot2 = rest.rfind('.');
  if (dot1 == std::string::npos || dot1 == dot2 || rest.substr(0, dot1) != host_tag()) return 0;
  const std::string pid = rest.substr(dot1 + 1, dot2 - dot1 - 1), random = rest.substr(dot2 + 1);
  if (pid.size() > 10 || !all_of(pid, "0123456789") || random.size() != kRandomDigits ||
      !all_of(random, "0123456789abcdef"))
    return 0;
  return std::strtol(pid.c_str(), nullptr, 10);
}
}  // namespace

int remove_stale_temp_files(const std::string& target) {
  const std::string prefix = temp_prefix(target);
  const std::string dir = parent_dir(prefix), name_prefix = base_name(prefix);
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  int removed = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    const long pid = temp_file_pid(name, name_prefix);
    // Only a writer on this host that no longer exists; kill(pid, 0) fails with ESRCH exactly then.
    if (pid <= 0 || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    const std::string full = dir + "/" + name;
    struct stat st {};
    if (::lstat(full.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::getuid() && st.st_nlink == 1 &&
        ::unlink(full.c_str()) == 0)
      ++removed;
  }
  ::closedir(d);
  return removed;
}

void check_output_writable(const std::string& path) {
  const std::string target = resolve_output_path(path);
  std::string tmp;
  const int fd = create_temp_file(target, 0600, tmp);
  if (fd < 0)
    throw Error("cannot write '" + path + "': cannot create a file in '" + parent_dir(target) +
                "': " + std::strerror(errno));
  ::close(fd);
  ::unlink(tmp.c_str());
}

int open_regular_file(const std::string& path, const std::string& where, uint64_t& size) {
  // O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer, forever and past SIGTERM
  // (the handler only sets a flag). O_NOCTTY: a terminal named as a file must not become ours.
  int fd;
  do fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    if (errno == ENOENT) throw Error(where + "not found");
    throw Error(where + "cannot open: " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int saved = errno;
    ::close(fd);
    throw Error(where + "cannot stat: " + std::strerror(saved));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(where + "is " + kind_of(st.st_mode) + ", not a regular file");
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    const int saved = errno;
    ::close(fd);
    throw Error(where + "cannot switch to blocking reads: " + std::strerror(saved));
  }
  size = static_cast<uint64_t>(st.st_size);
  return fd;
}

namespace {
// The name a write replaces: the link's final target (follow), or the name as given (replace),
// which must then be a regular file, a symlink (replaced, not followed) or absent.
std::string write_target(const std::string& path, OutputLinks links) {
  if (links == OutputLinks::follow) return resolve_output_path(path);
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return path;
    fail("inspect", path);
  }
  if (!S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode))
    throw Error("cannot write '" + path + "': it is " + kind_of(st.st_mode) + "; outputs must be regular files");
  return path;
}
}  // namespace

std::string read_regular_file(const std::string& path, const std::string& where, uint64_t max_bytes) {
  uint64_t size = 0;
  const int fd = open_regular_file(path, where, size);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (size > max_bytes)
    throw Error(where + "is " + std::to_string(size) + " bytes; at most " + std::to_string(max_bytes) +
                " are read");
  std::string content;
  try {
    content.resize(static_cast<std::size_t>(size));
  } catch (const std::bad_alloc&) {
    throw OutOfMemory(where + "out of memory while reading it (" + std::to_string(size) + " bytes)");
  }
  std::size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::read(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error(where + "read failed: " + std::strerror(errno));
    if (n == 0) throw Error(where + "shrank while it was read (" + std::to_string(done) + " of " +
                            std::to_string(size) + " bytes)");
    done += static_cast<std::size_t>(n);
  }
  char extra = 0;
  if (::read(fd, &extra, 1) > 0) throw Error(where + "grew while it was read (past " + std::to_string(size) + " bytes)");
  return content;
}

void write_file_atomic(const std::string& path, const std::string& content, OutputLinks links) {
  const std::string target = write_target(path, links);
  // A replaced file keeps its permissions (a private checkpoint stays private); a new one gets
  // 0666 less the umask, as any new file. The temporary starts no wider than the result. A link
  // that is replaced lends nothing: lstat sees the link, not its target.
  struct stat existing {};
  const bool replacing = (links == OutputLinks::follow ? ::stat(target.c_str(), &existing)
                                                        : ::lstat(target.c_str(), &existing)) == 0 &&
                         S_ISREG(existing.st_mode);
  const mode_t mode = replacing ? (existing.st_mode & 07777) : 0666;
  std::string tmp;
  const int fd = create_temp_file(target, replacing ? (mode & 0700) : mode, tmp);
  if (fd < 0) fail("create a temporary file for", target);
  if (replacing && ::fchmod(fd, mode) != 0) {
    const int saved = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    errno = saved;
    fail("set the permissions of", tmp);
  }
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
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int saved = errno;
    ::unlink(tmp.c_str());
    errno = saved;
    fail("rename a temporary file onto", target);
  }
  const int dir = ::open(parent_dir(target).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);  // best effort: some filesystems refuse fsync on directories
    ::close(dir);
  }
}

AppendFile::AppendFile(const std::string& path) : path_(path) {
  // O_NOFOLLOW: a symlink at the name fails with ELOOP; O_NONBLOCK: a FIFO there cannot hang the open.
  do fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
  while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) {
    if (errno == ELOOP) throw Error("'" + path + "': is a symbolic link now; a log is never written through one");
    throw Error("'" + path + "': cannot be opened for appending: " + std::strerror(errno));
  }
  struct stat st {};
  const bool inspected = ::fstat(fd_, &st) == 0;
  if (!inspected || !S_ISREG(st.st_mode)) {
    const std::string kind = inspected ? kind_of(st.st_mode) : "not inspectable";
    ::close(fd_);
    fd_ = -1;
    throw Error("'" + path + "': is " + kind + " now, not a regular file");
  }
}

AppendFile::AppendFile(AppendFile&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) { other.fd_ = -1; }

AppendFile& AppendFile::operator=(AppendFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);
}

void AppendFile::write(const std::string& bytes) {
  if (fd_ < 0) return;
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error("'" + path_ + "': write failed: " + std::strerror(n < 0 ? errno : EIO));
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace cumulus::io
