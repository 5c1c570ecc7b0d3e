// The files a run reads and writes, checked before any work, so that nothing a user types loses data
// and a run never trains for an hour and then fails to save. Engine API, not app plumbing: a user's
// own training program takes paths from its user too, and needs the same guarantees as ours (issue
// 55). Two paths are the same file when their canonical forms are equal or, where both exist, their
// device and inode are (a hard link, or a symlink to the file: an output's identity is that of the
// file a write lands in, a symlink's target). Each check throws InvalidArgument whose message names
// the file by its RunFile::name.
//
// The one call a program makes before any work, and the set-up of the process's own streams:
//
//   io::prepare_run_files();                                    // first thing in main()
//   io::check_run_files({/*inputs=*/{{"--data", corpus}}, /*outputs=*/{{"--save", save}, {"--metrics", m}}});
//   std::string text = io::read_regular_file(corpus, "--data '" + corpus + "': ", kMaxCorpusBytes);
//   ... train, writing each output with io::OutputLinks::replace ...
//   io::check_standard_output();                                // a lost line is an error, not exit 0
//
// or, piece by piece, as apps/fashion_mnist does:
//   std::vector<io::RunFile> outputs = {{"--checkpoint", ckpt}, {"--metrics", metrics}};
//   io::check_inputs_readable({{"--resume", resume}});
//   io::check_outputs_writable(outputs);
//   io::check_outputs_distinct(outputs, {{"--resume", resume}}, resume_may_be_overwritten);
// The memory tracker's reports are written to such files by memory::write_memory_reports
// (cumulus/memory/report.h).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "cumulus/io/file.h"

namespace cumulus::io {

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

// No output is a symbolic link: an output is written in place of its name (io::OutputLinks::replace),
// so a link there would be replaced, where the user may have meant its target written.
void check_outputs_not_links(const std::vector<RunFile>& outputs);

// Everything a run reads and writes, checked together before any work: each input (empty paths
// skipped) a readable regular file, never opened (a FIFO cannot hang the check); each output not a
// link, its folder writable now (stale temporaries of dead writers removed), not an input (unless
// `may_replace` allows that pair), not another output, not where standard output or error goes.
// Throws InvalidArgument naming the file by its RunFile::name.
struct RunFiles {
  std::vector<RunFile> inputs;
  std::vector<RunFile> outputs;
  std::function<bool(const RunFile& input, const RunFile& output)> may_replace;
};
void check_run_files(const RunFiles& files);

// Sets the process up for its files, first thing in main(): a standard stream that was closed is
// held by /dev/null (opened read-only for output and error, so a write to them fails visibly) and
// no file the run opens takes its number, so progress text never lands in a metrics file; SIGPIPE
// and SIGXFSZ are ignored, so a closed pipe or a file-size limit is an
// error naming the file (its temporary removed) instead of a death by signal.
void prepare_run_files();

// Flushes standard output and throws Error("cannot write to standard output: <reason>") when that
// or any earlier write to it failed (a closed stream, /dev/full, a broken pipe).
void check_standard_output();

// No output is a regular file in `directory` (`what` names its files: "the dataset").
void check_outputs_outside(const std::vector<RunFile>& outputs, const std::string& directory, const std::string& what);

// A rank's own name for a file every rank of a data-parallel job writes: ".rank<k>" before the
// extension ("memory.json" -> "memory.rank1.json", "trace" -> "trace.rank1"); "" stays "".
std::string rank_path(const std::string& path, int rank);

}  // namespace cumulus::io
