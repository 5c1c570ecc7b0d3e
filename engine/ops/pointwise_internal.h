// What the pointwise ops' sources share (engine/ops/arithmetic.cpp, activations.cpp, softmax.cpp,
// dropout.cpp, math.cpp): their kernel headers, a dispatch to the device's launcher by name, and the
// recorded elementwise ops by kernel op.
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

namespace cumulus::ops::detail {

// The recorded elementwise ops behind cumulus/ops/pointwise.h and math.h, by kernel op: a op b with
// broadcasting (engine/ops/arithmetic.cpp), x op s, and f(x) (engine/ops/activations.cpp).
Tensor binary_op(kernels::BinaryOp op, const Tensor& a, const Tensor& b);
Tensor scalar_op(kernels::BinaryOp op, const Tensor& x, float s);
Tensor unary_op(kernels::UnaryOp op, const Tensor& x);

}  // namespace cumulus::ops::detail
