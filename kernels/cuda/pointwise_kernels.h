// CUDA launchers of the pointwise ops (kernels/cuda/pointwise.cu): the contracts of their CPU twins
// in kernels/cpu/pointwise_kernels.h, queued on `stream`, pointers on the device. Elementwise
// kernels compute each element with the CPU's rule (kernels/pointwise_rules.h), broadcast
// gradients included (the same order of additions); softmax sums a row in the order of a warp's
// reduction, so its results are close to the CPU's rather than equal.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/pointwise_rules.h"

namespace cumulus::kernels {

template <typename T>
void binary_forward_cuda(const BroadcastGeometry& g, BinaryOp op, const T* a, const T* b, T* y, cudaStream_t stream);
template <typename T>
void binary_backward_cuda(const BroadcastGeometry& g, BinaryOp op, int operand, const T* a, const T* b, const T* dy,
                          float beta, T* dx, cudaStream_t stream);

template <typename T>
void scalar_forward_cuda(BinaryOp op, bool reversed, float s, const T* x, T* y, int64_t n, cudaStream_t stream);
template <typename T>
void scalar_backward_cuda(BinaryOp op, bool reversed, float s, const T* x, const T* dy, float beta, T* dx, int64_t n,
                          cudaStream_t stream);

template <typename T>
void unary_forward_cuda(UnaryOp op, const T* x, T* y, int64_t n, cudaStream_t stream);
template <typename T>
void unary_backward_cuda(UnaryOp op, const T* saved, const T* dy, float beta, T* dx, int64_t n, cudaStream_t stream);

// One warp per row.
template <typename T>
void softmax_forward_cuda(bool log, const T* x, T* y, int64_t rows, int64_t cols, cudaStream_t stream);
template <typename T>
void softmax_backward_cuda(bool log, const T* y, const T* dy, float beta, T* dx, int64_t rows, int64_t cols,
                           cudaStream_t stream);

// The offset is a device pointer, read when the kernel runs (so a CUDA graph replay reads the
// value of its own time).
template <typename T>
void dropout_forward_cuda(uint64_t seed, const int64_t* offset, float p, float scale, const T* x, T* y, int64_t n,
                          cudaStream_t stream);
template <typename T>
void dropout_backward_cuda(uint64_t seed, const int64_t* offset, float p, float scale, const T* dy, float beta, T* dx,
                           int64_t n, cudaStream_t stream);
// *taken = *counter, then *counter += 1, on the device (one thread).
void dropout_take_offset_cuda(int64_t* counter, int64_t* taken, cudaStream_t stream);

}  // namespace cumulus::kernels
