// Block-wise 8-bit optimizer state (Note [8-bit optimizer state]): the dynamic quantization maps
// and the rounding to the nearest code, shared by the CPU loops (kernels/cpu/optim.cpp) and the
// CUDA kernels (kernels/cuda/optim.cu), so both devices store the same codes and scales.
#pragma once

#include <cmath>
#include <cstdint>

#include "cumulus/optim/update_scalars.h"
#include "kernels/host_device.h"

namespace cumulus::kernels {

// Note [8-bit optimizer state]
// An optimizer's state array (SGD's momentum, AdamW's two moments) can be kept in 8 bits per element
// plus one f32 per block of kBlock elements, as in Dettmers et al., "8-bit Optimizers via Block-wise
// Quantization" (2022). Each update dequantizes a block (code -> map value x the block's absmax),
// applies the fp32 rule of kernels/optim_rules.h unchanged, and requantizes the block with its new
// absmax (the largest |value|), all in one pass: no fp32 copy of the state ever exists in memory.
// - The block is one frozen chunk, 64 elements: the chunk is the unit at which parameters start
//   (FlatParameters aligns every slot to it), groups split into spans and parameters freeze, so no
//   block is ever shared by two parameters, two spans or a frozen and a trained chunk, and a frozen
//   chunk's codes and scale stay bit-identical. Scales cost 4/64 bytes per element: 1.0625 bytes
//   against fp32's 4, 26.6% (2048-element blocks would give 25.05%, at a coarser scale per value).
// - The maps are the paper's dynamic tree: after an optional sign bit, the number of leading zero
//   bits is a decimal exponent E, the first set bit an indicator, and the q bits after it a linear
//   fraction in (0.1, 1], so the code read as an integer j = 2^q + k (k < 2^q) decodes to
//   10^-E x (0.1 + 0.9 (k + 1) / 2^q), increasing with j, and j = 0 to zero. The first moment and
//   momentum take the signed map (a sign bit and 7 bits: magnitudes 1e-6 to 1), the second moment,
//   never negative, the unsigned one (8 bits: 1e-7 to 1). The top code of each is exactly 1, so the
//   block's largest element survives a round trip up to its absmax's rounding. Both are computed
//   here, once per process on the CPU and once per CUDA block in shared memory, from one function.
// - Rounding is to the nearest code (ties to the smaller magnitude), not stochastic: it is
//   deterministic, so the CPU and CUDA give the same codes (both files are compiled without
//   contraction: Note [CUDA bit parity]) and a resumed run continues bit-exactly without random
//   state in the checkpoint. Its known cost is stagnation:
//   a moving average whose per-step change is under half a code's gap stays put until its block's
//   absmax moves; the per-block scale keeps gaps relative to the block (0.35% to 7% of a value in
//   the top decade), and bench/results/*-cpu-8bit-adamw measures the effect on the GPT.
// - An all-zero block has absmax 0 and decodes to zeros, so zero-initialized codes and scales are
//   the zero state of both maps.
// - On a CPU with AVX2 or AVX-512 the whole blocks run in vector code with the same bits (Note
//   [Vector 8-bit update] in kernels/cpu/optim_8bit_blocks.h), finding the nearest code from the
//   bits of |x| / absmax rather than by this search (Note [Nearest code by exponent] there).

// One quantized state array of an update's span: codes per element, absmax per kBlock elements.
struct QuantizedState {
  static constexpr int64_t kBlock = optim::FrozenChunks::kChunk;
  uint8_t* codes = nullptr;
  float* absmax = nullptr;
};

// A dynamic map's values by code and the midpoints between consecutive magnitudes (the encoder's
// decision boundaries). kCodes entries in shared memory on CUDA: no stack frame in the kernels.
struct DynamicMap {
  static constexpr int kCodes = 256;
  float values[kCodes];
  float midpoints[kCodes - 1];  // the first magnitudes - 1 are used
  int32_t magnitudes;           // 128 (signed: the low 7 bits) or 256
  int32_t is_signed;
};

namespace rules {

// Magnitude j (0 <= j < 2^bits) of the dynamic map with `bits` bits after the sign (Note [8-bit
// optimizer state]): 0 for j = 0, else 10^-E x (0.1 + 0.9 (k + 1) / 2^q) with j = 2^q + k, E = bits - 1 - q.
CUMULUS_HOST_DEVICE float dynamic_map_magnitude(int j, int bits) {
  if (j == 0) return 0.0f;
  int q = 0;
  while ((j >> (q + 1)) != 0) ++q;
  float decade = 1.0f;  // 10^E, exact in float (E <= 7)
  for (int e = bits - 1 - q; e > 0; --e) decade *= 10.0f;
  const float fraction = 0.1f + 0.9f * static_cast<float>(j - (1 << q) + 1) / static_cast<float>(1 << q);
  return fraction / decade;
}

// Entry `code` of the map: its value, and (code < magnitudes - 1) the midpoint between magnitudes
// `code` and `code + 1`. A CUDA block fills its shared map with one thread per code.
CUMULUS_HOST_DEVICE void fill_dynamic_map_entry(DynamicMap& map, int code, bool is_signed) {
  const int bits = is_signed ? 7 : 8;
  const int magnitudes = 1 << bits;
  const float magnitude = dynamic_map_magnitude(code % magnitudes, bits);
  map.values[code] = code >= magnitudes ? -magnitude : magnitude;  // the signed map's bit 7: the sign
  if (code < magnitudes - 1) map.midpoints[code] = 0.5f * (magnitude + dynamic_map_magnitude(code + 1, bits));
  if (code == 0) {
    map.magnitudes = magnitudes;
    map.is_signed = is_signed ? 1 : 0;
  }
}

CUMULUS_HOST_DEVICE float dequantize(uint8_t code, float absmax, const DynamicMap& map) {
  return map.values[code] * absmax;
}

// The code of the map value nearest x / absmax (|x| <= absmax; absmax 0: the block is all zeros).
CUMULUS_HOST_DEVICE uint8_t quantize(float x, float absmax, const DynamicMap& map) {
  if (absmax == 0.0f) return 0;
  const float a = fabsf(x) / absmax;
  // The nearest magnitude's index is the number of midpoints below a: a binary count of fixed
  // length (magnitudes is a power of two) whose steps compile to selects, not branches that a
  // CPU mispredicts on random values. Index j + step - 1 <= magnitudes - 2 at every step.
  int j = 0;
  for (int step = map.magnitudes / 2; step > 0; step >>= 1) j += a > map.midpoints[j + step - 1] ? step : 0;
  return static_cast<uint8_t>(map.is_signed && x < 0.0f && j > 0 ? j + 128 : j);
}

// The larger of a and b (b when they compare unordered): a block's absmax folds it over |x| in element order.
// T is float, or on the CPU a vector of floats (kernels/cpu/optim_8bit_vec.h), taken lane by lane.
template <typename T>
CUMULUS_HOST_DEVICE T larger(T a, T b) {
  return a > b ? a : b;
}

}  // namespace rules

}  // namespace cumulus::kernels
