// linear: y = x W^T + b.   x: [B, in], W: [out, in], b: [out] -> y: [B, out]
// Forward: y is filled with b row by row, then one GEMM adds x W^T (beta = 1); no bias: beta = 0.
// Backward, each part only when its input needs a gradient:
//   dx [B, in]  = dy W        needs W  (saved only if x needs a gradient)
//   dW [out, in] (+)= dy^T x  needs x  (saved only if W needs a gradient)
//   db [out]    (+)= sum_rows dy
// dW and db are written straight into the sinks' buffers with the sinks' beta: for parameters
// that is the persistent gradient buffer, so accumulation happens inside the GEMM.
#include "cumulus/autograd/node.h"
#include "cumulus/ops/ops.h"
#include "engine/ops/internal.h"

namespace cumulus::ops {

namespace {

class LinearBackward final : public Node {
 public:
  LinearBackward(Tensor x, Tensor w, bool has_bias)
      : Node("linear"), x_(std::move(x)), w_(std::move(w)), has_bias_(has_bias) {}

  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    const Device device = dy.device();
    const int64_t batch = dy.size(0), out = dy.size(1);
    const float* dyp = dy.data<float>();
    if (grads[0].needed()) {
      const int64_t in = w_.size(1);
      GradSink::Target dx = grads[0].begin(Shape{batch, in}, device);
      const float* wp = w_.data<float>();
      float* dxp = dx.tensor.data<float>();
      CUMULUS_DISPATCH(device,
          kernels::gemm_cpu(false, false, batch, in, out, 1.0f, dyp, out, wp, in, dx.beta(), dxp, in),
          kernels::gemm_cuda(ctx.cublas(), false, false, batch, in, out, 1.0f, dyp, out, wp, in, dx.beta(), dxp, in));
    }
    if (grads[1].needed()) {
      const int64_t in = x_.size(1);
      GradSink::Target dw = grads[1].begin(Shape{out, in}, device);
      const float* xp = x_.data<float>();
      float* dwp = dw.tensor.data<float>();
      CUMULUS_DISPATCH(device,
          kernels::gemm_cpu(true, false, out, in, batch, 1.0f, dyp, out, xp, in, dw.beta(), dwp, in),
          kernels::gemm_cuda(ctx.cublas(), true, false, out, in, batch, 1.0f, dyp, out, xp, in, dw.beta(), dwp, in));
    }
    if (has_bias_ && grads[2].needed()) {
      GradSink::Target db = grads[2].begin(Shape{out}, device);
      float* dbp = db.tensor.data<float>();
      CUMULUS_DISPATCH(device, kernels::sum_rows_cpu(dyp, batch, out, db.beta(), dbp),
                       kernels::sum_rows_cuda(dyp, batch, out, db.beta(), dbp, ctx.stream()));
    }
  }

  void release_saved() override {
    x_ = Tensor();
    w_ = Tensor();
  }

 private:
  Tensor x_, w_;
  bool has_bias_;
};

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  constexpr const char* op = "linear";
  OpScope op_scope(op);
  detail::check_dtype(op, "input", x, DType::f32);
  detail::check_dtype(op, "weight", weight, DType::f32);
  CUMULUS_CHECK(x.ndim() == 2, ShapeError, op, ": input must be [batch, in_features], got ", x.shape().str());
  CUMULUS_CHECK(weight.ndim() == 2, ShapeError, op, ": weight must be [out_features, in_features], got ",
                weight.shape().str());
  CUMULUS_CHECK(x.size(1) == weight.size(1), ShapeError, op, ": input has ", x.size(1),
                " features but the weight ", weight.shape().str(), " expects ", weight.size(1));
  detail::check_same_device(op, "weight", weight, x);
  const bool has_bias = bias.defined();
  if (has_bias) {
    detail::check_dtype(op, "bias", bias, DType::f32);
    CUMULUS_CHECK(bias.ndim() == 1 && bias.size(0) == weight.size(0), ShapeError, op, ": bias ",
                  bias.shape().str(), " does not match ", weight.size(0), " output features");
    detail::check_same_device(op, "bias", bias, x);
  }

  const Device device = x.device();
  const int64_t batch = x.size(0), in = x.size(1), out = weight.size(0);
  Tensor y = detail::new_output(Shape{batch, out}, DType::f32, device);
  const float* xp = x.data<float>();
  const float* wp = weight.data<float>();
  float* yp = y.data<float>();
  const float beta = has_bias ? 1.0f : 0.0f;
  if (has_bias) {
    const float* bp = bias.data<float>();
    CUMULUS_DISPATCH(device, kernels::broadcast_rows_cpu(bp, batch, out, yp),
                     kernels::broadcast_rows_cuda(bp, batch, out, yp, ctx.stream()));
  }
  CUMULUS_DISPATCH(device,
      kernels::gemm_cpu(false, true, batch, out, in, 1.0f, xp, in, wp, in, beta, yp, out),
      kernels::gemm_cuda(ctx.cublas(), false, true, batch, out, in, 1.0f, xp, in, wp, in, beta, yp, out));

  if (should_record({&x, &weight, &bias})) {
    // Save only what the needed gradients read (Note: detach, so the saved handles hold no graph).
    auto node = std::make_shared<LinearBackward>(weight.requires_grad() ? x.detach() : Tensor(),
                                                 x.requires_grad() ? weight.detach() : Tensor(), has_bias);
    attach_node(y, std::move(node), {&x, &weight, &bias});
  }
  return y;
}

}  // namespace cumulus::ops
