// Note [Products of few rows]
// C = alpha op(A) op(B) + beta C where C has few rows: a Linear's forward and input gradient at a
// micro-batch of a few samples, the case gradient accumulation makes common. OpenBLAS packs the
// whole of op(B) (the Linear's weight) into its own layout on every call and offers no way to keep
// a packed operand across calls; at 16 rows that packing costs as much as the multiply-adds
// (Zen 4, one thread: [16, 784] x [784, 512] 182 us, 70 GFLOP/s). These loops read op(B) where it
// lies and pack only A's few rows, transposed, so that each row of C is a lane of a vector: a block
// of kFewRowsLanes rows by a few columns of C sits in registers, and each step over k loads one
// vector of A's column and broadcasts one element of op(B) per column (the same product: 108
// GFLOP/s on AVX2, 110 on AVX-512). Written here because no BLAS we may link computes a few-row
// product without packing the large operand.
//
// Each element of C is one chain of fused multiply-adds over k in order from zero, acc =
// fma(a[i][p], b[p][j], acc) for p = 0, 1, ..., then c = alpha * acc (+ beta * c), rounded as
// written: a lane's chain is the same IEEE operations on every vector width, so AVX2, AVX-512 and
// the scalar loop give the same bits, at every thread count and every split of the columns
// (tests/test_gemm.cpp, GemmFewRows).
//
// Declared with no engine types (as vec_math.h), so that no inline function of the library is
// emitted in the files compiled for AVX2 or AVX-512.
#pragma once

#include <cstdint>

namespace cumulus::kernels {

// Rows of C a vector holds (one lane each).
inline constexpr int64_t kFewRowsLanes = 16;

// op(A)'s rows transposed in blocks of kFewRowsLanes: block r holds [k][kFewRowsLanes], lane i of
// position p being op(A)[r * kFewRowsLanes + i][p], zero past the last row. op(A)[i][p] lies at
// a[i * row_step + p * k_step].
struct FewRowsPanel {
  const float* at;
  int64_t rows, k;
};

// op(B)[p][j] lies at b[p * k_step + j * column_step].
struct FewRowsOperand {
  const float* b;
  int64_t k_step, column_step;
};

// C's columns [begin, end): c[i * ldc + j] for every row i of the panel.
struct FewRowsOutput {
  float* c;
  int64_t ldc, begin, end;
  float alpha, beta;  // beta 0: C is not read
};

namespace vec {
// Columns of C a block of the AVX2 loop holds (two registers of 8 lanes each).
inline constexpr int64_t kFewRowsColumns = 6;
void pack_few_rows(const float* a, int64_t rows, int64_t k, int64_t row_step, int64_t k_step, float* at);
void few_rows_product(const FewRowsPanel& a, const FewRowsOperand& b, const FewRowsOutput& c);
}  // namespace vec

namespace vec512 {
// Columns of C a block of the AVX-512 loop holds (one register of 16 lanes each): 12 ran as fast
// where op(B) is a Linear's weight of 784 inputs, but walking 12 rows of op(B) at once ran 2x
// slower than 8 for 3072 inputs (Zen 4).
inline constexpr int64_t kFewRowsColumns = 8;
void pack_few_rows(const float* a, int64_t rows, int64_t k, int64_t row_step, int64_t k_step, float* at);
void few_rows_product(const FewRowsPanel& a, const FewRowsOperand& b, const FewRowsOutput& c);
}  // namespace vec512

// C = alpha op(A) op(B) + beta C by the loops above where they were measured faster than OpenBLAS
// (gemm_few_rows.cpp; false elsewhere: the caller runs OpenBLAS), across the kernel threads by
// blocks of columns. On the vector path vec_math.h's capability picks, or the scalar loop of the
// same operations.
bool gemm_few_rows(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                   int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace cumulus::kernels
