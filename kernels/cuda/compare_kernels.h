// CUDA launchers of the comparison and mask ops (kernels/cuda/compare.cu): the contracts of their CPU
// twins in kernels/cpu/compare_kernels.h, queued on `stream`, pointers on the device. Every result is
// the CPU's, bit for bit (the rules are exact, where's gradient sums add in the CPU's order, arange
// computes in double on both).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/compare_rules.h"

namespace cumulus::kernels {

template <typename T>
void compare_forward_cuda(const NaryGeometry& g, CompareOp op, const T* a, const T* b, uint8_t* y, cudaStream_t stream);
template <typename T>
void compare_scalar_cuda(CompareOp op, const T* x, CompareScalar s, uint8_t* y, int64_t n, cudaStream_t stream);

template <typename E>
void where_forward_cuda(const NaryGeometry& g, const uint8_t* cond, const E* a, const E* b, E fill, E* y,
                        cudaStream_t stream);
// One thread per element of the operand, summing what reads it (no atomics).
template <typename T>
void where_backward_cuda(const NaryGeometry& g, int operand, const uint8_t* cond, const T* dy, float beta, T* dx,
                         cudaStream_t stream);

template <typename E>
void triangle_forward_cuda(const Triangle& t, const E* x, E* y, cudaStream_t stream);
template <typename T>
void triangle_backward_cuda(const Triangle& t, const T* dy, float beta, T* dx, cudaStream_t stream);

template <typename T>
void arange_cuda(const Arange& a, T* y, int64_t n, cudaStream_t stream);
template <typename T>
void bool_to_cuda(const uint8_t* x, T* y, int64_t n, cudaStream_t stream);

}  // namespace cumulus::kernels
