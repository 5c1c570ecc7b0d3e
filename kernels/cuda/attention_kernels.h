// CUDA launchers of fused attention: the contracts of kernels/cpu/attention_kernels.h, queued on
// `stream`; pointers are device pointers. Instantiated for float, BFloat16 and Half.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/attention_rules.h"
#include "kernels/float16.h"

namespace cumulus::kernels {

// The largest head the kernels take: they are compiled for D = 32, 64 and 128 (a row's columns and
// accumulators in registers), a smaller D runs in the next larger (Note [CUDA attention kernels]).
inline constexpr int64_t kAttentionMaxHeadDimCuda = 128;

template <typename T>
void attention_forward_cuda(const AttentionGeometry& g, const T* q, const T* k, const T* v, T* out, float* lse,
                            cudaStream_t stream);

template <typename T>
void attention_backward_cuda(const AttentionGeometry& g, const T* q, const T* k, const T* v, const T* out,
                             const float* lse, const T* dout, float* delta, T* dq, T* dk, T* dv, cudaStream_t stream);

// The same contracts on the register-tiled kernels (kernels/cuda/attention_tiled.cu, Note [Tiled
// CUDA attention kernels]): opt-in (CUMULUS_CUDA_ATTENTION_KERNELS=tiled), never yet run on a GPU.
template <typename T>
void attention_forward_tiled_cuda(const AttentionGeometry& g, const T* q, const T* k, const T* v, T* out, float* lse,
                                  cudaStream_t stream);

template <typename T>
void attention_backward_tiled_cuda(const AttentionGeometry& g, const T* q, const T* k, const T* v, const T* out,
                                   const float* lse, const T* dout, float* delta, T* dq, T* dk, T* dv,
                                   cudaStream_t stream);

}  // namespace cumulus::kernels
