#include "engine/ops/indices.h"

#include "engine/ops/internal.h"
#include "kernels/cpu/loss_kernels.h"
#if CUMULUS_WITH_CUDA
#include "kernels/cuda/loss_kernels.h"
#endif

namespace cumulus::ops::detail {

Tensor as_i32_indices(const char* op, const char* what, const Tensor& indices) {
  CUMULUS_CHECK(indices.defined(), InvalidArgument, op, ": ", what, " is undefined", undefined_because(indices));
  CUMULUS_CHECK(indices.dtype() == DType::i32 || indices.dtype() == DType::i64, InvalidArgument, op, ": ", what,
                " must be i32 or i64, got ", dtype_name(indices.dtype()));
  if (indices.dtype() == DType::i32) return indices;
  const Device device = indices.device();
  Tensor out;
  {
    // The op's category, not workspace: ops save their indices for the backward.
    MemoryCategoryScope scope(output_category());
    out = Tensor::empty(indices.shape(), DType::i32, device);
  }
  const int64_t* in = indices.data<int64_t>();
  int32_t* o = out.data<int32_t>();
  const int64_t n = indices.numel();
  CUMULUS_DISPATCH(device, ctx, kernels::indices_to_i32_cpu(in, n, o),
                   kernels::indices_to_i32_cuda(in, n, o, ctx.stream()));
  return out;
}

}  // namespace cumulus::ops::detail
