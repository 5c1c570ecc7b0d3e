// relu: y = max(x, 0), any shape. Backward dx = dy * (y > 0) reads the saved output, not the
// input: the output is what the next op keeps alive anyway, so saving it costs no extra memory.
// f32, bf16 or f16: the output and the gradients have the input's type.
#include "cumulus/autograd/node.h"
#include "cumulus/ops/ops.h"
#include "engine/ops/internal.h"

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
