// In-place updates outside autograd: gradient accumulation into a sink and the plain SGD step.
#include "cumulus/ops/ops.h"
#include "engine/ops/internal.h"

namespace cumulus::ops {

namespace detail {
void accumulate_into(const Tensor& dst, const Tensor& src, float beta) {
  check_dtype("accumulate", "destination", dst, DType::f32);
  check_dtype("accumulate", "source", src, DType::f32);
  CUMULUS_CHECK(dst.numel() == src.numel(), ShapeError, "accumulate: ", src.shape().str(), " into ",
                dst.shape().str());
  check_same_device("accumulate", "source", src, dst);
  const float* s = src.data<float>();
  float* d = dst.data<float>();
  const int64_t n = dst.numel();
  CUMULUS_DISPATCH(dst.device(), kernels::accumulate_cpu(s, beta, d, n),
                   kernels::accumulate_cuda(s, beta, d, n, stream));
}
}  // namespace detail

void sgd_update_(const Tensor& param, const Tensor& grad, float lr) {
  detail::check_dtype("sgd_update", "parameter", param, DType::f32);
  detail::check_dtype("sgd_update", "gradient", grad, DType::f32);
  CUMULUS_CHECK(param.shape() == grad.shape(), ShapeError, "sgd_update: gradient ", grad.shape().str(),
                " for parameter ", param.shape().str());
  detail::check_same_device("sgd_update", "gradient", grad, param);
  float* w = param.data<float>();
  const float* g = grad.data<float>();
  const int64_t n = param.numel();
  CUMULUS_DISPATCH(param.device(), kernels::sgd_update_cpu(w, g, lr, n),
                   kernels::sgd_update_cuda(w, g, lr, n, stream));
}

}  // namespace cumulus::ops
