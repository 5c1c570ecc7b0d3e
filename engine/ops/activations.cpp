// tanh, sigmoid, gelu, and the unary ops of cumulus/ops/math.h (exp, log, sqrt, rsqrt, abs): one
// elementwise kernel each way (kernels/pointwise_rules.h holds the formulas, PyTorch's). Those whose
// derivative is a function of their output save it (the output is what the next op keeps alive
// anyway): tanh, sigmoid, exp, sqrt, rsqrt; the gelus, log and abs save their input.
#include "cumulus/autograd/node.h"
#include "cumulus/ops/pointwise.h"
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
Tensor gelu(const Tensor& x, GeluApproximation approximate) {
  return unary(approximate == GeluApproximation::tanh ? UnaryOp::gelu_tanh : UnaryOp::gelu, x);
}

}  // namespace cumulus::ops
