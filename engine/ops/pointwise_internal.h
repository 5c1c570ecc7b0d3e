// What the pointwise ops' sources share (engine/ops/arithmetic.cpp, activations.cpp, softmax.cpp,
// dropout.cpp): their kernel headers, and a dispatch to the device's launcher by name.
#pragma once

#include "engine/ops/internal.h"
#include "kernels/cpu/pointwise_kernels.h"
#if CUMULUS_WITH_CUDA
#include "kernels/cuda/pointwise_kernels.h"
#endif

// CUMULUS_DISPATCH_POINTWISE(device, launcher, args...): kernels::launcher_cpu(args...) on the CPU,
// kernels::launcher_cuda(args..., stream) on CUDA.
#define CUMULUS_DISPATCH_POINTWISE(device, launcher, ...)                        \
  CUMULUS_DISPATCH(device, ctx, ::cumulus::kernels::launcher##_cpu(__VA_ARGS__), \
                   ::cumulus::kernels::launcher##_cuda(__VA_ARGS__, ctx.stream()))
