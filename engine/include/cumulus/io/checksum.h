// SHA-256 checksums of files, for data fetched or found on disk (a dataset's release files, a text
// corpus): the sum is computed by coreutils' sha256sum, present wherever curl is.
#pragma once

#include <string>

namespace cumulus::io {

// Whether `program` is an executable file in a directory of $PATH (what a shell would run): the
// check before relying on an external tool (sha256sum for sha256_of_file, curl for a download).
bool program_on_path(const std::string& program);

// The SHA-256 of the file at `path`, as 64 lower-case hex digits. Throws cumulus::Error naming the
// file when sha256sum cannot be run or fails on it (missing, unreadable).
std::string sha256_of_file(const std::string& path);

}  // namespace cumulus::io
