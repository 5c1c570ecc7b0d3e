// kernels/cpu/optim_8bit_blocks.h's vec512:: functions, 16 lanes: the 8-bit blocks and the f32
// updates (optim_dense_vec.h), compiled for AVX-512F without contraction, as vec_math_avx512.cpp (CMakeLists.txt).
#include "kernels/cpu/optim_8bit_blocks.h"

#if defined(__x86_64__)
// GCC 12's AVX-512 intrinsics start from an undefined register, which -Wmaybe-uninitialized
// reports at every call once inlined: a false alarm of the header (as in reduce_avx512.cpp).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "kernels/cpu/optim_8bit_vec.h"
#include "kernels/cpu/optim_dense_vec.h"

namespace cumulus::kernels {
namespace {

struct Avx512Ops {
  static constexpr int kLanes = 16;
  typedef float F __attribute__((vector_size(64)));
  typedef int32_t I __attribute__((vector_size(64)));
  static I codes(const uint8_t* p) {
    return (I)_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void store_codes(uint8_t* p, I j) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8((__m512i)j));
  }
  static F gather(const float* table, I j) { return (F)_mm512_i32gather_ps((__m512i)j, table, 4); }
  static I gather_int(const int32_t* table, I j) { return (I)_mm512_i32gather_epi32((__m512i)j, table, 4); }
};

}  // namespace

template <>
struct rules::SquareRoot<Avx512Ops::F> {
  static Avx512Ops::F of(Avx512Ops::F x) { return (Avx512Ops::F)_mm512_sqrt_ps((__m512)x); }
};

namespace vec512 {

void sgd_8bit_blocks(float* w, const float* grad, const QuantizedState& buf, const VectorCodeMap& map,
                     int64_t first_block, int64_t blocks, const SgdBlockArgs& args) {
  QuantizedBlocks<Avx512Ops>::sgd(w, grad, buf, map, first_block, blocks, args);
}

void adamw_8bit_blocks(float* w, const float* grad, const QuantizedState& m, const QuantizedState& v,
                       const VectorCodeMap& m_map, const VectorCodeMap& v_map, int64_t first_block, int64_t blocks,
                       const AdamWBlockArgs& args) {
  QuantizedBlocks<Avx512Ops>::adamw(w, grad, m, v, m_map, v_map, first_block, blocks, args);
}

int64_t adamw_f32_vectors(float* w, const float* grad, float* m, float* v, int64_t n, const AdamWBlockArgs& args) {
  return DenseVectors<Avx512Ops>::adamw(w, grad, m, v, n, args);
}

int64_t sgd_f32_vectors(float* w, const float* grad, float* buf, int64_t n, const SgdBlockArgs& args) {
  return DenseVectors<Avx512Ops>::sgd(w, grad, buf, n, args);
}

}  // namespace vec512
}  // namespace cumulus::kernels
#endif
