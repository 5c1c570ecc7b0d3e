// gpt: a character-level GPT (models::GPT) trained with gradient accumulation on a text corpus
// (Shakespeare by default), and sampled from its weights: nanoGPT's job on cumulus.
//   gpt train  --data DIR|FILE --context T --width C --heads H --layers L --micro-batch B --accum-steps N
//              --steps S --lr LR ... --metrics FILE --save FILE [--resume FILE]
//   gpt sample --load FILE --prompt TEXT --length N --temperature X --top-k K --seed K
//   gpt --version
// Exit codes: 0 done, 1 a runtime error (data, files, memory), 2 a usage error naming the flag,
// 130/143 stopped by SIGINT/SIGTERM (saved). Every file goes through the library's run-file facility
// (cumulus/io/run_files.h); this file reads the command line and reports.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <new>
#include <string>

#include <cumulus/cumulus.h>
#include <cumulus/io/run_files.h>
#include "common/command_line.h"

#include "flags.h"

using namespace cumulus;

namespace {

constexpr std::size_t kHelpDescriptionColumn = 30;  // CLI11's default

// The first word that is not an option must name a command; CLI11 would only say one is required.
bool names_unknown_command(int argc, char** argv, std::string& word) {
  if (argc < 2 || argv[1][0] == '-') return false;
  word = argv[1];
  return word != "train" && word != "sample";
}

int run_command(CLI::App& cli, const gpt::TrainFlags& train_flags, const gpt::SampleFlags& sample_flags) {
  try {
    return cli.got_subcommand("train") ? gpt::train(train_flags) : gpt::sample(sample_flags);
  } catch (const gpt::UsageError& e) {
    std::fprintf(stderr, "gpt: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "gpt: error: out of memory (a request the system refused); try a smaller model or batch\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  io::prepare_run_files();
  CLI::App cli("gpt: train a character-level GPT with gradient accumulation, and sample from it. The last value "
               "of a repeated flag wins.");
  cli.set_version_flag("--version", app::version_text("gpt"),
                       "print the version, commit, build type and compiled backends, then exit");
  cli.require_subcommand(1);
  gpt::TrainFlags train_flags;
  gpt::SampleFlags sample_flags;
  gpt::add_train_flags(*cli.add_subcommand("train", "train a GPT on a text corpus"), train_flags);
  gpt::add_sample_flags(*cli.add_subcommand("sample", "continue a prompt from saved weights"), sample_flags);
  if (std::string word; names_unknown_command(argc, argv, word)) {
    std::fprintf(stderr, "gpt: unknown command '%s'; expected train or sample (see gpt --help)\n", word.c_str());
    return 2;
  }
  try {
    cli.parse(argc, argv);
  } catch (const CLI::CallForVersion& e) {
    std::printf("%s", e.what());
    return 0;
  } catch (const CLI::CallForHelp&) {
    // The selected subcommand's help, each description wrapped to the terminal under its column.
    std::printf("%s", app::wrap_help_text(cli.help(), app::help_columns() - 1, kHelpDescriptionColumn).c_str());
    return 0;
  } catch (const CLI::CallForAllHelp& e) {
    return cli.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "gpt: %s (see gpt %s --help)\n", e.what(),
                 cli.get_subcommands().empty() ? "" : cli.get_subcommands().front()->get_name().c_str());
    return 2;
  }
  return run_command(cli, train_flags, sample_flags);
}
