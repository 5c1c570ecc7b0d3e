// Files written so that a crash never leaves a half-written one: the content goes to a temporary
// file beside the target, is flushed to disk (fsync), then renamed over the target (atomic on
// POSIX), and the directory is synced so the rename survives a power cut.
#pragma once

#include <string>

namespace cumulus::io {

// Throws cumulus::Error naming the path and the system error on failure; the target is untouched.
// Test hook: CUMULUS_FAULT_INJECT=mid_write or =before_rename makes the process _exit(86) at that
// point of the write (see file.cpp), to test that a crash leaves the previous file intact.
void write_file_atomic(const std::string& path, const std::string& content);

}  // namespace cumulus::io
