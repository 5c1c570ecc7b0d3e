// rms_norm over the last dimensions, as PyTorch's F.rms_norm: each row of x [rows, cols] divided by
// its root mean square, rstd = 1 / sqrt(mean(x^2) + eps), then scaled by weight (f32, optional).
// Forward saves x and each row's rstd (f32, rows values: small beside x), so backward recomputes
// x_hat = x * rstd instead of keeping it:
//   dx = rstd * (g - x_hat * mean(g * x_hat)),  g = dy * weight
//   dweight (+)= sum_rows dy * x_hat
// dweight is written straight into its sink with the sink's beta; on CUDA as column sums in a fixed
// order (no atomics), so it is the same bits on every run.
#include <limits>

#include "cumulus/autograd/node.h"
#include "cumulus/ops/normalization.h"
#include "cumulus/ops/shape.h"
#include "engine/ops/internal.h"
#include "kernels/cpu/rms_norm_kernels.h"
#if CUMULUS_WITH_CUDA
#include "kernels/cuda/rms_norm_kernels.h"
#endif

namespace cumulus::ops {

namespace {

class RmsNormBackward final : public Node {
 public:
  RmsNormBackward(Tensor x, Tensor weight, Tensor rstd)
      : Node("rms_norm"), x_(std::move(x)), weight_(std::move(weight)), rstd_(std::move(rstd)) {}

  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    const Device device = dy.device();
    const int64_t cols = x_.size(-1), rows = cols > 0 ? x_.numel() / cols : 0;
    GradSink::Target dx{Tensor(), GradientMode::overwrite}, dw = dx;
    if (grads[0].needed()) dx = grads[0].begin(x_.shape(), device, x_.dtype());
    if (grads.size() > 1 && grads[1].needed()) dw = grads[1].begin(Shape{cols}, device);
    const float* rp = rstd_.data<float>();
    const float* wp = weight_.defined() ? weight_.data<float>() : nullptr;
    float* dwp = dw.tensor.defined() ? dw.tensor.data<float>() : nullptr;
    const float beta = dx.beta(), beta_w = dw.beta();
    CUMULUS_DISPATCH_FLOAT(
        x_.dtype(), T, const T* xp = x_.data<T>(); const T* dyp = dy.data<T>();
        T* dxp = dx.tensor.defined() ? dx.tensor.data<T>() : nullptr; CUMULUS_DISPATCH(
            device, ctx, kernels::rms_norm_backward_cpu(xp, dyp, wp, rp, rows, cols, beta, dxp, beta_w, dwp),
            kernels::rms_norm_backward_cuda(xp, dyp, wp, rp, rows, cols, beta, dxp, beta_w, dwp, ctx.stream())));
  }
  void release_saved() override {
    x_ = Tensor();
    weight_ = Tensor();
    rstd_ = Tensor();
  }

 private:
  Tensor x_, weight_, rstd_;
};

// x [..., cols] contiguous, weight f32 [cols] contiguous or undefined.
Tensor rms_norm_rows(const Tensor& x, int64_t cols, const Tensor& weight, float eps) {
  const Device device = x.device();
  const int64_t rows = x.numel() / cols;
  Tensor y = detail::new_output(x.shape(), x.dtype(), device);
  Tensor rstd = detail::new_output(Shape{rows}, DType::f32, device);
  const float* wp = weight.defined() ? weight.data<float>() : nullptr;
  float* rp = rstd.data<float>();
  CUMULUS_DISPATCH_FLOAT(x.dtype(), T, const T* xp = x.data<T>(); T* yp = y.data<T>(); CUMULUS_DISPATCH(
                             device, ctx, kernels::rms_norm_forward_cpu(xp, wp, rows, cols, eps, yp, rp),
                             kernels::rms_norm_forward_cuda(xp, wp, rows, cols, eps, yp, rp, ctx.stream())));
  if (should_record({&x, &weight})) {
    Tensor saved_w = weight.defined() ? weight.detach() : Tensor();
    attach_node(y, std::make_shared<RmsNormBackward>(x.detach(), saved_w, rstd), {&x, &weight});
  }
  return y;
}

}  // namespace

// Several normalized dimensions are one row of their product's width: x and weight are viewed
// (reshape, no copy) in the one-dimension form, and the output viewed back.
Tensor rms_norm(const Tensor& x_in, const Shape& normalized_shape, const Tensor& weight_in, std::optional<float> eps) {
  constexpr const char* op = "rms_norm";
  OpScope op_scope(op);
  CUMULUS_CHECK(x_in.defined(), InvalidArgument, op, ": the input is undefined");
  detail::check_floating(op, "input", x_in);
  const int nn = normalized_shape.ndim(), lead = x_in.ndim() - nn;
  bool match = nn >= 1 && lead >= 0;
  for (int d = 0; match && d < nn; ++d) match = x_in.size(lead + d) == normalized_shape[d];
  CUMULUS_CHECK(match && normalized_shape.numel() > 0, ShapeError, op, ": normalized_shape ", normalized_shape.str(),
                " must be the input's last dimensions (none of size 0), input ", x_in.shape().str());
  // PyTorch's default: the epsilon of the type the statistics are computed in (float for every
  // input type here).
  const float e = eps.value_or(std::numeric_limits<float>::epsilon());
  CUMULUS_CHECK(e >= 0.0f, InvalidArgument, op, ": eps must be >= 0, got ", e);
  if (weight_in.defined()) {
    detail::check_dtype(op, "weight", weight_in, DType::f32);
    CUMULUS_CHECK(weight_in.shape() == normalized_shape, ShapeError, op, ": weight must be ", normalized_shape.str(),
                  ", got ", weight_in.shape().str());
    detail::check_same_device(op, "weight", weight_in, x_in);
  }
  const int64_t cols = normalized_shape.numel();
  Shape rows_shape;
  for (int d = 0; d < lead; ++d) rows_shape.push_back(x_in.size(d));
  rows_shape.push_back(cols);
  const Tensor x = detail::contiguous(nn == 1 ? x_in : reshape(x_in, rows_shape));
  const Tensor weight =
      weight_in.defined() ? detail::contiguous(nn == 1 ? weight_in : reshape(weight_in, Shape{cols})) : weight_in;
  const Tensor y = rms_norm_rows(x, cols, weight, e);
  return nn == 1 ? y : reshape(y, x_in.shape());
}

}  // namespace cumulus::ops
