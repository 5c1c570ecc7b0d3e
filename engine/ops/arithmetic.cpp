// add, sub, mul, div, pow, maximum, minimum: with numpy broadcasting between two tensors, and with a
// scalar. One kernel per forward and one per operand gradient: a broadcast operand's gradient is
// summed by the kernel that writes it (Note [Broadcast geometry] in kernels/pointwise_rules.h),
// through its sink with beta. add, sub, mul and div also take integer tensors, promoted as PyTorch
// promotes them (Note [Integer promotion]).
#include <algorithm>
#include <string>
#include <type_traits>

#include "cumulus/autograd/node.h"
#include "cumulus/ops/pointwise.h"
#include "engine/ops/pointwise_internal.h"
#include "kernels/cpu/math_kernels.h"
#if CUMULUS_WITH_CUDA
#include "kernels/cuda/math_kernels.h"
#endif

namespace cumulus::ops {

namespace {

using kernels::BinaryOp;
using kernels::BroadcastGeometry;

const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add: return "add";
    case BinaryOp::sub: return "sub";
    case BinaryOp::mul: return "mul";
    case BinaryOp::div: return "div";
    case BinaryOp::pow: return "pow";
    case BinaryOp::maximum: return "maximum";
    default: return "minimum";
  }
}

// add, sub, mul, div: the ops that take integers (the first four of BinaryOp).
bool is_arithmetic(BinaryOp op) { return op <= BinaryOp::div; }
bool is_integer(DType t) { return t == DType::i32 || t == DType::i64; }

// Note [Integer promotion]
// add, sub, mul and div take i32 and i64 tensors as PyTorch does: an integer tensor with a floating
// one (or with a float scalar) computes in the floating type (the tensor's; f32 for the scalar),
// the integer operand converted first (a copy; no gradient reaches an integer tensor); two integer
// tensors give an integer result (i64 if either is i64; wrapping on overflow) for add, sub and mul,
// and f32 for div (true division). Two floating operands of different types are still refused.
DType promoted_dtype(BinaryOp op, DType a, DType b) {
  if (is_floating(a)) return a;
  if (is_floating(b)) return b;
  if (op == BinaryOp::div) return DType::f32;
  return (a == DType::i64 || b == DType::i64) ? DType::i64 : DType::i32;
}

template <typename From>
void convert_int(const Tensor& x, const Tensor& y) {
  const From* xp = x.data<From>();
  const int64_t n = x.numel();
  auto run = [&](auto* yp) {
    CUMULUS_DISPATCH(x.device(), ctx, kernels::int_convert_cpu(xp, yp, n),
                     kernels::int_convert_cuda(xp, yp, n, ctx.stream()));
  };
  switch (y.dtype()) {
    case DType::i64: return run(y.data<int64_t>());
    case DType::f32: return run(y.data<float>());
    case DType::bf16: return run(y.data<BFloat16>());
    default: return run(y.data<Half>());
  }
}

// x as `dtype` (an integer x converted; x itself when it has the type). Saved by a backward that
// reads it, so it is an output (activations while recording).
Tensor promoted_to(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  Tensor y = detail::new_output(x.shape(), dtype, x.device());
  if (x.numel() == 0) return y;
  if (x.dtype() == DType::i32) convert_int<int32_t>(x, y);
  else convert_int<int64_t>(x, y);
  return y;
}

// The operand checks of an arithmetic op that may take integers: defined, and of a type it takes.
void check_arithmetic_operand(const char* op, const char* what, const Tensor& t) {
  CUMULUS_CHECK(t.defined(), InvalidArgument, op, ": ", what, " is undefined", detail::undefined_because(t));
  CUMULUS_CHECK(is_floating(t.dtype()) || is_integer(t.dtype()), InvalidArgument, op, ": ", what,
                " must be f32, bf16, f16, i32 or i64, got ", dtype_name(t.dtype()));
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

// What a op b is to a loss (Note [Loss normalized once] in engine/train/loss_checks.cpp): a sum of
// losses (add, sub), or one loss scaled by a constant (mul by, or div by, a tensor with no gradient).
void declare_loss_relation(Node& node, BinaryOp op, bool a_grad, bool b_grad) {
  if (op == BinaryOp::add || op == BinaryOp::sub) node.set_output_reduction(OutputReduction::added);
  else if ((op == BinaryOp::mul && a_grad != b_grad) || (op == BinaryOp::div && a_grad && !b_grad))
    node.set_scaled_by_tensor(op == BinaryOp::div);
}

class BinaryBackward final : public Node {
 public:
  BinaryBackward(BinaryOp op, const BroadcastGeometry& g, Shape a_shape, Shape b_shape, Tensor a, Tensor b, bool a_grad,
                 bool b_grad)
      : Node(binary_name(op)), op_(op), g_(g), shapes_{a_shape, b_shape}, a_(std::move(a)), b_(std::move(b)) {
    declare_loss_relation(*this, op, a_grad, b_grad);
  }

  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    for (int operand = 0; operand < 2; ++operand) {
      if (!grads[static_cast<std::size_t>(operand)].needed()) continue;
      if (passes_dy_through(operand, dy)) {  // a residual's add: no copy (Note [Gradient sinks])
        grads[static_cast<std::size_t>(operand)].give(dy);
        continue;
      }
      GradSink::Target dx = grads[static_cast<std::size_t>(operand)].begin(shapes_[operand], dy.device(), dy.dtype());
      CUMULUS_DISPATCH_FLOAT(dy.dtype(), T, const T* ap = a_.defined() ? a_.data<T>() : nullptr;
                             const T* bp = b_.defined() ? b_.data<T>() : nullptr;
                             CUMULUS_DISPATCH_POINTWISE(dy.device(), binary_backward, g_, op_, operand, ap, bp,
                                                        dy.data<T>(), dx.beta(), dx.tensor.data<T>()));
    }
  }
  void release_saved() override { a_ = b_ = Tensor(); }

 private:
  // The operand's gradient is dy itself: a's or b's of add, a's of sub, not broadcast.
  bool passes_dy_through(int operand, const Tensor& dy) const {
    const bool identity = op_ == BinaryOp::add || (op_ == BinaryOp::sub && operand == 0);
    return identity && shapes_[operand] == dy.shape();
  }

  BinaryOp op_;
  BroadcastGeometry g_;
  Shape shapes_[2];
  Tensor a_, b_;
};

// Two integer tensors of one type: add, sub, mul (Note [Integer promotion]); no gradient.
Tensor int_binary(BinaryOp op, const Tensor& a, const Tensor& b, const Shape& out_shape, const BroadcastGeometry& g) {
  Tensor y = detail::new_output(out_shape, a.dtype(), a.device());
  if (out_shape.numel() == 0) return y;
  auto run = [&](auto* yp) {
    using I = std::remove_pointer_t<decltype(yp)>;
    const I *ap = a.data<I>(), *bp = b.data<I>();
    CUMULUS_DISPATCH(a.device(), ctx, kernels::int_binary_forward_cpu(g, op, ap, bp, yp),
                     kernels::int_binary_forward_cuda(g, op, ap, bp, yp, ctx.stream()));
  };
  if (a.dtype() == DType::i32) run(y.data<int32_t>());
  else run(y.data<int64_t>());
  return y;
}

Tensor binary(BinaryOp op, const Tensor& a_in, const Tensor& b_in) {
  const char* name = binary_name(op);
  OpScope op_scope(name);
  Tensor a = detail::contiguous(a_in), b = detail::contiguous(b_in);
  if (is_arithmetic(op)) {
    check_arithmetic_operand(name, "a", a);
    check_arithmetic_operand(name, "b", b);
  } else {
    detail::check_floating(name, "a", a);
    detail::check_floating(name, "b", b);
  }
  CUMULUS_CHECK(a.device() == b.device(), DeviceError, name, ": a is on ", a.device().str(), " but b is on ",
                b.device().str());
  const Shape out_shape = broadcast_shape(name, a.shape(), b.shape());
  const BroadcastGeometry g = geometry_of(a.shape(), b.shape());
  if (is_integer(a.dtype()) || is_integer(b.dtype())) {
    const DType t = promoted_dtype(op, a.dtype(), b.dtype());
    a = promoted_to(a, t);
    b = promoted_to(b, t);
    if (is_integer(t)) return int_binary(op, a, b, out_shape, g);
  }
  CUMULUS_CHECK(a.dtype() == b.dtype(), InvalidArgument, name, ": operands must have the same dtype, got ",
                dtype_name(a.dtype()), " and ", dtype_name(b.dtype()), " (cast one with ops::cast)");
  Tensor y = detail::new_output(out_shape, a.dtype(), a.device());
  if (out_shape.numel() > 0) {
    CUMULUS_DISPATCH_FLOAT(
        a.dtype(), T,
        CUMULUS_DISPATCH_POINTWISE(a.device(), binary_forward, g, op, a.data<T>(), b.data<T>(), y.data<T>()));
  }
  if (!should_record({&a, &b})) return y;
  // What the gradients read: mul's a-gradient reads b and its b-gradient a; div's read b, and a for
  // b's; pow's, maximum's and minimum's read both.
  const bool a_grad = a.requires_grad(), b_grad = b.requires_grad();
  const bool both = !is_arithmetic(op);
  const bool keep_a = both || ((op == BinaryOp::mul || op == BinaryOp::div) && b_grad);
  const bool keep_b = both || (op == BinaryOp::mul && a_grad) || op == BinaryOp::div;
  attach_node(y,
              std::make_shared<BinaryBackward>(op, g, a.shape(), b.shape(), keep_a ? a.detach() : Tensor(),
                                               keep_b ? b.detach() : Tensor(), a_grad, b_grad),
              {&a, &b});
  return y;
}

class ScalarBackward final : public Node {
 public:
  ScalarBackward(BinaryOp op, bool reversed, float s, Shape shape, Tensor x)
      : Node(binary_name(op)), op_(op), reversed_(reversed), s_(s), shape_(shape), x_(std::move(x)) {
    declare_loss_relation(op, reversed, s);
  }

  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    if (!grads[0].needed()) return;
    GradSink::Target dx = grads[0].begin(shape_, dy.device(), dy.dtype());
    CUMULUS_DISPATCH_FLOAT(dy.dtype(), T, const T* xp = x_.defined() ? x_.data<T>() : nullptr;
                           CUMULUS_DISPATCH_POINTWISE(dy.device(), scalar_backward, op_, reversed_, s_, xp,
                                                      dy.data<T>(), dx.beta(), dx.tensor.data<T>(), shape_.numel()));
  }
  void release_saved() override { x_ = Tensor(); }

 private:
  // What x op s is to a loss (Note [Loss normalized once]): x + s, x - s, s - x, x * +-1 and x / +-1
  // leave its gradient's size as it is; x * s and x / s scale it.
  void declare_loss_relation(BinaryOp op, bool reversed, float s) {
    const bool unit = s == 1.0f || s == -1.0f;
    if (op == BinaryOp::add || op == BinaryOp::sub ||
        ((op == BinaryOp::mul || op == BinaryOp::div) && unit && !reversed))
      set_output_reduction(OutputReduction::none);
    else if (op == BinaryOp::mul || (op == BinaryOp::div && !reversed)) set_scaled_by(s, op == BinaryOp::div);
  }

  BinaryOp op_;
  bool reversed_;
  float s_;
  Shape shape_;
  Tensor x_;
};

Tensor scalar_binary(BinaryOp op, bool reversed, const Tensor& x_in, float s) {
  const char* name = binary_name(op);
  OpScope op_scope(name);
  Tensor x = detail::contiguous(x_in);
  if (is_arithmetic(op)) {
    check_arithmetic_operand(name, "tensor operand", x);
    x = promoted_to(x, is_floating(x.dtype()) ? x.dtype() : DType::f32);  // int op float: f32, as PyTorch
  } else {
    detail::check_floating(name, "tensor operand", x);
  }
  Tensor y = detail::new_output(x.shape(), x.dtype(), x.device());
  CUMULUS_DISPATCH_FLOAT(
      x.dtype(), T,
      CUMULUS_DISPATCH_POINTWISE(x.device(), scalar_forward, op, reversed, s, x.data<T>(), y.data<T>(), x.numel()));
  if (should_record({&x})) {
    // d(s / x) = -s / x^2 and pow's read x; the others read no x.
    const bool keep_x = (reversed && op == BinaryOp::div) || op == BinaryOp::pow;
    attach_node(y, std::make_shared<ScalarBackward>(op, reversed, s, x.shape(), keep_x ? x.detach() : Tensor()), {&x});
  }
  return y;
}

}  // namespace

Tensor detail::binary_op(BinaryOp op, const Tensor& a, const Tensor& b) { return binary(op, a, b); }
Tensor detail::scalar_op(BinaryOp op, const Tensor& x, float s) { return scalar_binary(op, false, x, s); }

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
