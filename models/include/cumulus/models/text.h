// Character-level text for a language model: the vocabulary is the corpus's distinct bytes, in byte
// order (Shakespeare: 84), token i standing for the i-th; text is split into the first 90% for
// training and the rest for validation, as nanoGPT's shakespeare_char.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cumulus/tensor/tensor.h"

namespace cumulus::models {

class CharVocabulary {
 public:
  CharVocabulary() = default;
  // The distinct bytes of `text` (at least one).
  static CharVocabulary of_text(const std::string& text);
  // From symbols(): the bytes in token order (a checkpoint's metadata keeps them so).
  static CharVocabulary from_symbols(const std::string& symbols);
  int64_t size() const { return static_cast<int64_t>(symbols_.size()); }
  const std::string& symbols() const { return symbols_; }
  // Tokens of `text`: an InvalidArgument names the first byte outside the vocabulary and its offset.
  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int64_t>& tokens) const;  // out-of-range tokens: InvalidArgument

 private:
  std::string symbols_;
  int16_t token_of_[256] = {};  // -1: not in the vocabulary (set by the factories)
};

// The training and validation token streams of `text` (1-D i32 tensors on the host): the first
// `train_fraction` of the tokens, then the rest. Each must hold at least `min_tokens`, or an
// InvalidArgument says how short the text is.
struct TokenSplit {
  Tensor train, validation;
};
TokenSplit split_tokens(const std::vector<int32_t>& tokens, double train_fraction, int64_t min_tokens);

}  // namespace cumulus::models
