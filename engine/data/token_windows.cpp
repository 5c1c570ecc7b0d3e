// Note [Token windows]
// A language model's epoch is not a permutation of rows: nanoGPT and llm.c draw windows at random
// offsets of one long token stream. Here window `row` of batch `index` starts at
// splitmix64(splitmix64(splitmix64(seed) ^ index) ^ row) mod (n - T): a function of its coordinates
// alone, so a run resumed at micro-batch i draws exactly the batches an uninterrupted run would, and
// a PyTorch twin reads the same windows from the same three integers. The modulo's bias is below
// (n - T) / 2^64. The stream stays on the host (5 MB of text is 20 MB of i32 tokens) and a batch is
// gathered there and copied to the device: 2 x B x T integers a micro-batch, small beside its
// compute, and the device holds only the batch.
#include "cumulus/data/token_windows.h"

#include <algorithm>
#include <utility>

#include "cumulus/core/error.h"
#include "cumulus/memory/category.h"

namespace cumulus::data {

namespace {

uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

int64_t token_window_offset(uint64_t seed, int64_t index, int64_t row, int64_t range) {
  const uint64_t h =
      splitmix64(splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(index)) ^ static_cast<uint64_t>(row));
  return static_cast<int64_t>(h % static_cast<uint64_t>(range));
}

TokenWindows::TokenWindows(Tensor tokens, int64_t context, uint64_t seed, Device device)
    : tokens_(std::move(tokens)), context_(context), seed_(seed), device_(device) {
  CUMULUS_CHECK(
      tokens_.defined() && tokens_.ndim() == 1 && (tokens_.dtype() == DType::i32 || tokens_.dtype() == DType::i64),
      InvalidArgument, "TokenWindows: tokens must be a 1-D i32 or i64 tensor, got ",
      tokens_.defined() ? tokens_.str() : std::string("an undefined tensor"));
  CUMULUS_CHECK(context_ >= 1, InvalidArgument, "TokenWindows: the context must be at least 1, got ", context_);
  CUMULUS_CHECK(tokens_.size(0) >= context_ + 1, InvalidArgument, "TokenWindows: ", tokens_.size(0),
                " tokens cannot hold one window of ", context_ + 1, " (context ", context_, " + 1)");
  tokens_ = tokens_.to(Device::cpu()).contiguous();
}

std::vector<int64_t> TokenWindows::random_offsets(int64_t index, int64_t batch) const {
  CUMULUS_CHECK(index >= 0 && batch >= 1, InvalidArgument, "TokenWindows::random_offsets: index (", index,
                ") must be >= 0 and batch (", batch, ") >= 1");
  std::vector<int64_t> offsets(static_cast<std::size_t>(batch));
  const int64_t range = num_tokens() - context_;
  for (int64_t r = 0; r < batch; ++r)
    offsets[static_cast<std::size_t>(r)] = token_window_offset(seed_, index, r, range);
  return offsets;
}

Batch TokenWindows::random_batch(int64_t index, int64_t batch) const {
  return windows_at(random_offsets(index, batch));
}

Batch TokenWindows::sequential_batch(int64_t first, int64_t batch) const {
  const int64_t windows = num_sequential_windows();
  CUMULUS_CHECK(first >= 0 && first < windows && batch >= 1, InvalidArgument,
                "TokenWindows::sequential_batch: windows [", first, ", ", first + batch, ") of ", windows);
  std::vector<int64_t> offsets;
  for (int64_t w = first; w < std::min(first + batch, windows); ++w) offsets.push_back(w * context_);
  return windows_at(offsets);
}

namespace {

template <typename T>
Batch gather_windows(const Tensor& tokens, const std::vector<int64_t>& offsets, int64_t t, Device device) {
  const T* stream = tokens.data<T>();
  const int64_t b = static_cast<int64_t>(offsets.size());
  std::vector<T> x(static_cast<std::size_t>(b * t)), y(x.size());
  for (int64_t r = 0; r < b; ++r)
    for (int64_t i = 0; i < t; ++i) {
      const int64_t at = offsets[static_cast<std::size_t>(r)] + i;
      x[static_cast<std::size_t>(r * t + i)] = stream[at];
      y[static_cast<std::size_t>(r * t + i)] = stream[at + 1];
    }
  MemoryCategoryScope scope(MemoryCategory::data);
  // The unit of accumulation is the token: the loss sums over b x t of them.
  return Batch{Tensor::from_vector(x, Shape{b, t}, device), Tensor::from_vector(y, Shape{b, t}, device), {}, b * t};
}

}  // namespace

Batch TokenWindows::windows_at(const std::vector<int64_t>& offsets) const {
  CUMULUS_CHECK(!offsets.empty(), InvalidArgument, "TokenWindows: a batch needs at least one window");
  for (int64_t o : offsets)
    CUMULUS_CHECK(o >= 0 && o + context_ + 1 <= num_tokens(), InvalidArgument, "TokenWindows: a window at ", o,
                  " passes the end of ", num_tokens(), " tokens");
  return tokens_.dtype() == DType::i32 ? gather_windows<int32_t>(tokens_, offsets, context_, device_)
                                       : gather_windows<int64_t>(tokens_, offsets, context_, device_);
}

}  // namespace cumulus::data
