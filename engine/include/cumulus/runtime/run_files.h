// The files a run reads and writes, checked before any work, so that nothing a user types loses data
// and a run never trains for an hour and then fails to save. Two paths are the same file when their
// canonical forms are equal or, where both exist, their device and inode are (a hard link, or a
// symlink to the file: an output's identity is that of the file a write lands in, a symlink's
// target). Each check throws InvalidArgument whose message names the file by its RunFile::name.
//
//   std::vector<RunFile> outputs = {{"--checkpoint", ckpt}, {"--metrics", metrics}};
//   check_inputs_readable({{"--resume", resume}});
//   check_outputs_writable(outputs);
//   check_outputs_distinct(outputs, {{"--resume", resume}}, resume_may_be_overwritten);
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace cumulus {

struct RunFile {
  std::string name;  // how messages name it: "--save", "rank 1's --trace"
  std::string path;
};

// Each input (an empty path skipped) exists, is a regular file (not a directory, a FIFO, a device)
// and is readable by this process.
void check_inputs_readable(const std::vector<RunFile>& inputs);

// Each output's directory takes a new file now (io::check_output_writable), its name fits the
// filesystem, and the temporary files an earlier writer of it left when it died are removed.
void check_outputs_writable(const std::vector<RunFile>& outputs);

// No two outputs are the same file, and no output is an input but where `may_replace(input,
// output)` allows it (a checkpoint written over the one resumed, read in full before).
void check_outputs_distinct(const std::vector<RunFile>& outputs, const std::vector<RunFile>& inputs,
                            const std::function<bool(const RunFile& input, const RunFile& output)>& may_replace = {});

// No output is the file this process's standard output or error is redirected to.
void check_outputs_not_standard_streams(const std::vector<RunFile>& outputs);

// No output is a regular file in `directory` (`what` names its files: "the dataset").
void check_outputs_outside(const std::vector<RunFile>& outputs, const std::string& directory, const std::string& what);

}  // namespace cumulus
