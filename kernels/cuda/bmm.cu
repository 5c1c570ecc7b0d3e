// The batched GEMM of bmm / matmul (engine/ops/matmul.cpp) through cuBLAS: row-major operands as
// gemm_ex_cuda passes them (the column-major call computes c^T = op(b)^T op(a)^T, so a and b swap),
// with the batch strides swapped alike. Library calls only: nothing here for the CPU emulation.
#include <climits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/structural_kernels.h"

namespace cumulus::kernels {

namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

}  // namespace

void gemm_strided_batched_cuda(cublasHandle_t handle, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                               float alpha, const void* a, int64_t lda, int64_t stride_a, const void* b, int64_t ldb,
                               int64_t stride_b, float beta, void* c, int64_t ldc, int64_t stride_c, int64_t batch,
                               GemmTypes types) {
  CUMULUS_CHECK(is_floating(types.ab) && (types.cd == DType::f32 || types.cd == types.ab), InvalidArgument,
                "gemm_strided_batched_cuda: unsupported operand types (a and b ", dtype_name(types.ab), ", c ",
                dtype_name(types.cd), ")");
  if (m == 0 || n == 0 || batch == 0) return;
  CUMULUS_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX &&
                    batch <= INT_MAX,
                InvalidArgument, "gemm_strided_batched_cuda: dimensions past 32 bits (m ", m, ", n ", n, ", k ", k,
                ", batch ", batch, ")");
  detail::count_launch();
  const cudaDataType_t ab = cuda_type(types.ab), cd = cuda_type(types.cd);
  // k == 0 never comes here: engine/ops/matmul.cpp writes the empty sum itself.
  CUMULUS_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
      static_cast<int>(m), static_cast<int>(k), &alpha, b, ab, static_cast<int>(ldb), stride_b, a, ab,
      static_cast<int>(lda), stride_a, &beta, c, cd, static_cast<int>(ldc), stride_c, static_cast<int>(batch),
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace cumulus::kernels
