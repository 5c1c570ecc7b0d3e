#include "cumulus/models/text.h"

#include <algorithm>

#include "cumulus/core/error.h"

namespace cumulus::models {

CharVocabulary CharVocabulary::of_text(const std::string& text) {
  bool present[256] = {};
  for (unsigned char c : text) present[c] = true;
  std::string symbols;
  for (int b = 0; b < 256; ++b)
    if (present[b]) symbols.push_back(static_cast<char>(b));
  CUMULUS_CHECK(!symbols.empty(), InvalidArgument, "CharVocabulary: the text is empty");
  return from_symbols(symbols);
}

CharVocabulary CharVocabulary::from_symbols(const std::string& symbols) {
  CUMULUS_CHECK(!symbols.empty(), InvalidArgument, "CharVocabulary: no symbols");
  CharVocabulary v;
  v.symbols_ = symbols;
  std::fill(std::begin(v.token_of_), std::end(v.token_of_), int16_t{-1});
  for (std::size_t i = 0; i < symbols.size(); ++i) {
    const auto b = static_cast<unsigned char>(symbols[i]);
    CUMULUS_CHECK(v.token_of_[b] < 0, InvalidArgument, "CharVocabulary: byte ", int(b), " appears twice");
    v.token_of_[b] = static_cast<int16_t>(i);
  }
  return v;
}

std::vector<int32_t> CharVocabulary::encode(const std::string& text) const {
  std::vector<int32_t> tokens(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const int16_t t = token_of_[static_cast<unsigned char>(text[i])];
    CUMULUS_CHECK(t >= 0, InvalidArgument, "byte ", int(static_cast<unsigned char>(text[i])), " at offset ", i,
                  " is not in the vocabulary of ", size(), " symbols");
    tokens[i] = t;
  }
  return tokens;
}

std::string CharVocabulary::decode(const std::vector<int64_t>& tokens) const {
  std::string text;
  text.reserve(tokens.size());
  for (int64_t t : tokens) {
    CUMULUS_CHECK(t >= 0 && t < size(), InvalidArgument, "token ", t, " is outside the vocabulary of ", size());
    text.push_back(symbols_[static_cast<std::size_t>(t)]);
  }
  return text;
}

TokenSplit split_tokens(const std::vector<int32_t>& tokens, double train_fraction, int64_t min_tokens) {
  CUMULUS_CHECK(train_fraction > 0.0 && train_fraction < 1.0, InvalidArgument, "split_tokens: the training fraction ",
                train_fraction, " is not in (0, 1)");
  const auto n = static_cast<int64_t>(tokens.size());
  const auto n_train = static_cast<int64_t>(static_cast<double>(n) * train_fraction);
  CUMULUS_CHECK(n_train >= min_tokens && n - n_train >= min_tokens, InvalidArgument, "the text holds ", n,
                " tokens: its training part (", n_train, ") and validation part (", n - n_train,
                ") must each hold at least ", min_tokens, " (the context + 1)");
  const std::vector<int32_t> train(tokens.begin(), tokens.begin() + n_train),
      validation(tokens.begin() + n_train, tokens.end());
  return {Tensor::from_vector(train, Shape{n_train}), Tensor::from_vector(validation, Shape{n - n_train})};
}

}  // namespace cumulus::models
