// Private helpers shared by the op implementations and the autograd engine.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cumulus/autograd/grad_mode.h"
#include "cumulus/core/error.h"
#include "cumulus/tensor/tensor.h"
#include "engine/tensor/tensor_impl.h"

#if CUMULUS_WITH_CUDA
#include "engine/core/cuda_context.h"
#include "kernels/cuda/kernels.h"
#endif
#include "kernels/cpu/kernels.h"

// CUMULUS_DISPATCH(device, ctx, cpu_statement, cuda_statement): runs the launcher for the device.
// In the CUDA branch the name the caller gives as `ctx` is bound to the device's execution context
// (cuda_context.h: ctx.stream(), ctx.cublas()), which the statement passes to its launcher
// explicitly, and the device is current. (A macro rather than a function taking lambdas: a build
// without CUDA drops the CUDA statement, whose launchers it does not declare.)
#if CUMULUS_WITH_CUDA
#define CUMULUS_DISPATCH(device, ctx, cpu_stmt, cuda_stmt)                       \
  do {                                                                           \
    if ((device).is_cuda()) {                                                    \
      ::cumulus::cuda::DeviceGuard cumulus_guard_((device).index());            \
      [[maybe_unused]] ::cumulus::cuda::Context& ctx = ::cumulus::cuda::context((device).index()); \
      cuda_stmt;                                                                 \
    } else {                                                                     \
      cpu_stmt;                                                                  \
    }                                                                            \
  } while (0)
#else
#define CUMULUS_DISPATCH(device, ctx, cpu_stmt, cuda_stmt)                           \
  do {                                                                               \
    if ((device).is_cuda()) throw ::cumulus::DeviceError("cumulus was built without CUDA"); \
    cpu_stmt;                                                                        \
  } while (0)
#endif

// CUMULUS_DISPATCH_FLOAT(dtype, T, body...): runs `body` with T the storage type of a floating
// dtype (float, BFloat16, Half); throws for any other dtype. Kernels templated over T compute in
// f32 (Note [Mixed precision] in engine/ops/linear.cpp).
#define CUMULUS_DISPATCH_FLOAT(dtype, T, ...)                                                           \
  do {                                                                                                 \
    switch (dtype) {                                                                                   \
      case ::cumulus::DType::f32: { using T = float; __VA_ARGS__; break; }                             \
      case ::cumulus::DType::bf16: { using T = ::cumulus::BFloat16; __VA_ARGS__; break; }              \
      case ::cumulus::DType::f16: { using T = ::cumulus::Half; __VA_ARGS__; break; }                   \
      default:                                                                                         \
        throw ::cumulus::InvalidArgument(std::string("no floating kernel for dtype ") +                \
                                         ::cumulus::dtype_name(dtype));                                \
    }                                                                                                  \
  } while (0)

namespace cumulus::ops::detail {

// The category for an op's output: the innermost scope's, else activations while the graph is
// being recorded (grad mode on), else other. See docs/ARCHITECTURE.md, "Memory accounting".
inline MemoryCategory output_category() {
  return current_memory_category(GradMode::enabled() ? MemoryCategory::activations
                                                     : MemoryCategory::other);
}

inline Tensor new_output(const Shape& shape, DType dtype, const Device& device) {
  MemoryCategoryScope scope(output_category());
  return Tensor::empty(shape, dtype, device);
}

// dst = src + beta * dst (beta 0 overwrites without reading dst). Same floating dtype, shape and device.
void accumulate_into(const Tensor& dst, const Tensor& src, float beta);

// Allocates a leaf's persistent gradient buffer (category gradients), contents stale.
void allocate_grad_buffer(TensorImpl& leaf);

// ": <why>" when `t` is undefined for a known reason (Tensor::undefined_reason), else "".
inline std::string undefined_because(const Tensor& t) {
  return t.undefined_reason() ? std::string(": ") + t.undefined_reason() : std::string();
}

inline void check_dtype(const char* op, const char* what, const Tensor& t, DType expected) {
  CUMULUS_CHECK(t.defined(), InvalidArgument, op, ": ", what, " is undefined", undefined_because(t));
  CUMULUS_CHECK(t.dtype() == expected, InvalidArgument, op, ": ", what, " must be ",
                dtype_name(expected), ", got ", dtype_name(t.dtype()));
}

// A floating tensor (f32, bf16 or f16): the types ops compute with (Note [Mixed precision]).
inline void check_floating(const char* op, const char* what, const Tensor& t) {
  CUMULUS_CHECK(t.defined(), InvalidArgument, op, ": ", what, " is undefined", undefined_because(t));
  CUMULUS_CHECK(is_floating(t.dtype()), InvalidArgument, op, ": ", what, " must be f32, bf16 or f16, got ",
                dtype_name(t.dtype()));
}

inline void check_same_device(const char* op, const char* what, const Tensor& t, const Tensor& ref) {
  CUMULUS_CHECK(t.device() == ref.device(), DeviceError, op, ": ", what, " is on ", t.device().str(),
                " but the input is on ", ref.device().str());
}

// What an op reads its tensor inputs through: a tensor whose elements are dense and row-major, so
// kernels may index it flat (Note [Strided views] in engine/ops/view.cpp). Every op passes each
// tensor input through it first; a strided view costs one recorded copy.
// Whether a CUDA graph capture is recording `device`'s stream: a host read of the device then, or
// a host value baked into the work, would be frozen into the graph. False on the CPU.
inline bool graph_capturing(const Device& device) {
#if CUMULUS_WITH_CUDA
  if (device.is_cuda()) return cuda::context(device.index()).capturing();
#endif
  (void)device;
  return false;
}

inline Tensor contiguous(const Tensor& x) { return !x.defined() || x.is_contiguous() ? x : x.contiguous(); }

// A view of x's storage: `shape` at element `strides` from x's first element plus `offset`
// elements (marked dense when the strides are row-major). Not recorded by autograd.
Tensor strided_view(const Tensor& x, const Shape& shape, const std::vector<int64_t>& strides, int64_t offset);
// x's first element, a strided view's included: for an op whose kernels read a view at its
// strides (engine/ops/attention.cpp) rather than through contiguous. The caller passes the strides.
void* element_data(const Tensor& x);
// Device memory for one library call (cuDNN's workspace): at least `bytes` from the device's
// caching allocator in category workspace, given back when the last owner drops it (engine/ops/workspace.cpp).
std::function<std::shared_ptr<void>(std::size_t bytes)> workspace_source(const Device& device);
// dst = src + beta * dst element by element, either side a strided view (same shape, dtype and
// device; beta 0 for integer types). Not recorded by autograd.
void copy_strided(const Tensor& src, const Tensor& dst, float beta = 0.0f);

inline int64_t to_int(std::size_t n) { return static_cast<int64_t>(n); }

// A contiguous tensor seen along dimension d as [outer, size(d), inner] (outer: the product of the
// sizes before d, inner: of those after): how the ops along a dimension address their tensors, so
// one kernel serves every dimension (kernels/cpu/structural_kernels.h).
struct Slab {
  int64_t outer = 1, dim = 1, inner = 1;
};
inline Slab slab_of(const Shape& shape, int d) {
  Slab s;
  for (int i = 0; i < shape.ndim(); ++i) (i < d ? s.outer : i == d ? s.dim : s.inner) *= shape[i];
  return s;
}

// y = act(x W^T + b) on the CPU, f32 (engine/ops/linear.cpp): b broadcast into y, one GEMM adding
// x W^T (beta 1; without a bias beta 0), ReLU in place. One definition, so every op that runs a
// Linear on the CPU (linear, mlp_cross_entropy) computes the same bits.
void linear_forward_cpu(const float* xp, const float* wp, const float* bp, float* yp, int64_t batch, int64_t in,
                        int64_t out, bool relu);

// ---- 16-bit storage (Note [Mixed precision] in engine/ops/linear.cpp; engine/ops/mixed_precision.cpp) ----
// The CPU runs a 16-bit GEMM-based op (Linear, conv2d) as its f32 kernels over widened copies and
// rounds the outputs where the GPU's 16-bit outputs round; these helpers make the copies, in
// category workspace. Elementwise ops, batch norm and pooling have kernels templated over the type.

// `t` converted to `dtype`, allocated in `category` (t itself when it already has that type).
Tensor converted(const Tensor& t, DType dtype, MemoryCategory category);
// f32 scratch of `shape` (category workspace), unwritten.
Tensor f32_scratch(const Shape& shape, const Device& device);
// dst = src converted to dst's type (same numel and device; f32, bf16 or f16).
void convert_into(const Tensor& src, const Tensor& dst);
// What an f32 kernel writes for a gradient target with the target's beta: the target itself when it
// is f32, else f32 scratch holding the target's values (widened) when the target accumulates.
Tensor f32_stand_in(const Tensor& target, float beta);
// Rounds a stand-in back into its 16-bit target (nothing when the stand-in is the target).
void store_stand_in(const Tensor& stand_in, const Tensor& target);

#if CUMULUS_WITH_CUDA
// kernels::sum_rows_cuda with the partials of its grid over row chunks (Note [Column sums] in
// kernels/cuda/reduce.cu) in category workspace, freed on return. T: float, BFloat16, Half.
template <typename T>
void sum_rows_on_device(const T* x, int64_t rows, int64_t cols, float beta, float* out, const Device& device,
                        cudaStream_t stream);
#endif

}  // namespace cumulus::ops::detail
