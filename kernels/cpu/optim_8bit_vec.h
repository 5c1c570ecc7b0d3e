// The 8-bit updates' whole blocks at Ops::kLanes float lanes (Note [Vector 8-bit update] in
// kernels/cpu/optim_8bit_blocks.h): included only by optim_8bit_avx2.cpp and optim_8bit_avx512.cpp,
// each compiled for its instruction set without contraction, whose Ops supply the lane types and
// the few operations GCC's vector extensions lack:
//   F, I            kLanes floats and int32s as GCC vectors
//   codes(p)        the bytes p[0, kLanes) widened to I
//   store_codes(p, j)  the low byte of each lane of j to p[0, kLanes)
//   gather(t, j)    t[j[lane]] for a float table
//   gather_int(t, j)   t[j[lane]] for a 32-bit table
// The rules come from kernels/optim_rules.h and kernels/quantized_state.h instantiated on F, a type
// no other file instantiates them on: no inline function the library shares gets a copy with
// wider instructions (the scalar instantiations stay in the baseline files).
#pragma once

#include <cstdint>
#include <utility>

#include "kernels/cpu/lane_access.h"
#include "kernels/cpu/optim_8bit_blocks.h"
#include "kernels/optim_rules.h"

namespace cumulus::kernels {
namespace {

template <typename Ops>
struct QuantizedBlocks {
  using F = typename Ops::F;
  using I = typename Ops::I;
  static constexpr int kLanes = Ops::kLanes;
  static constexpr int64_t kBlock = QuantizedState::kBlock;
  static constexpr int kVectors = static_cast<int>(kBlock) / kLanes;

  static F load(const float* p) { return load_lanes<F>(p); }
  static void store(float* p, F v) { store_lanes(p, v); }
  static F splat(float s) { return F{} + s; }
  static I splat_int(int32_t s) { return I{} + s; }
  static F magnitude(F x) {
    I bits;
    __builtin_memcpy(&bits, &x, sizeof bits);
    bits &= 0x7fffffff;
    __builtin_memcpy(&x, &bits, sizeof x);
    return x;
  }

  // The scalar quantize's code for each lane of x (Note [Nearest code by exponent]); absmax > 0.
  static I nearest_code(F x, float absmax, const VectorCodeMap& map) {
    F a = magnitude(x) / splat(absmax);
    a = a > splat(1.0f) ? splat(1.0f) : a;
    I bits;
    __builtin_memcpy(&bits, &a, sizeof bits);
    I bucket = (bits >> map.shift) - map.first_bucket;
    bucket = bucket < I{} ? I{} : bucket;
    bucket = bucket > splat_int(map.last_bucket) ? splat_int(map.last_bucket) : bucket;  // NaN's bits
    const I entry = Ops::gather_int(reinterpret_cast<const int32_t*>(map.entries), bucket);
    const I next_bits = ((bucket + map.first_bucket) << map.shift) | (entry & ((1 << map.shift) - 1));
    F next;
    __builtin_memcpy(&next, &next_bits, sizeof next);
    I j = (((entry >> 24) & 0xff) - (a > next)) & (a == a);  // a comparison is -1 where true; NaN counts 0
    if (map.map->is_signed) j |= (x < F{}) & (j > I{}) & 128;
    return j;
  }

  // op over all lanes of v, in every lane: butterflies across halves, then quarters, down to pairs.
  template <typename V, typename Op>
  static V across_lanes(V v, Op op) {
    return butterflies<kLanes / 2>(v, op, std::make_integer_sequence<int, kLanes>{});
  }
  template <int kDistance, typename V, typename Op, int... k>
  static V butterflies(V v, Op op, std::integer_sequence<int, k...> lanes) {
    v = op(v, __builtin_shufflevector(v, v, (k ^ kDistance)...));
    if constexpr (kDistance > 1) return butterflies<kDistance / 2>(v, op, lanes);
    return v;
  }

  // The block's new absmax: rules::larger over |x| lane by lane, then across lanes (max is exact and
  // order-free without NaN); a block holding a NaN folds its values one at a time in element order.
  static float block_absmax(const F (&x)[kVectors]) {
    F most = F{};
    I ordered = I{} - 1;
    for (int k = 0; k < kVectors; ++k) {
      most = rules::larger(most, magnitude(x[k]));
      ordered &= x[k] == x[k];
    }
    if (across_lanes(ordered, [](I a, I b) { return a & b; })[0] != 0)
      return across_lanes(most, [](F a, F b) { return rules::larger(a, b); })[0];
    F one_at_a_time = F{};  // every lane the same: the scalar fold, element by element
    for (int k = 0; k < kVectors; ++k)
      for (int lane = 0; lane < kLanes; ++lane)
        one_at_a_time = rules::larger(one_at_a_time, splat(magnitude(x[k])[lane]));
    return one_at_a_time[0];
  }

  // One state's block: the new absmax written, then the codes.
  static void requantize(const F (&x)[kVectors], const QuantizedState& state, const VectorCodeMap& map, int64_t block) {
    const float absmax = block_absmax(x);
    state.absmax[block] = absmax;
    uint8_t* codes = state.codes + block * kBlock;
    for (int k = 0; k < kVectors; ++k)
      Ops::store_codes(codes + k * kLanes, absmax == 0.0f ? I{} : nearest_code(x[k], absmax, map));
  }

  // Block `block` of kStates quantized states: dequantized into x, rule(i, x[s][k]...) applied to
  // each vector of lanes starting at element i, and every state requantized.
  template <int kStates, typename Rule>
  static void update_block(int64_t block, const QuantizedState (&states)[kStates],
                           const VectorCodeMap* const (&maps)[kStates], Rule rule) {
    F x[kStates][kVectors];
    for (int s = 0; s < kStates; ++s) {
      const F absmax = splat(states[s].absmax[block]);
      for (int k = 0; k < kVectors; ++k)
        x[s][k] = Ops::gather(maps[s]->map->values, Ops::codes(states[s].codes + block * kBlock + k * kLanes)) * absmax;
    }
    for (int k = 0; k < kVectors; ++k) rule(block * kBlock + k * kLanes, x, k);
    for (int s = 0; s < kStates; ++s) requantize(x[s], states[s], *maps[s], block);
  }

  static void sgd(float* w, const float* grad, const QuantizedState& buf, const VectorCodeMap& map, int64_t first_block,
                  int64_t blocks, const SgdBlockArgs& a) {
    const QuantizedState states[1] = {buf};
    const VectorCodeMap* const maps[1] = {&map};
    for (int64_t block = first_block; block < first_block + blocks; ++block)
      update_block(block, states, maps, [&](int64_t i, F(&x)[1][kVectors], int k) {
        F wv = load(w + i);
        rules::sgd(wv, load(grad + i), &x[0][k], a.grad_scale, a.lr, a.momentum, a.dampening, a.nesterov,
                   a.weight_decay, a.first);
        store(w + i, wv);
      });
  }

  static void adamw(float* w, const float* grad, const QuantizedState& m, const QuantizedState& v,
                    const VectorCodeMap& m_map, const VectorCodeMap& v_map, int64_t first_block, int64_t blocks,
                    const AdamWBlockArgs& a) {
    const QuantizedState states[2] = {m, v};
    const VectorCodeMap* const maps[2] = {&m_map, &v_map};
    for (int64_t block = first_block; block < first_block + blocks; ++block)
      update_block(block, states, maps, [&](int64_t i, F(&x)[2][kVectors], int k) {
        F wv = load(w + i);
        rules::adamw(wv, load(grad + i), x[0][k], x[1][k], a.grad_scale, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay,
                     a.step_size, a.bc2_sqrt);
        store(w + i, wv);
      });
  }
};

}  // namespace
}  // namespace cumulus::kernels
