// What SGD and AdamW share to keep a state array in 8 bits (Note [8-bit optimizer state] in
// kernels/quantized_state.h): its two arrays, and the view of them an update's span passes to the kernels.
#pragma once

#include <string>
#include <vector>

#include "cumulus/core/error.h"
#include "cumulus/optim/optimizer.h"
#include "kernels/quantized_state.h"

namespace cumulus::optim {

inline void check_state_bits(int bits, const char* optimizer) {
  CUMULUS_CHECK(bits == 32 || bits == 8, InvalidArgument, optimizer, ": state_bits must be 32 or 8, got ", bits);
}

// `name` as codes (u8 per element) and `name`_absmax (f32 per block of a chunk).
inline std::vector<StateSpec> state_8bit_specs(const std::string& name) {
  static_assert(kernels::QuantizedState::kBlock == FrozenChunks::kChunk, "a block is one chunk");
  return {{name, DType::u8, 1}, {name + "_absmax", DType::f32, kernels::QuantizedState::kBlock}};
}

// The span from state element `offset` (a multiple of the block) of state arrays `codes` and `absmax`.
inline kernels::QuantizedState quantized_span(Tensor& codes, Tensor& absmax, int64_t offset) {
  return {codes.data<uint8_t>() + offset, absmax.data<float>() + offset / kernels::QuantizedState::kBlock};
}

}  // namespace cumulus::optim
