// The 8-bit optimizer updates' whole blocks in vector code (Note [Vector 8-bit update]): vec:: at 8
// float lanes (optim_8bit_avx2.cpp), vec512:: at 16 (optim_8bit_avx512.cpp), both from the one
// source kernels/cpu/optim_8bit_vec.h, each file compiled for its instruction set without
// contraction (CMakeLists.txt). kernels/cpu/optim.cpp calls them when vec::available() or
// vec512::available() (kernels/cpu/vec_math.h) and runs the scalar loop otherwise and for a
// partial last block. Declared with plain structs only, as vec_math.h's functions.
#pragma once

#include <cstdint>

#include "kernels/quantized_state.h"

namespace cumulus::kernels {

// Note [Vector 8-bit update]
// The vector code gives the scalar loop's bits (update_quantized_block in optim.cpp), and so the
// CUDA kernel's: per block of 64 it dequantizes (a gather of the map's values times the block's
// absmax), applies rules::sgd or rules::adamw (kernels/optim_rules.h) instantiated on the vector
// type, so each lane takes the scalar rule's operations in its order, folds |x| into the new absmax
// with rules::larger lane by lane and then across lanes, and requantizes each value to the code the
// scalar binary search picks. Max is exact and, without NaN, order-free, so the lanes' fold gives
// the scalar fold's absmax; a block holding a NaN (only reachable without the non-finite guard)
// folds its 64 values again one at a time in element order, as the scalar loop does.
//
// Note [Nearest code by exponent]
// The scalar search returns j = the number of midpoints m_k (increasing) with a > m_k, a = |x| /
// absmax, in 7 or 8 dependent steps. Vector code has three ways to that count: the same binary
// search with a gather per step (7-8 dependent gathers per vector), a compare against every midpoint
// (127 or 255 compares per vector), or an index from the bits of a. This uses the index: a float's
// exponent and its top kBucketBits mantissa bits name a bucket [start, end) of relative width
// 2^-8 = 0.39%, narrower than the maps' closest midpoints (0.70% apart relative to their values:
// the top decade's 2^q codes are 0.9 / 2^q of the decade apart, q <= 7), so a bucket holds at most
// one midpoint. With below[bucket] = the number of midpoints under the bucket's start, every a in
// the bucket has j = below + (a > m_below): one byte gather, one float gather, one compare, both
// tables (7 KB and 1 KB per map) in L1. make_vector_code_map (optim.cpp) checks the one-midpoint
// property as it builds the table, so a map that broke it would fail there, not round differently.
// Edge cases keep the scalar answer: a below bucket 0 (which starts at or under m_0) is clamped
// into it and counts 0; a >= 1 (1 itself, or above 1 and infinity, which the NaN fold of the note
// above can leave) is clamped into the bucket of 1, where below = every midpoint and the padding
// +inf after the last one compares false; NaN counts 0, as every scalar comparison fails.
struct VectorCodeMap {
  static constexpr int kBucketBits = 8;   // buckets per octave: 2^kBucketBits
  static constexpr int kMaxOctaves = 26;  // octaves below 1 that the first midpoint may need (5e-8: 25)
  const DynamicMap* map = nullptr;        // its values and is_signed
  int32_t first_bucket = 0;               // a float's bits >> (23 - kBucketBits) at bucket 0's start
  int32_t last_bucket = 0;                // the bucket of 1.0
  float midpoint_or_inf[DynamicMap::kCodes] = {};  // the midpoints, then +inf
  uint8_t below[(kMaxOctaves << kBucketBits) + 1 + 3] = {};  // + 3: a 4-byte gather at last_bucket
};

// The rules' scalars for a run of blocks (kernels/optim_rules.h's parameters).
struct SgdBlockArgs {
  float grad_scale, lr, momentum, dampening, weight_decay;
  bool nesterov, first;
};
struct AdamWBlockArgs {
  float grad_scale, lr, beta1, beta2, eps, weight_decay, step_size, bc2_sqrt;
};

}  // namespace cumulus::kernels

// Blocks [first_block, first_block + blocks) of the updates, each of QuantizedState::kBlock elements.
namespace cumulus::kernels::vec {
void sgd_8bit_blocks(float* w, const float* grad, const QuantizedState& buf, const VectorCodeMap& map,
                     int64_t first_block, int64_t blocks, const SgdBlockArgs& args);
void adamw_8bit_blocks(float* w, const float* grad, const QuantizedState& m, const QuantizedState& v,
                       const VectorCodeMap& m_map, const VectorCodeMap& v_map, int64_t first_block, int64_t blocks,
                       const AdamWBlockArgs& args);
}  // namespace cumulus::kernels::vec

namespace cumulus::kernels::vec512 {
void sgd_8bit_blocks(float* w, const float* grad, const QuantizedState& buf, const VectorCodeMap& map,
                     int64_t first_block, int64_t blocks, const SgdBlockArgs& args);
void adamw_8bit_blocks(float* w, const float* grad, const QuantizedState& m, const QuantizedState& v,
                       const VectorCodeMap& m_map, const VectorCodeMap& v_map, int64_t first_block, int64_t blocks,
                       const AdamWBlockArgs& args);
}  // namespace cumulus::kernels::vec512
