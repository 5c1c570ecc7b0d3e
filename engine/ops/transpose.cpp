// transpose (cumulus/ops/tensor_ops.h): a contiguous copy with two dimensions swapped. Around the
// two dimensions a < b the tensor is [outer, p, mid, q, inner] (p = size(a), q = size(b)) and the
// output [outer, q, mid, p, inner]; one kernel serves every pair. The backward is the same swap of
// the gradient, written with the sink's beta.
#include "cumulus/autograd/node.h"
#include "cumulus/ops/tensor_ops.h"
#include "engine/ops/internal.h"
#include "kernels/cpu/structural_kernels.h"
#if CUMULUS_WITH_CUDA
#include "kernels/cuda/structural_kernels.h"
#endif

namespace cumulus::ops {

namespace {

struct Swap {
  int64_t outer = 1, p = 1, mid = 1, q = 1, inner = 1;
};

Swap swap_of(const Shape& shape, int a, int b) {
  Swap w;
  for (int i = 0; i < shape.ndim(); ++i) {
    int64_t& part = i < a ? w.outer : i == a ? w.p : i < b ? w.mid : i == b ? w.q : w.inner;
    part *= shape[i];
  }
  return w;
}

// y = x with dimensions a < b swapped (+ beta y).
void swap_into(const Tensor& x, int a, int b, float beta, const Tensor& y) {
  const Swap w = swap_of(x.shape(), a, b);
  const Device device = x.device();
  CUMULUS_DISPATCH_FLOAT(
      x.dtype(), T, const T* xp = x.data<T>(); T* yp = y.data<T>();
      CUMULUS_DISPATCH(device, ctx, kernels::transpose_cpu(xp, w.outer, w.p, w.mid, w.q, w.inner, beta, yp),
                       kernels::transpose_cuda(xp, w.outer, w.p, w.mid, w.q, w.inner, beta, yp, ctx.stream())));
}

class TransposeBackward final : public Node {
 public:
  TransposeBackward(Shape x_shape, int a, int b) : Node("transpose"), x_shape_(std::move(x_shape)), a_(a), b_(b) {}

  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    if (!grads[0].needed()) return;
    GradSink::Target dx = grads[0].begin(x_shape_, dy.device(), dy.dtype());
    swap_into(dy, a_, b_, dx.beta(), dx.tensor);
  }

 private:
  Shape x_shape_;
  int a_, b_;
};

}  // namespace

Tensor transpose(const Tensor& x, int dim0, int dim1) {
  OpScope op_scope("transpose");
  detail::check_floating("transpose", "input", x);
  const int nd = x.shape().ndim();
  const int d0 = dim0 < 0 ? dim0 + nd : dim0, d1 = dim1 < 0 ? dim1 + nd : dim1;
  CUMULUS_CHECK(d0 >= 0 && d0 < nd && d1 >= 0 && d1 < nd, ShapeError, "transpose: dims ", dim0, " and ", dim1,
                " out of range for ", x.shape().str());
  const int a = std::min(d0, d1), b = std::max(d0, d1);
  Shape shape;
  for (int i = 0; i < nd; ++i) shape.push_back(x.shape()[i == a ? b : i == b ? a : i]);
  Tensor y = detail::new_output(shape, x.dtype(), x.device());
  swap_into(x, a, b, 0.0f, y);
  if (should_record({&x})) attach_node(y, std::make_shared<TransposeBackward>(x.shape(), a, b), {&x});
  return y;
}

}  // namespace cumulus::ops
