// GEMM on CUDA through cuBLAS. cuBLAS is column-major; a row-major matrix is the column-major view
// of its transpose, so row-major C = op(A) op(B) is computed as column-major C^T = op(B)^T op(A)^T:
// the operands swap places and m, n swap, the leading dimensions stay. With beta = 1 a Linear's
// weight gradient accumulates inside the GEMM (Note [Gradient sinks]).
#include <climits>

#include "cumulus/core/cuda_check.h"
#include "kernels/cuda/kernels.h"

namespace cumulus::kernels {

void gemm_cuda(cublasHandle_t handle, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
               float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
               float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  CUMULUS_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX,
                InvalidArgument, "gemm_cuda: dimensions past 32 bits (m ", m, ", n ", n, ", k ", k, ")");
  detail::count_launch();
  CUMULUS_CUBLAS_CHECK(cublasSgemm(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
                                   static_cast<int>(m), static_cast<int>(k), &alpha, b,
                                   static_cast<int>(ldb), a, static_cast<int>(lda), &beta, c,
                                   static_cast<int>(ldc)));
}

}  // namespace cumulus::kernels
