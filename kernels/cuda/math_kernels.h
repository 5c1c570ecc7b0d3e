// CUDA launchers of kernels/cpu/math_kernels.h's contracts (kernels/cuda/math.cu), queued on
// `stream`, pointers on the device: clamp, integer arithmetic with broadcasting, integer conversions.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/math_rules.h"

namespace cumulus::kernels {

template <typename T>
void clamp_forward_cuda(float lo, float hi, const T* x, T* y, int64_t n, cudaStream_t stream);
template <typename T>
void clamp_backward_cuda(float lo, float hi, const T* x, const T* dy, float beta, T* dx, int64_t n,
                         cudaStream_t stream);

template <typename I>
void int_binary_forward_cuda(const BroadcastGeometry& g, BinaryOp op, const I* a, const I* b, I* y,
                             cudaStream_t stream);

template <typename From, typename To>
void int_convert_cuda(const From* x, To* y, int64_t n, cudaStream_t stream);

}  // namespace cumulus::kernels
