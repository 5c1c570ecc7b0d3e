// CUDA launchers of rms_norm: the contracts of kernels/cpu/rms_norm_kernels.h, queued on `stream`;
// pointers are device pointers. Instantiated for float, BFloat16 and Half (kernels in rms_norm.cu).
// Held to a tolerance against the CPU (the sums run in another order), not to its bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/float16.h"

namespace cumulus::kernels {

// One block per row; the row's sum of squares in double by block_sum (a fixed order).
template <typename T>
void rms_norm_forward_cuda(const T* x, const float* weight, int64_t rows, int64_t cols, float eps, T* y, float* rstd,
                           cudaStream_t stream);
// dx (skipped when null) one block per row; dweight (skipped when null) as column sums without
// atomics, a block per 32 columns with its 8 row groups combined in a fixed order: the same bits on
// every run.
template <typename T>
void rms_norm_backward_cuda(const T* x, const T* dy, const float* weight, const float* rstd, int64_t rows, int64_t cols,
                            float beta, T* dx, float beta_dw, float* dweight, cudaStream_t stream);

}  // namespace cumulus::kernels
