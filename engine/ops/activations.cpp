// The activations: relu, tanh, sigmoid, gelu, silu, and the unary ops of cumulus/ops/math.h (exp, log,
// sqrt, rsqrt, abs).
//
// relu: y = max(x, 0), any shape. Backward dx = dy * (y > 0) reads the saved output, not the
// input: the output is what the next op keeps alive anyway, so saving it costs no extra memory.
// f32, bf16 or f16: the output and the gradients have the input's type.
//
// The others: one elementwise kernel each way (kernels/pointwise_rules.h holds the formulas,
// PyTorch's). Those whose derivative is a function of their output save it: tanh, sigmoid, exp,
// sqrt, rsqrt; the gelus, silu, log and abs save their input.
#include "cumulus/autograd/node.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/shape.h"
#include "engine/ops/internal.h"
#include "engine/ops/pointwise_internal.h"

namespace cumulus::ops {

namespace {

using kernels::UnaryOp;

const char* unary_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::tanh: return "tanh";
    case UnaryOp::sigmoid: return "sigmoid";
    case UnaryOp::gelu:
    case UnaryOp::gelu_tanh: return "gelu";
    case UnaryOp::exp: return "exp";
    case UnaryOp::log: return "log";
    case UnaryOp::sqrt: return "sqrt";
    case UnaryOp::rsqrt: return "rsqrt";
    case UnaryOp::silu: return "silu";
    default: return "abs";
  }
}

class UnaryBackward final : public Node {
 public:
  UnaryBackward(UnaryOp op, Tensor saved) : Node(unary_name(op)), op_(op), saved_(std::move(saved)) {}

  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    if (!grads[0].needed()) return;
    GradSink::Target dx = grads[0].begin(saved_.shape(), dy.device(), dy.dtype());
    CUMULUS_DISPATCH_FLOAT(dy.dtype(), T,
                           CUMULUS_DISPATCH_POINTWISE(dy.device(), unary_backward, op_, saved_.data<T>(), dy.data<T>(),
                                                      dx.beta(), dx.tensor.data<T>(), saved_.numel()));
  }
  void release_saved() override { saved_ = Tensor(); }

 private:
  UnaryOp op_;
  Tensor saved_;
};

Tensor unary(UnaryOp op, const Tensor& x_in) {
  const char* name = unary_name(op);
  OpScope op_scope(name);
  const Tensor x = detail::contiguous(x_in);
  detail::check_floating(name, "input", x);
  Tensor y = detail::new_output(x.shape(), x.dtype(), x.device());
  CUMULUS_DISPATCH_FLOAT(
      x.dtype(), T, CUMULUS_DISPATCH_POINTWISE(x.device(), unary_forward, op, x.data<T>(), y.data<T>(), x.numel()));
  if (should_record({&x})) {
    Tensor saved = kernels::unary_grad_from_output(op) ? y.detach() : x.detach();
    attach_node(y, std::make_shared<UnaryBackward>(op, std::move(saved)), {&x});
  }
  return y;
}

}  // namespace

Tensor detail::unary_op(UnaryOp op, const Tensor& x) { return unary(op, x); }

Tensor tanh(const Tensor& x) { return unary(UnaryOp::tanh, x); }
Tensor sigmoid(const Tensor& x) { return unary(UnaryOp::sigmoid, x); }
Tensor silu(const Tensor& x) { return unary(UnaryOp::silu, x); }
Tensor gelu(const Tensor& x, GeluApproximation approximate) {
  return unary(approximate == GeluApproximation::tanh ? UnaryOp::gelu_tanh : UnaryOp::gelu, x);
}

}  // namespace cumulus::ops

namespace cumulus::ops {

namespace {

class ReluBackward final : public Node {
 public:
  explicit ReluBackward(Tensor y) : Node("relu"), y_(std::move(y)) {}

  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    if (!grads[0].needed()) return;
    const Device device = dy.device();
    GradSink::Target dx = grads[0].begin(y_.shape(), device, y_.dtype());
    const int64_t n = y_.numel();
    CUMULUS_DISPATCH_FLOAT(y_.dtype(), T, const T* yp = y_.data<T>(); const T* dyp = dy.data<T>();
                           T* dxp = dx.tensor.data<T>();
                           CUMULUS_DISPATCH(device, ctx, kernels::relu_backward_cpu(yp, dyp, dx.beta(), dxp, n),
                                            kernels::relu_backward_cuda(yp, dyp, dx.beta(), dxp, n, ctx.stream())));
  }
  void release_saved() override { y_ = Tensor(); }

 private:
  Tensor y_;
};

}  // namespace

Tensor relu(const Tensor& x_in) {
  OpScope op_scope("relu");
  const Tensor x = detail::contiguous(x_in);
  detail::check_floating("relu", "input", x);
  const Device device = x.device();
  Tensor y = detail::new_output(x.shape(), x.dtype(), device);
  const int64_t n = x.numel();
  CUMULUS_DISPATCH_FLOAT(x.dtype(), T, const T* xp = x.data<T>(); T* yp = y.data<T>();
                         CUMULUS_DISPATCH(device, ctx, kernels::relu_forward_cpu(xp, yp, n),
                                          kernels::relu_forward_cuda(xp, yp, n, ctx.stream())));
  if (should_record({&x})) attach_node(y, std::make_shared<ReluBackward>(y.detach()), {&x});
  return y;
}

}  // namespace cumulus::ops
