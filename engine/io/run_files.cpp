#include "cumulus/io/run_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "cumulus/core/error.h"
#include "cumulus/io/file.h"

namespace cumulus::io {
namespace {

namespace fs = std::filesystem;

// Who a path is: its canonical form (symlinks resolved as far as the path exists) and, when it
// exists, its device and inode.
struct Identity {
  std::string canonical;
  bool exists = false;
  dev_t device = 0;
  ino_t inode = 0;
};

Identity identify(const std::string& path) {
  Identity id;
  std::error_code ec;
  const fs::path canonical = fs::weakly_canonical(fs::absolute(path, ec), ec);
  id.canonical = ec ? path : canonical.string();
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    id.exists = true;
    id.device = st.st_dev;
    id.inode = st.st_ino;
  }
  return id;
}

bool same_file(const Identity& a, const Identity& b) {
  return a.canonical == b.canonical || (a.exists && b.exists && a.device == b.device && a.inode == b.inode);
}

Identity identify_output(const RunFile& f) {
  try {
    return identify(io::resolve_output_path(f.path));
  } catch (const Error& e) {
    throw InvalidArgument(f.name + ": " + e.what());
  }
}

std::vector<Identity> identify_outputs(const std::vector<RunFile>& outputs) {
  std::vector<Identity> ids;
  for (const RunFile& f : outputs) ids.push_back(identify_output(f));
  return ids;
}

std::string describe_kind(const fs::file_status& st) {
  switch (st.type()) {
    case fs::file_type::directory: return "a directory";
    case fs::file_type::fifo: return "a FIFO";
    case fs::file_type::character: return "a character device";
    case fs::file_type::block: return "a block device";
    case fs::file_type::socket: return "a socket";
    default: return "not a regular file";
  }
}

}  // namespace

void check_inputs_readable(const std::vector<RunFile>& inputs) {
  for (const RunFile& f : inputs) {
    if (f.path.empty()) continue;
    std::error_code ec;
    const fs::file_status st = fs::status(f.path, ec);
    if (!fs::exists(st)) throw InvalidArgument(f.name + " '" + f.path + "': no such file");
    if (!fs::is_regular_file(st))
      throw InvalidArgument(f.name + " '" + f.path + "' is " + describe_kind(st) + ", not a regular file");
    if (::access(f.path.c_str(), R_OK) != 0) throw InvalidArgument(f.name + " '" + f.path + "': not readable");
  }
}

void check_outputs_writable(const std::vector<RunFile>& outputs) {
  for (const RunFile& f : outputs) {
    const std::string name = fs::path(identify_output(f).canonical).filename().string();
    if (name.size() > NAME_MAX)
      throw InvalidArgument(f.name + " '" + f.path + "': the file name is " + std::to_string(name.size()) +
                            " bytes long; the filesystem allows at most " + std::to_string(NAME_MAX));
    try {
      io::remove_stale_temp_files(io::resolve_output_path(f.path));
      io::check_output_writable(f.path);
    } catch (const Error& e) {
      throw InvalidArgument(f.name + ": " + e.what());
    }
  }
}

void check_outputs_distinct(const std::vector<RunFile>& outputs, const std::vector<RunFile>& inputs,
                            const std::function<bool(const RunFile& input, const RunFile& output)>& may_replace) {
  const std::vector<Identity> ids = identify_outputs(outputs);
  for (std::size_t i = 0; i < outputs.size(); ++i)
    for (std::size_t j = i + 1; j < outputs.size(); ++j)
      if (same_file(ids[i], ids[j]))
        throw InvalidArgument(outputs[i].name + " '" + outputs[i].path + "' and " + outputs[j].name + " '" +
                              outputs[j].path + "' are the same file; give each output its own file");
  for (const RunFile& in : inputs) {
    if (in.path.empty()) continue;
    const Identity input = identify(in.path);
    for (std::size_t i = 0; i < outputs.size(); ++i)
      if (!(may_replace && may_replace(in, outputs[i])) && same_file(input, ids[i]))
        throw InvalidArgument(outputs[i].name + " '" + outputs[i].path + "' is the " + in.name + " file '" + in.path +
                              "'; writing it would destroy the input. Give the output another name");
  }
}

void check_outputs_not_standard_streams(const std::vector<RunFile>& outputs) {
  // Writing an output there would replace the file the shell is still writing.
  const std::vector<Identity> ids = identify_outputs(outputs);
  for (const int fd : {1, 2}) {
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) continue;
    for (std::size_t i = 0; i < outputs.size(); ++i)
      if (ids[i].exists && ids[i].device == st.st_dev && ids[i].inode == st.st_ino)
        throw InvalidArgument(outputs[i].name + " '" + outputs[i].path + "' is the file this run's standard " +
                              (fd == 1 ? "output" : "error") + " goes to; give the output its own file");
  }
}

void check_outputs_not_links(const std::vector<RunFile>& outputs) {
  for (const RunFile& f : outputs) {
    std::error_code ec;
    if (!fs::is_symlink(fs::symlink_status(f.path, ec))) continue;
    const fs::path target = fs::read_symlink(f.path, ec);
    throw InvalidArgument(f.name + " '" + f.path + "' is a symbolic link (to '" + target.string() +
                          "'); outputs are written in place of their name, never through a link: give the "
                          "file's own path");
  }
}

void check_run_files(const RunFiles& files) {
  std::vector<RunFile> outputs;
  for (const RunFile& f : files.outputs)
    if (!f.path.empty()) outputs.push_back(f);
  check_inputs_readable(files.inputs);
  check_outputs_not_links(outputs);
  check_outputs_writable(outputs);
  check_outputs_distinct(outputs, files.inputs, files.may_replace);
  check_outputs_not_standard_streams(outputs);
}

void prepare_run_files() {
  for (const int fd : {0, 1, 2}) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    // open() returns the lowest free number, which is `fd` itself while it is closed.
    const int held = ::open("/dev/null", O_RDONLY);
    if (held >= 0 && held != fd) ::close(held);
  }
  // A closed pipe or a file-size limit fails the write (EPIPE, EFBIG) instead of killing the
  // process mid-write, so a run still reports the failure and can checkpoint.
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGXFSZ, SIG_IGN);
}

void check_standard_output() {
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  if (flushed && !std::ferror(stdout)) return;
  const int saved = errno;
  throw Error(std::string("cannot write to standard output: ") +
              (saved != 0 ? std::strerror(saved) : "an earlier write failed"));
}

void check_outputs_outside(const std::vector<RunFile>& outputs, const std::string& directory, const std::string& what) {
  if (outputs.empty()) return;
  const std::vector<Identity> ids = identify_outputs(outputs);
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(directory, ec)) {
    if (!entry.is_regular_file(ec)) continue;
    const Identity file = identify(entry.path().string());
    for (std::size_t i = 0; i < outputs.size(); ++i)
      if (same_file(file, ids[i]))
        throw InvalidArgument(outputs[i].name + " '" + outputs[i].path + "' is a file of " + what + " in '" +
                              directory + "'; writing it would destroy the data. Give the output another name");
  }
}

std::string rank_path(const std::string& path, int rank) {
  if (path.empty()) return path;
  const std::string suffix = ".rank" + std::to_string(rank);
  const std::size_t slash = path.find_last_of('/');
  const std::size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) || dot == slash + 1) return path + suffix;
  return path.substr(0, dot) + suffix + path.substr(dot);
}

}  // namespace cumulus::io
