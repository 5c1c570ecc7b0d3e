// CUDA launchers of cross_entropy over rows with ignored positions (kernels/cuda/loss.cu): the
// contracts of kernels/cpu/loss_kernels.h, queued on `stream`, device pointers. Instantiated for
// float, BFloat16 and Half logits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cumulus::kernels {

// row_loss[i] = row i's loss (0 where labels[i] == ignore_index, NaN where the label is outside
// [0, classes): a kernel cannot throw), and valid[i] = 1 (0 where ignored) when valid is given.
// With `loss` given (a reduction; `valid` then given too) also loss[0] = scale[0] * sum row_loss with
// scale[0] = 1 / sum valid when `mean` (NaN when every row is ignored, as PyTorch) else 1: the
// backward's scale, kept on the device so that no count is read back. Up to 256 rows one launch,
// else two (the rows over the grid, then one block's sums).
template <typename T>
void cross_entropy_rows_forward_cuda(const T* logits, const int32_t* labels, int64_t rows, int64_t classes,
                                     int64_t ignore_index, bool mean, float* row_loss, float* valid, float* loss,
                                     float* scale, cudaStream_t stream);

// dx_ij = s * grad[i * grad_stride] * (softmax(x_i)_j - [j == y_i]) (+ beta * dx), with s = scale[0]
// (1 when scale is null); 0 (+ beta * dx) for an ignored row. One warp per row.
template <typename T>
void cross_entropy_rows_backward_cuda(const T* logits, const int32_t* labels, int64_t rows, int64_t classes,
                                      int64_t ignore_index, const float* grad, int64_t grad_stride, const float* scale,
                                      float beta, T* dlogits, cudaStream_t stream);

// out[i] = in[i] as i32, or INT32_MIN where it does not fit (indices_to_i32_cpu's rule).
void indices_to_i32_cuda(const int64_t* in, int64_t n, int32_t* out, cudaStream_t stream);

}  // namespace cumulus::kernels
