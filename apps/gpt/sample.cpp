// gpt sample: weights checked like any untrusted file (config ranges, tensor names and shapes before
// their data, finite values), a prompt continued, the text written to standard output, whose
// failure (closed, full) is an error.
#include <cstdio>
#include <string>
#include <vector>

#include <cumulus/cumulus.h>
#include <cumulus/io/run_files.h>
#include <cumulus/models/gpt.h>
#include "common/command_line.h"

#include "flags.h"

using namespace cumulus;

namespace gpt {

int sample(const SampleFlags& flags) {
  SampleFlags f = flags;
  check_sample_flags(f);
  Device device;
  try {
    device = app::device_from_flag(f.device);
  } catch (const Error& e) {
    throw UsageError("--device " + f.device + ": " + e.what());
  }
  try {
    io::check_run_files({{{"--load", f.load}}, {}, {}});
  } catch (const InvalidArgument& e) {
    throw UsageError(e.what());
  }
  use_cpu_threads(f.threads);
  const models::GPTCheckpointInfo info = models::read_gpt_checkpoint(f.load);
  models::check_gpt_weights(f.load, info.config);  // before a model of the size it claims is allocated
  Generator gen(0);
  models::GPT model(info.config, gen, device);
  models::load_gpt_weights(f.load, model);
  std::vector<int64_t> prompt;
  try {
    for (int32_t t : info.vocabulary.encode(f.prompt)) prompt.push_back(t);
  } catch (const InvalidArgument& e) {
    throw UsageError(std::string("--prompt: ") + e.what() + " (the vocabulary of --load '" + f.load + "')");
  }
  if (prompt.empty()) throw UsageError("--prompt: empty (give at least one character)");
  const std::vector<int64_t> tokens =
      models::generate(model, prompt, f.length, f.temperature, f.top_k, static_cast<uint64_t>(f.seed));
  const std::string out = info.vocabulary.decode(tokens);
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fputc('\n', stdout);
  io::check_standard_output();
  return 0;
}

}  // namespace gpt
