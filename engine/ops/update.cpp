// Gradient accumulation into a sink, outside autograd (used by GradSink::give).
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/shape.h"
#include "engine/ops/internal.h"

namespace cumulus::ops {

namespace detail {
void accumulate_into(const Tensor& dst, const Tensor& src, float beta) {
  check_floating("accumulate", "destination", dst);
  check_dtype("accumulate", "source", src, dst.dtype());
  CUMULUS_CHECK(dst.numel() == src.numel(), ShapeError, "accumulate: ", src.shape().str(), " into ",
                dst.shape().str());
  check_same_device("accumulate", "source", src, dst);
  const int64_t n = dst.numel();
  CUMULUS_DISPATCH_FLOAT(dst.dtype(), T, const T* s = src.data<T>(); T* d = dst.data<T>();
                         CUMULUS_DISPATCH(dst.device(), ctx, kernels::accumulate_cpu(s, beta, d, n),
                                          kernels::accumulate_cuda(s, beta, d, n, ctx.stream())));
}
}  // namespace detail

void accumulate_(const Tensor& dst, const Tensor& src_in) {
  const Tensor src = detail::contiguous(src_in);
  CUMULUS_CHECK(dst.shape() == src.shape(), ShapeError, "accumulate_: ", src.shape().str(), " into ",
                dst.shape().str());
  detail::accumulate_into(dst, src, 1.0f);
}

}  // namespace cumulus::ops
