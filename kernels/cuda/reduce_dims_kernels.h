// CUDA launchers of the reductions over dimensions (kernels/cuda/reduce_dims.cu): the contracts of
// their CPU twins in kernels/cpu/reduce_dims_kernels.h, queued on `stream`, pointers on the device.
// amax / amin, the selections, their gradients and multinomial give the CPU's results exactly (one thread per
// row running the same rule); sums add in double in another order than the CPU's, so they match it
// to the f32 rounding of the result.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/reduce_dims_rules.h"

namespace cumulus::kernels {

template <typename T>
void sum_dims_cuda(const ReduceGeometry& g, const T* x, int64_t divisor, T* y, cudaStream_t stream);
template <typename T>
void sum_dims_backward_cuda(const ReduceGeometry& g, const T* dy, float scale, float beta, T* dx, cudaStream_t stream);

template <typename T>
void extreme_dims_cuda(const ReduceGeometry& g, const T* x, bool largest, T* y, cudaStream_t stream);
template <typename T>
void extreme_dims_backward_cuda(const ReduceGeometry& g, const T* x, const T* y, const T* dy, float beta, T* dx,
                                cudaStream_t stream);

template <typename T>
void select_along_dim_cuda(const T* x, int64_t outer, int64_t dim, int64_t inner, int64_t k, bool largest,
                           bool nan_first, T* values, int64_t* indices, cudaStream_t stream);
template <typename T>
void scatter_along_dim_cuda(const T* dy, const int64_t* indices, int64_t outer, int64_t dim, int64_t inner, int64_t k,
                            float beta, T* dx, cudaStream_t stream);

template <typename T>
void multinomial_cuda(const T* w, int64_t rows, int64_t n, int64_t samples, bool replacement, uint64_t seed,
                      int64_t* out, cudaStream_t stream);

}  // namespace cumulus::kernels
