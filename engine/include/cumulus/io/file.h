// Files written so that a crash never leaves a half-written one: the content goes to a temporary
// file beside the target, is flushed to disk (fsync), then renamed over the target (atomic on
// POSIX), and the directory is synced so the rename survives a power cut.
//
// The temporary file is created under an unpredictable name that must not exist yet (a planted
// file or symlink is never written through), and the result keeps a replaced file's permissions.
//
// Outputs are regular files. By default (OutputLinks::follow) a symlink is followed and its target
// written (atomically, beside the target), so the link survives; with OutputLinks::replace the name
// given is what the rename replaces, so a link (one swapped in while the run went on included) is
// never written through. A device node, FIFO, socket or directory is refused, never replaced by a
// regular file.
#pragma once

#include <cstdint>
#include <string>

namespace cumulus::io {

enum class OutputLinks {
  follow,   // a symlink's target is written; the link stays
  replace,  // the name itself is written: a symlink there is replaced by the file, its target untouched
};

// Throws cumulus::Error naming the path and the system error on failure; the target is untouched
// and the temporary removed (a file-size limit, SIGXFSZ ignored, is such a failure: EFBIG).
// Test hook: CUMULUS_FAULT_INJECT=mid_write or =before_rename makes the process _exit(86) at that
// point of the write (see file.cpp), to test that a crash leaves the previous file intact.
void write_file_atomic(const std::string& path, const std::string& content,
                       OutputLinks links = OutputLinks::follow);

// The file a write to `path` lands in: `path` itself or, for a symlink (chains included), the file
// it finally points to (which may not exist yet). Throws cumulus::Error when that exists and is
// not a regular file, or when the links loop.
std::string resolve_output_path(const std::string& path);

// A temporary file name write_file_atomic may use for `target` in process `pid` on this host:
// "<target>.cumulus-tmp.<host hash>.<pid>.<8 hex digits of random>", shortened where needed so it
// stays within NAME_MAX (Note [Temporary files] in file.cpp). The write itself draws `random` from
// the kernel and creates the file with O_EXCL|O_NOFOLLOW, so a name planted in advance is never used.
std::string temp_path_for(const std::string& target, long pid, uint64_t random);

// Removes the temporary files that writers of `target` on this host left when they died (their
// process no longer runs): only names of exactly the form above, regular files owned by this user.
// A live writer's file, another host's, and any other file (a user's "<target>.tmp.1") are left
// alone. Returns how many were removed.
int remove_stale_temp_files(const std::string& target);

// Checks before any work that write_file_atomic(path, ...) will be able to create its temporary
// file (the directory exists and is writable, the filesystem takes new files, the name fits):
// creates the temporary file and removes it. Throws cumulus::Error naming `path` and the reason.
void check_output_writable(const std::string& path);

// Opens `path` read-only for loading and returns the descriptor (the caller closes it), with the
// file's size in `size`. Only a regular file is accepted: the open is non-blocking, so a FIFO
// without a writer or a device cannot hang it; anything else is refused after fstat ("is a FIFO,
// not a regular file"), and the descriptor is switched back to blocking reads. Error messages
// start with `where`, which names the file: "not found", "cannot open: <reason>", "is a ...".
int open_regular_file(const std::string& path, const std::string& where, uint64_t& size);

// The whole of a regular file (open_regular_file's checks), refused before anything is allocated
// when it holds more than `max_bytes` ("<where>is 5000000000 bytes; at most 268435456 are read").
// Running out of memory is an OutOfMemory naming the file and the size; a file that shrinks or
// grows while it is read is an Error.
std::string read_regular_file(const std::string& path, const std::string& where, uint64_t max_bytes);

// A log's file, added to a line at a time after write_file_atomic created it: opened for appending
// without following a symlink (one swapped in since is refused, never written through) and only
// if it is a regular file, never created here. Each write() is whole or an Error naming the file
// and the reason (a full disk; a file-size limit, SIGXFSZ ignored, is EFBIG).
class AppendFile {
 public:
  AppendFile() = default;  // writes nothing
  explicit AppendFile(const std::string& path);
  AppendFile(AppendFile&& other) noexcept;
  AppendFile& operator=(AppendFile&& other) noexcept;
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  ~AppendFile();

  void write(const std::string& bytes);

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace cumulus::io
