// The vector cores of the CPU sums over dimensions (kernels/cpu/reduce_dims.cpp): AVX2 in
// reduce_avx2.cpp (namespace vec), AVX-512 in reduce_avx512.cpp (namespace vec512), each the one
// file compiled for its instruction set, called only where vec::available() / vec512::available()
// (kernels/cpu/vec_math.h) say so. Both add in double in the order Note [Sums over dimensions
// across outputs] (reduce_dims.cpp) fixes: a row of columns one output a lane, each output's terms
// in order; rows 8 partial sums an output. Every path gives the scalar loops' bits.
// Declared with no engine types (as vec_math.h), so that no inline function of the library is
// emitted here with AVX2 or AVX-512 instructions.
//
// The terms of an output are `runs` runs of `run_len` elements, run q starting `run_offsets[q]`
// elements after the output's first element and stepping `step` elements (1 for a contiguous run).
// y[i] = float(sum / divisor), the sum in double in that order, rounded once to float.
#pragma once

#include <cstdint>

namespace cumulus::kernels {

// The storage of the input elements: f32, or the bits of a bf16 or an f16 (kernels/float16.h).
enum class ReduceStorage { f32, bf16, f16 };

namespace vec {

// Outputs in a contiguous row: output i's terms start at x + i (n outputs, i < n).
void sum_columns(const void* x, ReduceStorage storage, const int64_t* run_offsets, int64_t runs, int64_t run_len,
                 int64_t step, int64_t n, double divisor, float* y);
// Up to kSumRowsMax outputs whose runs are contiguous (step 1): output k's terms start at x + bases[k],
// k < count.
void sum_rows(const void* x, ReduceStorage storage, const int64_t* bases, int64_t count, const int64_t* run_offsets,
              int64_t runs, int64_t run_len, double divisor, float* y);

}  // namespace vec

namespace vec512 {

// The same, in double lanes of 8 (one register of 8 doubles).
void sum_columns(const void* x, ReduceStorage storage, const int64_t* run_offsets, int64_t runs, int64_t run_len,
                 int64_t step, int64_t n, double divisor, float* y);
void sum_rows(const void* x, ReduceStorage storage, const int64_t* bases, int64_t count, const int64_t* run_offsets,
              int64_t runs, int64_t run_len, double divisor, float* y);

}  // namespace vec512

// The most outputs one sum_rows call takes (a few of the cores' blocks of rows).
inline constexpr int64_t kSumRowsMax = 64;

}  // namespace cumulus::kernels
