// kernels/cpu/optim_8bit_blocks.h's vec:: functions, 8 lanes: the 8-bit blocks and the f32
// updates (optim_dense_vec.h), compiled for AVX2 without contraction, as vec_math_avx2.cpp (CMakeLists.txt).
#include "kernels/cpu/optim_8bit_blocks.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/cpu/optim_8bit_vec.h"
#include "kernels/cpu/optim_dense_vec.h"

namespace cumulus::kernels {
namespace {

struct Avx2Ops {
  static constexpr int kLanes = 8;
  typedef float F __attribute__((vector_size(32)));
  typedef int32_t I __attribute__((vector_size(32)));
  static I codes(const uint8_t* p) {
    return (I)_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  // Lanes hold 0..255: two saturating packs leave lanes 0-3 in the low half's first 4 bytes and
  // lanes 4-7 in the high half's.
  static void store_codes(uint8_t* p, I j) {
    const __m256i words = _mm256_packus_epi32((__m256i)j, (__m256i)j);
    const __m256i bytes = _mm256_packus_epi16(words, words);
    const __m128i both = _mm_unpacklo_epi32(_mm256_castsi256_si128(bytes), _mm256_extracti128_si256(bytes, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), both);
  }
  static F gather(const float* table, I j) { return (F)_mm256_i32gather_ps(table, (__m256i)j, 4); }
  static I gather_int(const int32_t* table, I j) { return (I)_mm256_i32gather_epi32(table, (__m256i)j, 4); }
};

}  // namespace

template <>
struct rules::SquareRoot<Avx2Ops::F> {
  static Avx2Ops::F of(Avx2Ops::F x) { return (Avx2Ops::F)_mm256_sqrt_ps((__m256)x); }
};

namespace vec {

void sgd_8bit_blocks(float* w, const float* grad, const QuantizedState& buf, const VectorCodeMap& map,
                     int64_t first_block, int64_t blocks, const SgdBlockArgs& args) {
  QuantizedBlocks<Avx2Ops>::sgd(w, grad, buf, map, first_block, blocks, args);
}

void adamw_8bit_blocks(float* w, const float* grad, const QuantizedState& m, const QuantizedState& v,
                       const VectorCodeMap& m_map, const VectorCodeMap& v_map, int64_t first_block, int64_t blocks,
                       const AdamWBlockArgs& args) {
  QuantizedBlocks<Avx2Ops>::adamw(w, grad, m, v, m_map, v_map, first_block, blocks, args);
}

int64_t adamw_f32_vectors(float* w, const float* grad, float* m, float* v, int64_t n, const AdamWBlockArgs& args) {
  return DenseVectors<Avx2Ops>::adamw(w, grad, m, v, n, args);
}

int64_t sgd_f32_vectors(float* w, const float* grad, float* buf, int64_t n, const SgdBlockArgs& args) {
  return DenseVectors<Avx2Ops>::sgd(w, grad, buf, n, args);
}

// Lane 4 v + j in acc[v]'s lane j. A widened float's square is exact, so the fused multiply-add
// rounds once as the scalar loop's add does.
int64_t sum_squares_f32_vectors(const float* x, int64_t n, double (&lanes)[kSquareLanes]) {
  constexpr int kVecs = kSquareLanes / 4;
  __m256d acc[kVecs];
  for (__m256d& a : acc) a = _mm256_setzero_pd();
  const int64_t whole = n / kSquareLanes * kSquareLanes;
  for (int64_t i = 0; i < whole; i += kSquareLanes)
    for (int v = 0; v < kVecs; ++v) {
      const __m256d d = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4 * v));
      acc[v] = _mm256_fmadd_pd(d, d, acc[v]);
    }
  for (int v = 0; v < kVecs; ++v) _mm256_storeu_pd(lanes + 4 * v, acc[v]);
  return whole;
}

}  // namespace vec
}  // namespace cumulus::kernels
#endif
