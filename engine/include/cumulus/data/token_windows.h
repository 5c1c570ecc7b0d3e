// Windows of a token stream for a language model (Note [Token windows] in engine/data/token_windows.cpp):
// a batch of B windows of T + 1 consecutive tokens gives inputs x = tokens [o, o + T) and targets
// y = tokens [o + 1, o + T + 1), [B, T] each. Training draws each window's offset o from a seed and
// the batch's index alone, so any batch can be made again (an exact resume, a twin in another
// framework) without replaying the ones before it; evaluation walks non-overlapping windows in order.
#pragma once

#include <cstdint>
#include <vector>

#include "cumulus/data/dataset.h"
#include "cumulus/tensor/tensor.h"

namespace cumulus::data {

class TokenWindows {
 public:
  // tokens: 1-D i32 or i64 (kept on the host: a CUDA tensor is copied back once); batches are made
  // on `device`, each copied there from the host (2 x B x T integers). context T >= 1, with at least
  // T + 1 tokens. An InvalidArgument names what is wrong otherwise.
  TokenWindows(Tensor tokens, int64_t context, uint64_t seed, Device device = Device::cpu());

  int64_t context() const { return context_; }
  int64_t num_tokens() const { return tokens_.size(0); }
  uint64_t seed() const { return seed_; }

  // The window offsets of random batch `index` (0, 1, 2, ...: one per micro-batch of the run) of
  // `batch` windows, each uniform over [0, num_tokens - T - 1] (token_window_offset).
  std::vector<int64_t> random_offsets(int64_t index, int64_t batch) const;
  Batch random_batch(int64_t index, int64_t batch) const;

  // Non-overlapping windows in order: window w starts at w * T. There are (num_tokens - 1) / T;
  // batch `first` holds windows [first, first + batch) (fewer at the end).
  int64_t num_sequential_windows() const { return (num_tokens() - 1) / context_; }
  Batch sequential_batch(int64_t first, int64_t batch) const;

  // x and y [B, T] (the tokens' dtype) for windows starting at `offsets`, on the device, category
  // data; units = B x T (the token is the unit the loss sums over).
  Batch windows_at(const std::vector<int64_t>& offsets) const;

 private:
  Tensor tokens_;  // on the host
  int64_t context_;
  uint64_t seed_;
  Device device_;
};

// The offset of window `row` of random batch `index`: splitmix64 chained over (seed, index, row),
// modulo `range` (the number of possible offsets). Written so that another framework computes the
// same (bench/pytorch/gpt.py does).
int64_t token_window_offset(uint64_t seed, int64_t index, int64_t row, int64_t range);

}  // namespace cumulus::data
