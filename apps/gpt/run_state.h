// What `gpt train` reads and keeps: the corpus, and the run's state in two files, the weights a
// PyTorch user loads (--save FILE: nanoGPT's names, the config and vocabulary in the metadata) and
// the library's training checkpoint beside them (FILE.state: the weights again, AdamW's moments, the
// counters, and every setting that changes the result, so a resume with another is refused).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <cumulus/models/gpt.h>
#include <cumulus/optim/optimizer.h>
#include <cumulus/train/checkpoint.h>
#include <cumulus/train/trainer.h>

#include "flags.h"

namespace gpt {

// The corpus: --data (a folder holding shakespeare.txt, or a text file), $CUMULUS_SHAKESPEARE,
// ./data/shakespeare, ../shared/data/shakespeare. `is_default`: found as shakespeare.txt, whose
// SHA-256 is then checked.
struct Corpus {
  std::string path;
  std::string flag;  // how messages name it: "--data", "$CUMULUS_SHAKESPEARE"
  bool is_default = false;
};
Corpus locate_corpus(const std::string& data_flag);

// Its text: a regular file of at most kMaxCorpusBytes, not empty (the default one's sum checked).
constexpr uint64_t kMaxCorpusBytes = uint64_t{256} << 20;
std::string read_corpus(const Corpus& corpus);

// The training state beside --save's (and --resume's) weights.
std::string state_path(const std::string& weights_path);

// Every setting that changes the run's result, as its checkpoint records them; the text's digest
// stands for the data.
std::vector<cumulus::train::RecordedSetting> run_settings(const TrainFlags& flags, const std::string& text);

// Writes the weights and then the training state, each atomically and in place of its name (never
// through a link). The state is taken at the trainer's last group boundary. Under mpirun every rank
// calls it (a ZeRO run's optimizer state is gathered at rank 0) and only the one that `writes` writes.
void save_run(const std::string& weights_path, const cumulus::models::GPT& model,
              const cumulus::models::CharVocabulary& vocabulary, cumulus::train::Trainer& trainer,
              const std::vector<cumulus::train::RecordedSetting>& settings, bool writes = true);

// Restores the weights, AdamW's state and the trainer's counters from --resume's two files: the
// settings must equal this run's (each that differs is named), the position a step boundary within
// --steps, and the weights file must hold the state's weights. Returns the first micro-batch to run.
int64_t resume_run(const std::string& weights_path, cumulus::models::GPT& model, cumulus::train::Trainer& trainer,
                   const std::vector<cumulus::train::RecordedSetting>& settings, int64_t micro_batches,
                   int64_t accum_steps);

}  // namespace gpt
