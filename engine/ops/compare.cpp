// Comparisons, logical ops, where, masked_fill, tril / triu and arange (cumulus/ops/compare.h), and
// ops::cast's conversions to and from bool. The element rules are kernels/compare_rules.h, shared by
// the CPU and CUDA kernels; broadcasting over up to three operands is Note [Nary geometry] there.
//
// Note [Bool tensors]
// DType::boolean ("bool") stores one byte per element, 0 or 1, as PyTorch's torch.bool; kernels read
// and write it as uint8_t, and every op that makes one writes only 0 or 1 (a cast to bool writes
// x != 0), so a comparison of masks is a comparison of bytes. bool has no C++ element type in
// Tensor's API: std::vector<bool> packs bits and has no data() to copy from or into. A bool tensor
// comes from the ops (comparisons, logical ops, ops::cast(x, DType::boolean), Tensor::zeros) and
// reads back with to_vector<uint8_t>(); safetensors stores it as BOOL and refuses other bytes on load.
// Bool tensors carry no gradient: the ops that make them record nothing.
#include "cumulus/ops/compare.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cumulus/autograd/node.h"
#include "engine/ops/compare_internal.h"
#include "engine/ops/internal.h"
#include "kernels/cpu/compare_kernels.h"
#if CUMULUS_WITH_CUDA
#include "kernels/cuda/compare_kernels.h"
#endif

// CUMULUS_DISPATCH_COMPARE(device, launcher, args...): kernels::launcher_cpu(args...) on the CPU,
// kernels::launcher_cuda(args..., stream) on CUDA.
#define CUMULUS_DISPATCH_COMPARE(device, launcher, ...)                          \
  CUMULUS_DISPATCH(device, ctx, ::cumulus::kernels::launcher##_cpu(__VA_ARGS__), \
                   ::cumulus::kernels::launcher##_cuda(__VA_ARGS__, ctx.stream()))

// CUMULUS_DISPATCH_ANY(dtype, T, body...): body with T the storage type of any dtype (bool as the
// uint8_t of its bytes).
// clang-format off
#define CUMULUS_DISPATCH_ANY(dtype, T, ...)                                                          \
  do {                                                                                              \
    switch (dtype) {                                                                                \
      case ::cumulus::DType::f32: { using T = float; __VA_ARGS__; break; }                          \
      case ::cumulus::DType::bf16: { using T = ::cumulus::BFloat16; __VA_ARGS__; break; }           \
      case ::cumulus::DType::f16: { using T = ::cumulus::Half; __VA_ARGS__; break; }                \
      case ::cumulus::DType::i32: { using T = int32_t; __VA_ARGS__; break; }                        \
      case ::cumulus::DType::i64: { using T = int64_t; __VA_ARGS__; break; }                        \
      case ::cumulus::DType::u8:                                                                    \
      case ::cumulus::DType::boolean: { using T = uint8_t; __VA_ARGS__; break; }                    \
      default:                                                                                      \
        throw ::cumulus::InvalidArgument(std::string("no comparison kernel for dtype ") +           \
                                         ::cumulus::dtype_name(dtype));                             \
    }                                                                                               \
  } while (0)

// CUMULUS_DISPATCH_BITS(dtype, E, body...): body with E the unsigned integer of the dtype's size,
// for the ops that only move elements.
#define CUMULUS_DISPATCH_BITS(dtype, E, ...)                                                         \
  do {                                                                                              \
    switch (::cumulus::dtype_size(dtype)) {                                                         \
      case 1: { using E = uint8_t; __VA_ARGS__; break; }                                            \
      case 2: { using E = uint16_t; __VA_ARGS__; break; }                                           \
      case 4: { using E = uint32_t; __VA_ARGS__; break; }                                           \
      default: { using E = uint64_t; __VA_ARGS__; break; }                                          \
    }                                                                                               \
  } while (0)
// clang-format on

namespace cumulus::ops {

namespace {

using kernels::CompareOp;
using kernels::NaryGeometry;
static_assert(Shape::kMaxDims <= NaryGeometry::kMaxDims, "a shape fits the geometry");

// A tensor's elements as T, the dispatch having matched T to its dtype (bool has no data<T>()).
template <typename T>
T* elements(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

const char* compare_name(CompareOp op) {
  switch (op) {
    case CompareOp::eq: return "eq";
    case CompareOp::ne: return "ne";
    case CompareOp::lt: return "lt";
    case CompareOp::le: return "le";
    case CompareOp::gt: return "gt";
    case CompareOp::ge: return "ge";
    case CompareOp::logical_and: return "logical_and";
    case CompareOp::logical_or: return "logical_or";
    default: return "logical_xor";
  }
}

void check_defined(const char* op, const char* what, const Tensor& t) {
  CUMULUS_CHECK(t.defined(), InvalidArgument, op, ": ", what, " is undefined", detail::undefined_because(t));
}

void check_bool(const char* op, const char* what, const Tensor& t) {
  check_defined(op, what, t);
  CUMULUS_CHECK(t.dtype() == DType::boolean, InvalidArgument, op, ": ", what, " must be bool, got ",
                dtype_name(t.dtype()), " (make one with a comparison or ops::cast(x, DType::boolean))");
}

// The shape the operands broadcast to under numpy's rules; throws naming the op and the shapes.
Shape broadcast_shape(const char* op, const std::vector<Shape>& shapes) {
  int ndim = 0;
  for (const Shape& s : shapes) ndim = std::max(ndim, s.ndim());
  Shape out;
  for (int d = 0; d < ndim; ++d) {
    int64_t size = 1;
    for (const Shape& s : shapes) {
      const int k = d - (ndim - s.ndim());
      const int64_t sk = k >= 0 ? s[k] : 1;
      if (sk == 1 || sk == size) continue;
      if (size != 1) {
        std::string all;
        for (const Shape& u : shapes) all += (all.empty() ? "" : ", ") + u.str();
        throw InvalidArgument(::cumulus::detail::concat(op, ": shapes ", all, " do not broadcast (dimension ", d,
                                                        " of the output: ", size, " vs ", sk, ")"));
      }
      size = sk;
    }
    out.push_back(size);
  }
  return out;
}

NaryGeometry geometry_of(const Shape& out, const std::vector<Shape>& shapes) {
  int64_t dims[NaryGeometry::kMaxOperands][NaryGeometry::kMaxDims] = {};
  const int64_t* operands[NaryGeometry::kMaxOperands];
  int ndims[NaryGeometry::kMaxOperands];
  int64_t out_dims[NaryGeometry::kMaxDims] = {};
  for (int d = 0; d < out.ndim(); ++d) out_dims[d] = out[d];
  const int n = static_cast<int>(shapes.size());
  for (int k = 0; k < n; ++k) {
    const Shape& s = shapes[static_cast<std::size_t>(k)];
    for (int d = 0; d < s.ndim(); ++d) dims[k][d] = s[d];
    operands[k] = dims[k];
    ndims[k] = s.ndim();
  }
  return kernels::nary_geometry(out_dims, out.ndim(), n, operands, ndims);
}

Tensor compare(CompareOp op, const Tensor& a_in, const Tensor& b_in) {
  const char* name = compare_name(op);
  OpScope op_scope(name);
  check_defined(name, "a", a_in);
  check_defined(name, "b", b_in);
  const Tensor a = detail::contiguous(a_in), b = detail::contiguous(b_in);
  CUMULUS_CHECK(a.dtype() == b.dtype(), InvalidArgument, name, ": operands must have the same dtype, got ",
                dtype_name(a.dtype()), " and ", dtype_name(b.dtype()), " (cast one with ops::cast)");
  CUMULUS_CHECK(a.device() == b.device(), DeviceError, name, ": a is on ", a.device().str(), " but b is on ",
                b.device().str());
  const Shape out = broadcast_shape(name, {a.shape(), b.shape()});
  const NaryGeometry g = geometry_of(out, {a.shape(), b.shape()});
  Tensor y = detail::new_output(out, DType::boolean, a.device());
  if (out.numel() == 0) return y;
  CUMULUS_DISPATCH_ANY(a.dtype(), T,
                       CUMULUS_DISPATCH_COMPARE(a.device(), compare_forward, g, op, elements<const T>(a),
                                                elements<const T>(b), elements<uint8_t>(y)));
  return y;
}

// The scalar as x's dtype compares with it (kernels::CompareScalar).
kernels::CompareScalar scalar_for(DType dtype, double s) {
  kernels::CompareScalar c;
  const float f = static_cast<float>(s);
  c.f = dtype == DType::bf16  ? kernels::to_f32(kernels::from_f32<BFloat16>(f))
        : dtype == DType::f16 ? kernels::to_f32(kernels::from_f32<Half>(f))
                              : f;
  c.d = s;
  // Both bounds are exact doubles; 2^63 itself is out of range.
  c.integral = std::floor(s) == s && s >= -9223372036854775808.0 && s < 9223372036854775808.0;
  c.i = c.integral ? static_cast<int64_t>(s) : 0;
  return c;
}

// y = x op s (bool) for any x, into a new output.
Tensor compare_scalar_unscoped(CompareOp op, const Tensor& x, double s) {
  Tensor y = detail::new_output(x.shape(), DType::boolean, x.device());
  if (x.numel() == 0) return y;
  const kernels::CompareScalar c = scalar_for(x.dtype(), s);
  CUMULUS_DISPATCH_ANY(x.dtype(), T,
                       CUMULUS_DISPATCH_COMPARE(x.device(), compare_scalar, op, elements<const T>(x), c,
                                                elements<uint8_t>(y), x.numel()));
  return y;
}

Tensor compare_scalar(CompareOp op, const Tensor& x_in, double s) {
  const char* name = compare_name(op);
  OpScope op_scope(name);
  check_defined(name, "tensor operand", x_in);
  return compare_scalar_unscoped(op, detail::contiguous(x_in), s);
}

// Logical ops take operands of any dtypes: of different ones, each is first made bool (x != 0).
Tensor logical(CompareOp op, const Tensor& a_in, const Tensor& b_in) {
  const char* name = compare_name(op);
  if (a_in.defined() && b_in.defined() && a_in.dtype() != b_in.dtype()) {
    OpScope op_scope(name);
    const Tensor a_dense = detail::contiguous(a_in), b_dense = detail::contiguous(b_in);
    const Tensor a = a_in.dtype() == DType::boolean ? a_dense : compare_scalar_unscoped(CompareOp::ne, a_dense, 0.0);
    const Tensor b = b_in.dtype() == DType::boolean ? b_dense : compare_scalar_unscoped(CompareOp::ne, b_dense, 0.0);
    return compare(op, a, b);
  }
  return compare(op, a_in, b_in);
}

// ---- where ----

// The bits of `value` in `dtype`: rounded for the floating types, where a finite value must stay
// finite (as PyTorch refuses 1e5 for f16: "cannot be converted without overflow"); an integer type or
// bool must hold it exactly.
template <typename E>
E bits_of(const char* op, DType dtype, double value) {
  if (is_floating(dtype) && std::isfinite(value)) {
    const float f = static_cast<float>(value);
    const float rounded = dtype == DType::bf16  ? kernels::to_f32(kernels::from_f32<BFloat16>(f))
                          : dtype == DType::f16 ? kernels::to_f32(kernels::from_f32<Half>(f))
                                                : f;
    CUMULUS_CHECK(std::isfinite(rounded), InvalidArgument, op, ": value ", value, " overflows ", dtype_name(dtype));
  }
  E bits{};
  auto store = [&](auto v) {
    static_assert(sizeof(v) == sizeof(E), "the value's type has the dtype's size");
    std::memcpy(&bits, &v, sizeof bits);
  };
  auto exact = [&](double lo, double hi) {
    CUMULUS_CHECK(std::floor(value) == value && value >= lo && value <= hi, InvalidArgument, op, ": value ", value,
                  " is not representable in dtype ", dtype_name(dtype));
  };
  if constexpr (sizeof(E) == 4) {
    if (dtype == DType::f32) {
      store(static_cast<float>(value));
    } else {
      exact(-2147483648.0, 2147483647.0);
      store(static_cast<int32_t>(value));
    }
  } else if constexpr (sizeof(E) == 2) {
    const float f = static_cast<float>(value);
    store(dtype == DType::bf16 ? kernels::from_f32<BFloat16>(f).bits : kernels::from_f32<Half>(f).bits);
  } else if constexpr (sizeof(E) == 8) {
    exact(-9223372036854775808.0, 9223372036854775807.0);  // the upper bound rounds to 2^63: checked below
    CUMULUS_CHECK(value < 9223372036854775808.0, InvalidArgument, op, ": value ", value,
                  " is not representable in i64");
    store(static_cast<int64_t>(value));
  } else {
    if (dtype == DType::boolean) exact(0, 1);
    else exact(0, 255);
    store(static_cast<uint8_t>(value));
  }
  return bits;
}

// dy's share for where's a and b (a scalar operand takes none); the output's geometry over
// (cond, a, b), where a scalar operand reads as a broadcast of a one-element tensor.
class WhereBackward final : public Node {
 public:
  // slots[k]: where operand k (0 a, 1 b) sits among the node's inputs, -1 for a scalar.
  WhereBackward(const char* name, const NaryGeometry& g, Tensor cond, Shape a_shape, Shape b_shape, int a_slot,
                int b_slot)
      : Node(name), g_(g), cond_(std::move(cond)), shapes_{a_shape, b_shape}, slots_{a_slot, b_slot} {}

  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    for (int operand = 0; operand < 2; ++operand) {
      const int slot = slots_[operand];
      if (slot < 0 || !grads[static_cast<std::size_t>(slot)].needed()) continue;
      GradSink::Target dx = grads[static_cast<std::size_t>(slot)].begin(shapes_[operand], dy.device(), dy.dtype());
      CUMULUS_DISPATCH_FLOAT(
          dy.dtype(), T,
          CUMULUS_DISPATCH_COMPARE(dy.device(), where_backward, g_, 1 + operand, elements<const uint8_t>(cond_),
                                   dy.data<T>(), dx.beta(), dx.tensor.data<T>()));
    }
  }
  void release_saved() override { cond_ = Tensor(); }

 private:
  NaryGeometry g_;
  Tensor cond_;
  Shape shapes_[2];
  int slots_[2];
};

// where(cond, a, b) with a or b possibly a scalar (an undefined tensor and `fill`, read as a 0-d
// operand); `b_is_x`: the masked_fill form, whose cond is named the mask.
Tensor where_impl(const char* name, const Tensor& cond_in, const Tensor& a_in, const Tensor& b_in, double fill,
                  bool b_is_x) {
  OpScope op_scope(name);
  check_bool(name, b_is_x ? "mask" : "cond", cond_in);
  const Tensor cond = detail::contiguous(cond_in);
  const Tensor a = a_in.defined() ? detail::contiguous(a_in) : Tensor();
  const Tensor b = b_in.defined() ? detail::contiguous(b_in) : Tensor();
  const Tensor& x = a.defined() ? a : b;  // a tensor operand: the output's dtype and device
  if (a.defined() && b.defined()) {
    CUMULUS_CHECK(a.dtype() == b.dtype(), InvalidArgument, name, ": a and b must have the same dtype, got ",
                  dtype_name(a.dtype()), " and ", dtype_name(b.dtype()), " (cast one with ops::cast)");
    detail::check_same_device(name, "b", b, a);
  }
  detail::check_same_device(name, b_is_x ? "mask" : "cond", cond, x);
  const std::vector<Shape> shapes = {cond.shape(), a.defined() ? a.shape() : Shape{},
                                     b.defined() ? b.shape() : Shape{}};
  const Shape out = broadcast_shape(name, shapes);
  const NaryGeometry g = geometry_of(out, shapes);
  Tensor y = detail::new_output(out, x.dtype(), x.device());
  if (out.numel() > 0) {
    CUMULUS_DISPATCH_BITS(
        x.dtype(), E, const E fill_bits = a.defined() && b.defined() ? E{} : bits_of<E>(name, x.dtype(), fill);
        CUMULUS_DISPATCH_COMPARE(x.device(), where_forward, g, elements<const uint8_t>(cond),
                                 a.defined() ? elements<const E>(a) : nullptr,
                                 b.defined() ? elements<const E>(b) : nullptr, fill_bits, elements<E>(y)));
  }
  std::vector<const Tensor*> inputs = {&cond};
  int slots[2] = {-1, -1};
  for (int k = 0; k < 2; ++k) {
    const Tensor& t = k == 0 ? a : b;
    if (!t.defined()) continue;
    slots[k] = static_cast<int>(inputs.size());
    inputs.push_back(&t);
  }
  if (!should_record(inputs)) return y;
  attach_node(y, std::make_shared<WhereBackward>(name, g, cond.detach(), shapes[1], shapes[2], slots[0], slots[1]),
              inputs);
  return y;
}

// ---- tril / triu ----

class TriangleBackward final : public Node {
 public:
  TriangleBackward(const kernels::Triangle& t, Shape shape)
      : Node(t.upper ? "triu" : "tril"), t_(t), shape_(std::move(shape)) {}

  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    if (!grads[0].needed()) return;
    GradSink::Target dx = grads[0].begin(shape_, dy.device(), dy.dtype());
    CUMULUS_DISPATCH_FLOAT(
        dy.dtype(), T,
        CUMULUS_DISPATCH_COMPARE(dy.device(), triangle_backward, t_, dy.data<T>(), dx.beta(), dx.tensor.data<T>()));
  }

 private:
  kernels::Triangle t_;
  Shape shape_;
};

Tensor triangle(const Tensor& x_in, int64_t diagonal, bool upper) {
  const char* name = upper ? "triu" : "tril";
  OpScope op_scope(name);
  check_defined(name, "input", x_in);
  const Tensor x = detail::contiguous(x_in);
  CUMULUS_CHECK(x.ndim() >= 2, InvalidArgument, name, ": input must have at least 2 dimensions, got ", x.shape().str());
  kernels::Triangle t;
  t.rows = x.size(-2);
  t.cols = x.size(-1);
  t.batch = t.rows * t.cols == 0 ? 0 : x.numel() / (t.rows * t.cols);
  t.diagonal = diagonal;
  t.upper = upper;
  Tensor y = detail::new_output(x.shape(), x.dtype(), x.device());
  if (x.numel() > 0) {
    CUMULUS_DISPATCH_BITS(
        x.dtype(), E, CUMULUS_DISPATCH_COMPARE(x.device(), triangle_forward, t, elements<const E>(x), elements<E>(y)));
  }
  if (should_record({&x})) attach_node(y, std::make_shared<TriangleBackward>(t, x.shape()), {&x});
  return y;
}

// ---- arange ----

bool is_integer_value(double v) { return std::isfinite(v) && std::floor(v) == v; }

// The number of values of arange(start, end, step), checked as torch.arange checks it.
int64_t arange_count(double start, double end, double step) {
  CUMULUS_CHECK(std::isfinite(start) && std::isfinite(end), InvalidArgument, "arange: start (", start, ") and end (",
                end, ") must be finite");
  CUMULUS_CHECK(std::isfinite(step) && step != 0, InvalidArgument, "arange: step must be finite and nonzero, got ",
                step);
  CUMULUS_CHECK((step > 0 && end >= start) || (step < 0 && end <= start), InvalidArgument, "arange: end (", end,
                ") is on the wrong side of start (", start, ") for step ", step);
  const double n = std::ceil((end - start) / step);
  CUMULUS_CHECK(n < 9.2e18, InvalidArgument, "arange: ", n, " values are too many");
  return static_cast<int64_t>(n);
}

}  // namespace

Tensor eq(const Tensor& a, const Tensor& b) { return compare(CompareOp::eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare(CompareOp::ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare(CompareOp::lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return compare(CompareOp::le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare(CompareOp::gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare(CompareOp::ge, a, b); }

Tensor eq(const Tensor& x, double s) { return compare_scalar(CompareOp::eq, x, s); }
Tensor ne(const Tensor& x, double s) { return compare_scalar(CompareOp::ne, x, s); }
Tensor lt(const Tensor& x, double s) { return compare_scalar(CompareOp::lt, x, s); }
Tensor le(const Tensor& x, double s) { return compare_scalar(CompareOp::le, x, s); }
Tensor gt(const Tensor& x, double s) { return compare_scalar(CompareOp::gt, x, s); }
Tensor ge(const Tensor& x, double s) { return compare_scalar(CompareOp::ge, x, s); }

Tensor logical_not(const Tensor& x) {
  OpScope op_scope("logical_not");
  check_defined("logical_not", "input", x);
  return compare_scalar_unscoped(CompareOp::eq, detail::contiguous(x), 0.0);  // NaN == 0 is false: NaN is true
}
Tensor logical_and(const Tensor& a, const Tensor& b) { return logical(CompareOp::logical_and, a, b); }
Tensor logical_or(const Tensor& a, const Tensor& b) { return logical(CompareOp::logical_or, a, b); }
Tensor logical_xor(const Tensor& a, const Tensor& b) { return logical(CompareOp::logical_xor, a, b); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  CUMULUS_CHECK(a.defined() && b.defined(), InvalidArgument, "where: ", a.defined() ? "b" : "a", " is undefined",
                detail::undefined_because(a.defined() ? b : a));
  return where_impl("where", cond, a, b, 0.0, false);
}
Tensor where(const Tensor& cond, const Tensor& a, double b) {
  check_defined("where", "a", a);
  return where_impl("where", cond, a, Tensor(), b, false);
}
Tensor where(const Tensor& cond, double a, const Tensor& b) {
  check_defined("where", "b", b);
  return where_impl("where", cond, Tensor(), b, a, false);
}
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  check_defined("masked_fill", "x", x);
  return where_impl("masked_fill", mask, Tensor(), x, value, true);
}

Tensor tril(const Tensor& x, int64_t diagonal) { return triangle(x, diagonal, false); }
Tensor triu(const Tensor& x, int64_t diagonal) { return triangle(x, diagonal, true); }

Tensor arange(int64_t end, const Device& device) {
  return arange(0.0, static_cast<double>(end), 1.0, DType::i64, device);
}

Tensor arange(double start, double end, double step, std::optional<DType> dtype_in, const Device& device) {
  OpScope op_scope("arange");
  const bool integers = is_integer_value(start) && is_integer_value(end) && is_integer_value(step);
  const DType dtype = dtype_in.value_or(integers ? DType::i64 : DType::f32);
  CUMULUS_CHECK(dtype != DType::u8 && dtype != DType::boolean, InvalidArgument,
                "arange: dtype must be i64, i32, f32, bf16 or f16, got ", dtype_name(dtype));
  const int64_t n = arange_count(start, end, step);
  kernels::Arange a;
  a.start = start;
  a.step = step;
  if (!is_floating(dtype)) {
    CUMULUS_CHECK(is_integer_value(start) && is_integer_value(step), InvalidArgument, "arange: an ", dtype_name(dtype),
                  " arange needs an integer start and step, got ", start, " and ", step);
    const double last = start + static_cast<double>(n > 0 ? n - 1 : 0) * step;
    const double limit = dtype == DType::i32 ? 2147483647.0 : 9.2e18;
    CUMULUS_CHECK(std::fabs(start) <= limit && std::fabs(last) <= limit, InvalidArgument, "arange: values up to ", last,
                  " do not fit in ", dtype_name(dtype));
    a.istart = static_cast<int64_t>(start);
    a.istep = static_cast<int64_t>(step);
  }
  Tensor y = detail::new_output(Shape{n}, dtype, device);
  if (n == 0) return y;
  CUMULUS_DISPATCH_ANY(dtype, T, CUMULUS_DISPATCH_COMPARE(device, arange, a, elements<T>(y), n));
  return y;
}

namespace detail {

Tensor cast_bool(const Tensor& x_in, DType dtype) {
  check_defined("cast", "input", x_in);
  const Tensor x = contiguous(x_in);
  if (x.dtype() == dtype) return x;
  if (dtype == DType::boolean) return compare_scalar_unscoped(CompareOp::ne, x, 0.0);  // NaN != 0: true
  Tensor y = new_output(x.shape(), dtype, x.device());
  if (x.numel() == 0) return y;
  CUMULUS_DISPATCH_ANY(
      dtype, T, CUMULUS_DISPATCH_COMPARE(x.device(), bool_to, elements<const uint8_t>(x), elements<T>(y), x.numel()));
  return y;
}

}  // namespace detail

}  // namespace cumulus::ops
