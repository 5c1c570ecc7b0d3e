// The ops of cumulus/ops/math.h. exp, log, sqrt, rsqrt and abs are unary ops and pow, maximum and
// minimum binary ones of the pointwise kernels (kernels/pointwise_rules.h holds their formulas);
// clamp has kernels of its own (kernels/math_rules.h), as it takes two bounds.
#include <cmath>
#include <limits>

#include "cumulus/autograd/node.h"
#include "cumulus/ops/math.h"
#include "engine/ops/pointwise_internal.h"
#include "kernels/cpu/math_kernels.h"
#if CUMULUS_WITH_CUDA
#include "kernels/cuda/math_kernels.h"
#endif

namespace cumulus::ops {

namespace {

using kernels::BinaryOp;
using kernels::UnaryOp;

class ClampBackward final : public Node {
 public:
  ClampBackward(float lo, float hi, Tensor x) : Node("clamp"), lo_(lo), hi_(hi), x_(std::move(x)) {}

  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    if (!grads[0].needed()) return;
    GradSink::Target dx = grads[0].begin(x_.shape(), dy.device(), dy.dtype());
    const int64_t n = x_.numel();
    CUMULUS_DISPATCH_FLOAT(
        dy.dtype(), T, const T* xp = x_.data<T>(); const T* dyp = dy.data<T>(); T* dxp = dx.tensor.data<T>();
        CUMULUS_DISPATCH(dy.device(), ctx, kernels::clamp_backward_cpu(lo_, hi_, xp, dyp, dx.beta(), dxp, n),
                         kernels::clamp_backward_cuda(lo_, hi_, xp, dyp, dx.beta(), dxp, n, ctx.stream())));
  }
  void release_saved() override { x_ = Tensor(); }

 private:
  float lo_, hi_;
  Tensor x_;
};

}  // namespace

Tensor exp(const Tensor& x) { return detail::unary_op(UnaryOp::exp, x); }
Tensor log(const Tensor& x) { return detail::unary_op(UnaryOp::log, x); }
Tensor sqrt(const Tensor& x) { return detail::unary_op(UnaryOp::sqrt, x); }
Tensor rsqrt(const Tensor& x) { return detail::unary_op(UnaryOp::rsqrt, x); }
Tensor abs(const Tensor& x) { return detail::unary_op(UnaryOp::abs, x); }

Tensor pow(const Tensor& x, float exponent) { return detail::scalar_op(BinaryOp::pow, x, exponent); }
Tensor pow(const Tensor& x, const Tensor& exponent) { return detail::binary_op(BinaryOp::pow, x, exponent); }

Tensor maximum(const Tensor& a, const Tensor& b) { return detail::binary_op(BinaryOp::maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return detail::binary_op(BinaryOp::minimum, a, b); }

Tensor clamp(const Tensor& x_in, std::optional<float> min, std::optional<float> max) {
  OpScope op_scope("clamp");
  const Tensor x = detail::contiguous(x_in);
  detail::check_floating("clamp", "input", x);
  CUMULUS_CHECK(min.has_value() || max.has_value(), InvalidArgument,
                "clamp: at least one of min and max must be given");
  // An absent bound is the infinity that never applies, in the forward and in the gradient's mask.
  const float lo = min.value_or(-std::numeric_limits<float>::infinity());
  const float hi = max.value_or(std::numeric_limits<float>::infinity());
  Tensor y = detail::new_output(x.shape(), x.dtype(), x.device());
  const int64_t n = x.numel();
  CUMULUS_DISPATCH_FLOAT(x.dtype(), T, const T* xp = x.data<T>(); T* yp = y.data<T>();
                         CUMULUS_DISPATCH(x.device(), ctx, kernels::clamp_forward_cpu(lo, hi, xp, yp, n),
                                          kernels::clamp_forward_cuda(lo, hi, xp, yp, n, ctx.stream())));
  if (should_record({&x})) attach_node(y, std::make_shared<ClampBackward>(lo, hi, x.detach()), {&x});
  return y;
}

}  // namespace cumulus::ops
