// softmax and log_softmax over a dimension. The kernels normalize rows of the last dimension's
// width, any leading shape; another dimension is moved last and back by transpose (copies, recorded
// as their own nodes), so the kernels stay row kernels. Around each row's maximum (no exp
// overflows). Both save their output: softmax's gradient is y (dy - sum(dy y)), log_softmax's
// dy - exp(y) sum(dy), so the input is not needed.
#include "cumulus/autograd/node.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/ops/shape.h"
#include "engine/ops/pointwise_internal.h"

namespace cumulus::ops {

namespace {

class SoftmaxBackward final : public Node {
 public:
  SoftmaxBackward(bool log, Tensor y) : Node(log ? "log_softmax" : "softmax"), log_(log), y_(std::move(y)) {}

  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    if (!grads[0].needed()) return;
    GradSink::Target dx = grads[0].begin(y_.shape(), dy.device(), dy.dtype());
    const int64_t cols = y_.size(-1), rows = cols > 0 ? y_.numel() / cols : 0;
    CUMULUS_DISPATCH_FLOAT(dy.dtype(), T,
                           CUMULUS_DISPATCH_POINTWISE(dy.device(), softmax_backward, log_, y_.data<T>(), dy.data<T>(),
                                                      dx.beta(), dx.tensor.data<T>(), rows, cols));
  }
  void release_saved() override { y_ = Tensor(); }

 private:
  bool log_;
  Tensor y_;
};

Tensor softmax_op(bool log, const Tensor& x_in, int dim) {
  const char* name = log ? "log_softmax" : "softmax";
  OpScope op_scope(name);
  const Tensor x = detail::contiguous(x_in);
  detail::check_floating(name, "input", x);
  CUMULUS_CHECK(x.ndim() >= 1, InvalidArgument, name, ": the input needs a dimension to normalize over, got ",
                x.shape().str());
  CUMULUS_CHECK(dim >= -x.ndim() && dim < x.ndim(), ShapeError, name, ": dim ", dim, " is outside [", -x.ndim(), ", ",
                x.ndim(), ") for input ", x.shape().str());
  const int d = dim < 0 ? dim + x.ndim() : dim;
  if (d != x.ndim() - 1) return transpose(softmax_op(log, transpose(x, d, -1), -1), d, -1);
  Tensor y = detail::new_output(x.shape(), x.dtype(), x.device());
  const int64_t cols = x.size(-1), rows = cols > 0 ? x.numel() / cols : 0;
  CUMULUS_DISPATCH_FLOAT(
      x.dtype(), T, CUMULUS_DISPATCH_POINTWISE(x.device(), softmax_forward, log, x.data<T>(), y.data<T>(), rows, cols));
  if (should_record({&x})) attach_node(y, std::make_shared<SoftmaxBackward>(log, y.detach()), {&x});
  return y;
}

}  // namespace

Tensor softmax(const Tensor& x, int dim) { return softmax_op(false, x, dim); }
Tensor log_softmax(const Tensor& x, int dim) { return softmax_op(true, x, dim); }

}  // namespace cumulus::ops
