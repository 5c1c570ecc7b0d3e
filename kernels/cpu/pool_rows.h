// The vector rows of 2x2, stride-2 max pooling (kernels/cpu/pool.cpp), 8 windows at a time:
// vec:: (AVX2, pool_avx2.cpp), called only after vec::available() (kernels/cpu/vec_math.h) and on
// both vector paths (the windows' pairs are 256-bit loads either way). No engine types, for the
// reason vec_math.h gives.
#pragma once

#include <cstdint>

namespace cumulus::kernels::vec {
// One output row of out_w windows whose inputs are rows r0 and r1 (2 * out_w values each): y[j] is
// the element pool_window_argmax picks (the last NaN, else the first largest, in the order r0[2j],
// r0[2j + 1], r1[2j], r1[2j + 1]).
void max_pool_2x2_row_f32(const float* r0, const float* r1, int64_t out_w, float* y);
// Its backward, overwriting: the picked element of window j gets g[j], the three others +0, in
// rows d0 and d1.
void max_pool_2x2_row_grad_f32(const float* r0, const float* r1, const float* g, int64_t out_w, float* d0, float* d1);
}  // namespace cumulus::kernels::vec
