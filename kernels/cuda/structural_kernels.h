// CUDA launchers of the structural ops: the same contracts as kernels/cpu/structural_kernels.h
// (slabs, beta), queued on `stream`; pointers are device pointers. Templated launchers are
// instantiated for float, BFloat16 and Half. The kernels are in structural.cu; the batched GEMM
// (cuBLAS only) in bmm.cu.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/kernels.h"
#include "kernels/float16.h"

namespace cumulus::kernels {

// Row-major, for p in [0, batch): c_p[m, n] = alpha * op(a_p) op(b_p) + beta * c_p with
// a_p = a + p * stride_a (elements) and likewise b and c, through cublasGemmStridedBatchedEx with
// CUBLAS_COMPUTE_32F (f32 products and sums whatever the storage, no TF32).
void gemm_strided_batched_cuda(cublasHandle_t handle, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                               float alpha, const void* a, int64_t lda, int64_t stride_a, const void* b, int64_t ldb,
                               int64_t stride_b, float beta, void* c, int64_t ldc, int64_t stride_c, int64_t batch,
                               GemmTypes types);

// out[0, n) = 0 (the empty sums of a GEMM with k = 0, which never reaches cuBLAS).
template <typename T>
void fill_zero_cuda(T* out, int64_t n, cudaStream_t stream);

// One block per row; the row's sums by block_sum (a fixed order: deterministic).
template <typename T>
void layer_norm_forward_cuda(const T* x, const float* weight, const float* bias, int64_t rows, int64_t cols, float eps,
                             T* y, float* mean, float* rstd, cudaStream_t stream);
template <typename T>
void layer_norm_backward_dx_cuda(const T* x, const T* dy, const float* weight, const float* mean, const float* rstd,
                                 int64_t rows, int64_t cols, float beta, T* dx, cudaStream_t stream);
// Column sums without atomics, in an order fixed by the shape (a grid over 32 columns and chunks of
// rows, the chunks' sums added in order by a second launch: structural.cu), so the parameter
// gradients are the same bits on every run. `partials` holds layer_norm_param_grads_partials(rows,
// cols) doubles of device scratch (none where that is 0); without it all rows are one chunk (the
// same bits as with it up to 256 rows).
int64_t layer_norm_param_grads_partials(int64_t rows, int64_t cols);
template <typename T>
void layer_norm_param_grads_cuda(const T* x, const T* dy, const float* mean, const float* rstd, int64_t rows,
                                 int64_t cols, float beta_dw, float* dweight, float beta_db, float* dbias,
                                 double* partials, cudaStream_t stream);
template <typename T>
void layer_norm_param_grads_cuda(const T* x, const T* dy, const float* mean, const float* rstd, int64_t rows,
                                 int64_t cols, float beta_dw, float* dweight, float beta_db, float* dbias,
                                 cudaStream_t stream);

template <typename T>
void copy_slab_cuda(const T* src, int64_t src_dim, int64_t src_start, T* dst, int64_t dst_dim, int64_t dst_start,
                    int64_t outer, int64_t length, int64_t inner, float beta, cudaStream_t stream);
template <typename T>
void narrow_backward_cuda(const T* dy, int64_t outer, int64_t dim, int64_t start, int64_t length, int64_t inner,
                          float beta, T* dx, cudaStream_t stream);

// y[o, j, i] = x[o, indices[j], i]; an index outside [0, dim) gives a row of NaN (the kernel cannot
// throw, and checking on the host would synchronize every call).
template <typename T>
void index_gather_cuda(const T* x, int64_t outer, int64_t dim, const int32_t* indices, int64_t count, int64_t inner,
                       T* y, cudaStream_t stream);
// index_scatter_add_cpu's contract without atomics: the positions sorted by index, then each
// index's run summed in a fixed order (Note [Sorted scatter-add] in structural.cu). Indices outside
// [0, dim) contribute nothing. scratch: index_scatter_add_scratch(count) uint64 of device memory for
// the sorted positions. With partials (index_scatter_add_partials(count, outer, inner) floats of
// device scratch) runs longer than a segment of 32 positions are summed by several blocks, each
// segment in order, then the segments in order (the same bits on every run; the CPU's bits for
// shorter runs); without, each run by one block in the CPU's order (its bits).
int64_t index_scatter_add_scratch(int64_t count);
int64_t index_scatter_add_partials(int64_t count, int64_t outer, int64_t inner);
template <typename T>
void index_scatter_add_cuda(const T* dy, int64_t outer, int64_t count, const int32_t* indices, int64_t dim,
                            int64_t inner, float beta, T* dx, uint64_t* scratch, float* partials, cudaStream_t stream);
template <typename T>
void index_scatter_add_cuda(const T* dy, int64_t outer, int64_t count, const int32_t* indices, int64_t dim,
                            int64_t inner, float beta, T* dx, uint64_t* scratch, cudaStream_t stream);

}  // namespace cumulus::kernels
