// CUDA launcher of the strided copy: the contract of kernels/cpu/strided_kernels.h, queued on
// `stream`; pointers are device pointers.
#pragma once

#include <cuda_runtime.h>

#include "kernels/float16.h"
#include "kernels/strided_layout.h"

namespace cumulus::kernels {

template <typename T>
void strided_copy_cuda(const T* src, T* dst, const StridedLayout& layout, float beta, cudaStream_t stream);

}  // namespace cumulus::kernels
