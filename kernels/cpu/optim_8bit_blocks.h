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
// exponent and its top `bits` mantissa bits name a bucket [start, end) of relative width 2^-bits,
// with bits the fewest (at most 8) that leave at most one midpoint in any bucket: 6 for the signed
// map, 7 for the unsigned one (whose closest midpoints, 0.70% apart, fall in neighbouring buckets).
// Every a in a bucket then has j = below + (a > next), below = the number of midpoints under the
// bucket's start and next = the bucket's midpoint, or the largest float in the bucket when it holds
// none (a > it is then false, as a > the next midpoint above the bucket would be). next shares its
// exponent and top mantissa bits with the bucket, so one 32-bit entry holds below (8 bits) and
// next's remaining mantissa bits: one gather, a few integer operations and one compare per vector,
// from tables of 5 KB (signed) and 13 KB (unsigned), in L1 together. The first version, a byte
// gather of below and then a float gather of m_below, took 1.2-1.4x as long. make_vector_code_map
// (optim.cpp) builds the entries and checks the one-midpoint property as it goes, so a map that
// broke it would fail there, never round differently.
// Edge cases keep the scalar answer: a above 1 (infinity included; the NaN fold of the note above
// can leave such values) is compared as 1, and every midpoint is below 1; a below bucket 0 (which
// starts at or under m_0) is clamped into it, where it is under next and below is 0; NaN counts 0,
// as every scalar comparison fails.
struct VectorCodeMap {
  static constexpr int kMaxBits = 8;      // mantissa bits a bucket keeps, at most
  static constexpr int kMaxOctaves = 26;  // octaves below 1 that the first midpoint may need (5e-8: 25)
  const DynamicMap* map = nullptr;        // its values and is_signed
  int32_t shift = 0;                      // 23 - the bucket's mantissa bits: bits >> shift name the bucket
  int32_t first_bucket = 0;               // a float's bits >> shift at bucket 0's start
  int32_t last_bucket = 0;                // the bucket of 1.0
  uint32_t entries[(kMaxOctaves << kMaxBits) + 1] = {};  // below << 24 | next's low `shift` bits
};

// The rules' scalars for a run of blocks (kernels/optim_rules.h's parameters).
struct SgdBlockArgs {
  float grad_scale, lr, momentum, dampening, weight_decay;
  bool nesterov, first;
};
struct AdamWBlockArgs {
  float grad_scale, lr, beta1, beta2, eps, weight_decay, step_size, bc2_sqrt;
};

// The partial sums of sum_squares_cpu (kernels/cpu/optim.cpp): enough independent double adds to
// cover their latency.
inline constexpr int kSquareLanes = 32;

}  // namespace cumulus::kernels

// Blocks [first_block, first_block + blocks) of the updates, each of QuantizedState::kBlock elements.
namespace cumulus::kernels::vec {
void sgd_8bit_blocks(float* w, const float* grad, const QuantizedState& buf, const VectorCodeMap& map,
                     int64_t first_block, int64_t blocks, const SgdBlockArgs& args);
void adamw_8bit_blocks(float* w, const float* grad, const QuantizedState& m, const QuantizedState& v,
                       const VectorCodeMap& m_map, const VectorCodeMap& v_map, int64_t first_block, int64_t blocks,
                       const AdamWBlockArgs& args);
// The f32 updates of elements [0, n rounded down to the lanes) (optim_dense_vec.h); return how many.
int64_t adamw_f32_vectors(float* w, const float* grad, float* m, float* v, int64_t n, const AdamWBlockArgs& args);
int64_t sgd_f32_vectors(float* w, const float* grad, float* buf, int64_t n, const SgdBlockArgs& args);
// sum_squares_cpu's partial sums over [0, n rounded down to kSquareLanes); returns how many. The one
// vector width of them: on Zen 4, 512-bit widening took 45 us for 670k floats, these 28.
int64_t sum_squares_f32_vectors(const float* x, int64_t n, double (&lanes)[kSquareLanes]);
}  // namespace cumulus::kernels::vec

namespace cumulus::kernels::vec512 {
void sgd_8bit_blocks(float* w, const float* grad, const QuantizedState& buf, const VectorCodeMap& map,
                     int64_t first_block, int64_t blocks, const SgdBlockArgs& args);
void adamw_8bit_blocks(float* w, const float* grad, const QuantizedState& m, const QuantizedState& v,
                       const VectorCodeMap& m_map, const VectorCodeMap& v_map, int64_t first_block, int64_t blocks,
                       const AdamWBlockArgs& args);
int64_t adamw_f32_vectors(float* w, const float* grad, float* m, float* v, int64_t n, const AdamWBlockArgs& args);
int64_t sgd_f32_vectors(float* w, const float* grad, float* buf, int64_t n, const SgdBlockArgs& args);
}  // namespace cumulus::kernels::vec512
