// add, sub, mul, div: with numpy broadcasting between two tensors, and with a scalar. One kernel per
// forward and one per operand gradient: a broadcast operand's gradient is summed by the kernel that
// writes it (Note [Broadcast geometry] in kernels/pointwise_rules.h), through its sink with beta.
#include <algorithm>
#include <string>

#include "cumulus/autograd/node.h"
#include "cumulus/ops/pointwise.h"
#include "engine/ops/pointwise_internal.h"

namespace cumulus::ops {

namespace {

using kernels::BinaryOp;
using kernels::BroadcastGeometry;

const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add: return "add";
    case BinaryOp::sub: return "sub";
    case BinaryOp::mul: return "mul";
    default: return "div";
  }
}

// The output's shape of a op b under numpy's rules; throws naming the op and both shapes.
Shape broadcast_shape(const char* op, const Shape& a, const Shape& b) {
  const int ndim = std::max(a.ndim(), b.ndim());
  std::vector<int64_t> dims(static_cast<std::size_t>(ndim));
  for (int k = 1; k <= ndim; ++k) {  // k-th dimension from the end
    const int64_t da = k <= a.ndim() ? a[a.ndim() - k] : 1, db = k <= b.ndim() ? b[b.ndim() - k] : 1;
    CUMULUS_CHECK(da == db || da == 1 || db == 1, InvalidArgument, op, ": shapes ", a.str(), " and ", b.str(),
                  " do not broadcast (dimension ", ndim - k, " of the output: ", da, " vs ", db, ")");
    dims[static_cast<std::size_t>(ndim - k)] = da == 1 ? db : da;
  }
  return Shape(dims.begin(), dims.end());
}

// The kernels' geometry of a op b (Note [Broadcast geometry] in kernels/pointwise_rules.h).
BroadcastGeometry geometry_of(const Shape& a, const Shape& b) {
  static_assert(Shape::kMaxDims <= BroadcastGeometry::kMaxDims, "a shape fits the geometry");
  int64_t da[Shape::kMaxDims], db[Shape::kMaxDims];
  for (int d = 0; d < a.ndim(); ++d) da[d] = a[d];
  for (int d = 0; d < b.ndim(); ++d) db[d] = b[d];
  return kernels::broadcast_geometry(da, a.ndim(), db, b.ndim());
}

class BinaryBackward final : public Node {
 public:
  BinaryBackward(BinaryOp op, const BroadcastGeometry& g, Shape a_shape, Shape b_shape, Tensor a, Tensor b)
      : Node(binary_name(op)), op_(op), g_(g), shapes_{a_shape, b_shape}, a_(std::move(a)), b_(std::move(b)) {}

  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    for (int operand = 0; operand < 2; ++operand) {
      if (!grads[static_cast<std::size_t>(operand)].needed()) continue;
      GradSink::Target dx = grads[static_cast<std::size_t>(operand)].begin(shapes_[operand], dy.device(), dy.dtype());
      CUMULUS_DISPATCH_FLOAT(dy.dtype(), T, const T* ap = a_.defined() ? a_.data<T>() : nullptr;
                             const T* bp = b_.defined() ? b_.data<T>() : nullptr;
                             CUMULUS_DISPATCH_POINTWISE(dy.device(), binary_backward, g_, op_, operand, ap, bp,
                                                        dy.data<T>(), dx.beta(), dx.tensor.data<T>()));
    }
  }
  void release_saved() override { a_ = b_ = Tensor(); }

 private:
  BinaryOp op_;
  BroadcastGeometry g_;
  Shape shapes_[2];
  Tensor a_, b_;
};

Tensor binary(BinaryOp op, const Tensor& a_in, const Tensor& b_in) {
  const char* name = binary_name(op);
  OpScope op_scope(name);
  const Tensor a = detail::contiguous(a_in);
  const Tensor b = detail::contiguous(b_in);
  detail::check_floating(name, "a", a);
  detail::check_floating(name, "b", b);
  CUMULUS_CHECK(a.dtype() == b.dtype(), InvalidArgument, name, ": operands must have the same dtype, got ",
                dtype_name(a.dtype()), " and ", dtype_name(b.dtype()), " (cast one with ops::cast)");
  CUMULUS_CHECK(a.device() == b.device(), DeviceError, name, ": a is on ", a.device().str(), " but b is on ",
                b.device().str());
  const Shape out_shape = broadcast_shape(name, a.shape(), b.shape());
  const BroadcastGeometry g = geometry_of(a.shape(), b.shape());
  Tensor y = detail::new_output(out_shape, a.dtype(), a.device());
  if (out_shape.numel() > 0) {
    CUMULUS_DISPATCH_FLOAT(
        a.dtype(), T,
        CUMULUS_DISPATCH_POINTWISE(a.device(), binary_forward, g, op, a.data<T>(), b.data<T>(), y.data<T>()));
  }
  if (!should_record({&a, &b})) return y;
  // What the gradients read: mul's a-gradient reads b and its b-gradient a; div's read b, and a for b's.
  const bool a_grad = a.requires_grad(), b_grad = b.requires_grad();
  const bool keep_a = (op == BinaryOp::mul || op == BinaryOp::div) && b_grad;
  const bool keep_b = (op == BinaryOp::mul && a_grad) || op == BinaryOp::div;
  attach_node(y,
              std::make_shared<BinaryBackward>(op, g, a.shape(), b.shape(), keep_a ? a.detach() : Tensor(),
                                               keep_b ? b.detach() : Tensor()),
              {&a, &b});
  return y;
}

class ScalarBackward final : public Node {
 public:
  ScalarBackward(BinaryOp op, bool reversed, float s, Shape shape, Tensor x)
      : Node(binary_name(op)), op_(op), reversed_(reversed), s_(s), shape_(shape), x_(std::move(x)) {}

  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    if (!grads[0].needed()) return;
    GradSink::Target dx = grads[0].begin(shape_, dy.device(), dy.dtype());
    CUMULUS_DISPATCH_FLOAT(dy.dtype(), T, const T* xp = x_.defined() ? x_.data<T>() : nullptr;
                           CUMULUS_DISPATCH_POINTWISE(dy.device(), scalar_backward, op_, reversed_, s_, xp,
                                                      dy.data<T>(), dx.beta(), dx.tensor.data<T>(), shape_.numel()));
  }
  void release_saved() override { x_ = Tensor(); }

 private:
  BinaryOp op_;
  bool reversed_;
  float s_;
  Shape shape_;
  Tensor x_;
};

Tensor scalar_binary(BinaryOp op, bool reversed, const Tensor& x_in, float s) {
  const char* name = binary_name(op);
  OpScope op_scope(name);
  const Tensor x = detail::contiguous(x_in);
  detail::check_floating(name, "tensor operand", x);
  Tensor y = detail::new_output(x.shape(), x.dtype(), x.device());
  CUMULUS_DISPATCH_FLOAT(
      x.dtype(), T,
      CUMULUS_DISPATCH_POINTWISE(x.device(), scalar_forward, op, reversed, s, x.data<T>(), y.data<T>(), x.numel()));
  if (should_record({&x})) {
    const bool keep_x = reversed && op == BinaryOp::div;  // d(s / x) = -s / x^2; the others read no x
    attach_node(y, std::make_shared<ScalarBackward>(op, reversed, s, x.shape(), keep_x ? x.detach() : Tensor()), {&x});
  }
  return y;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary(BinaryOp::add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(BinaryOp::sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(BinaryOp::mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(BinaryOp::div, a, b); }

Tensor add(const Tensor& x, float s) { return scalar_binary(BinaryOp::add, false, x, s); }
Tensor sub(const Tensor& x, float s) { return scalar_binary(BinaryOp::sub, false, x, s); }
Tensor mul(const Tensor& x, float s) { return scalar_binary(BinaryOp::mul, false, x, s); }
Tensor div(const Tensor& x, float s) { return scalar_binary(BinaryOp::div, false, x, s); }
Tensor rsub(float s, const Tensor& x) { return scalar_binary(BinaryOp::sub, true, x, s); }
Tensor rdiv(float s, const Tensor& x) { return scalar_binary(BinaryOp::div, true, x, s); }
Tensor neg(const Tensor& x) { return scalar_binary(BinaryOp::mul, false, x, -1.0f); }

}  // namespace cumulus::ops
