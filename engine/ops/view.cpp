// Strided views (transpose, permute, expand, squeeze, unsqueeze; narrow is in concat.cpp, reshape
// in shape.cpp) and the one copy that makes a view dense (contiguous).
//
// Note [Strided views]
// A tensor is its storage, an element offset, a shape and, when it is a strided view, one stride per
// dimension (TensorImpl::strides; a dense row-major tensor keeps none). transpose, permute, narrow,
// expand, squeeze and unsqueeze return views: no copy, no allocation, the storage shared. Kernels
// index their operands flat, so an op reads each tensor input through detail::contiguous, which
// returns a dense tensor as it is and gives a view's elements to ops::contiguous: one copy,
// recorded by autograd and allocated as an activation (the tracker counts it where it lives), whose
// backward hands the gradient on unchanged. Ops that can read a view in place do so instead
// (matmul reads the transpose of a dense tensor, k.transpose(-2, -1), through the GEMM's transpose
// flag; reshape of a view whose strides allow it is a view). A view's backward writes its dense
// gradient into the input's gradient at the view's strides: the same strided copy
// (kernels/strided_layout.h), adding where the sink accumulates; expand's sums over the expanded
// dimensions as a broadcast operand's gradient does. Tensor::data and raw_data refuse a strided
// view, so a kernel can never read one as if it were dense.
#include <numeric>
#include <string>

#include "cumulus/autograd/node.h"
#include "cumulus/ops/shape.h"
#include "engine/ops/pointwise_internal.h"
#include "engine/tensor/tensor_impl.h"
#include "kernels/cpu/strided_kernels.h"
#include "kernels/pointwise_rules.h"
#if CUMULUS_WITH_CUDA
#include "kernels/cuda/strided_kernels.h"
#endif

namespace cumulus::ops {

namespace {

int wrap_dim(const char* op, int dim, int ndim) {
  const int d = dim < 0 ? dim + ndim : dim;
  CUMULUS_CHECK(d >= 0 && d < ndim, ShapeError, op, ": dim ", dim, " out of range for a tensor of ", ndim,
                " dimensions");
  return d;
}

std::vector<int64_t> dense_strides(const Shape& shape) {
  std::vector<int64_t> s(static_cast<std::size_t>(shape.ndim()));
  int64_t running = 1;
  for (int d = shape.ndim() - 1; d >= 0; --d) {
    s[static_cast<std::size_t>(d)] = running;
    running *= shape[d];
  }
  return s;
}

// The copy's layout: dimensions of size 1 dropped, neighbours that are adjacent in both merged.
kernels::StridedLayout layout_of(const Shape& shape, const std::vector<int64_t>& src, const std::vector<int64_t>& dst) {
  kernels::StridedLayout l;
  for (int d = 0; d < shape.ndim(); ++d) {
    const auto k = static_cast<std::size_t>(d);
    if (shape[d] == 1) continue;
    const int last = l.ndim - 1;
    if (last >= 0 && l.src_stride[last] == shape[d] * src[k] && l.dst_stride[last] == shape[d] * dst[k]) {
      l.size[last] *= shape[d];
      l.src_stride[last] = src[k];
      l.dst_stride[last] = dst[k];
      continue;
    }
    l.size[l.ndim] = shape[d];
    l.src_stride[l.ndim] = src[k];
    l.dst_stride[l.ndim] = dst[k];
    ++l.ndim;
  }
  return l;
}

char* first_element(const Tensor& t) {
  const TensorImpl& impl = *impl_of(t);
  return static_cast<char*>(impl.storage->memory.get()) + impl.offset_bytes;
}

template <typename T>
void launch_strided_copy(const Tensor& src, const Tensor& dst, const kernels::StridedLayout& l, float beta) {
  const auto* s = reinterpret_cast<const T*>(first_element(src));
  auto* d = reinterpret_cast<T*>(first_element(dst));
  CUMULUS_DISPATCH(dst.device(), ctx, kernels::strided_copy_cpu(s, d, l, beta),
                   kernels::strided_copy_cuda(s, d, l, beta, ctx.stream()));
}

// Gives the gradient on, unchanged: contiguous(x)'s values are x's.
class ContiguousBackward final : public Node {
 public:
  ContiguousBackward() : Node("contiguous") { set_output_reduction(OutputReduction::none); }
  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    if (grads[0].needed()) grads[0].give(dy);
  }
};

// dx at the view's strides (+)= dy: the backward of the views that rearrange every element of their
// input (transpose, permute).
class StridedViewBackward final : public Node {
 public:
  StridedViewBackward(const char* op, Shape x_shape, std::vector<int64_t> view_strides)
      : Node(op), x_shape_(x_shape), view_strides_(std::move(view_strides)) {}
  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    if (!grads[0].needed()) return;
    GradSink::Target dx = grads[0].begin(x_shape_, dy.device(), dy.dtype());
    detail::copy_strided(dy, detail::strided_view(dx.tensor, dy.shape(), view_strides_, 0), dx.beta());
  }

 private:
  Shape x_shape_;
  std::vector<int64_t> view_strides_;  // the view's strides over a dense tensor of x's shape
};

// dx (+)= dy summed over the expanded dimensions (as a broadcast operand's gradient).
class ExpandBackward final : public Node {
 public:
  ExpandBackward(Shape x_shape, Shape out_shape) : Node("expand"), x_shape_(x_shape), out_shape_(out_shape) {}
  void backward(const Tensor& dy_in, std::vector<GradSink>& grads) override {
    if (!grads[0].needed()) return;
    const Tensor dy = detail::contiguous(dy_in);
    GradSink::Target dx = grads[0].begin(x_shape_, dy.device(), dy.dtype());
    int64_t a[Shape::kMaxDims], b[Shape::kMaxDims];
    for (int d = 0; d < x_shape_.ndim(); ++d) a[d] = x_shape_[d];
    for (int d = 0; d < out_shape_.ndim(); ++d) b[d] = out_shape_[d];
    const kernels::BroadcastGeometry g = kernels::broadcast_geometry(a, x_shape_.ndim(), b, out_shape_.ndim());
    CUMULUS_DISPATCH_FLOAT(dy.dtype(), T,
                           CUMULUS_DISPATCH_POINTWISE(dy.device(), binary_backward, g, kernels::BinaryOp::add, 0,
                                                      static_cast<const T*>(nullptr), static_cast<const T*>(nullptr),
                                                      dy.data<T>(), dx.beta(), dx.tensor.data<T>()));
  }

 private:
  Shape x_shape_, out_shape_;
};

// permute's view of a tensor of `shape` with `strides`.
std::pair<Shape, std::vector<int64_t>> permuted(const Shape& shape, const std::vector<int64_t>& strides,
                                                const std::vector<int>& dims) {
  std::pair<Shape, std::vector<int64_t>> v;
  for (int d : dims) {
    v.first.push_back(shape[d]);
    v.second.push_back(strides[static_cast<std::size_t>(d)]);
  }
  return v;
}

}  // namespace

namespace detail {

void* element_data(const Tensor& x) { return first_element(x); }

Tensor strided_view(const Tensor& x, const Shape& shape, const std::vector<int64_t>& strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_of(x)->storage;
  impl->offset_bytes = impl_of(x)->offset_bytes + static_cast<std::size_t>(offset) * dtype_size(x.dtype());
  impl->shape = shape;
  impl->dtype = x.dtype();
  int64_t running = 1;
  for (int d = shape.ndim() - 1; d >= 0; --d) {  // dense unless a dimension of size > 1 says otherwise
    const auto k = static_cast<std::size_t>(d);
    if (shape[d] != 1 && strides[k] != running) impl->contiguous = false;
    running *= shape[d];
  }
  if (!impl->contiguous)
    for (int d = 0; d < shape.ndim(); ++d)
      impl->strides[static_cast<std::size_t>(d)] = strides[static_cast<std::size_t>(d)];
  return make_tensor(std::move(impl));
}

void copy_strided(const Tensor& src, const Tensor& dst, float beta) {
  CUMULUS_CHECK(src.shape() == dst.shape() && src.dtype() == dst.dtype() && src.device() == dst.device(), ShapeError,
                "copy between views: ", src.str(), " into ", dst.str());
  CUMULUS_CHECK(beta == 0.0f || is_floating(dst.dtype()), InvalidArgument, "copy between views: beta ", beta, " on ",
                dtype_name(dst.dtype()));
  if (src.numel() == 0) return;
  const kernels::StridedLayout l = layout_of(src.shape(), src.strides(), dst.strides());
  switch (dst.dtype()) {
    case DType::f32: return launch_strided_copy<float>(src, dst, l, beta);
    case DType::bf16: return launch_strided_copy<BFloat16>(src, dst, l, beta);
    case DType::f16: return launch_strided_copy<Half>(src, dst, l, beta);
    default: break;
  }
  switch (dtype_size(dst.dtype())) {  // integer and boolean elements: copied as they are
    case 1: return launch_strided_copy<uint8_t>(src, dst, l, 0.0f);
    case 4: return launch_strided_copy<int32_t>(src, dst, l, 0.0f);
    case 8: return launch_strided_copy<int64_t>(src, dst, l, 0.0f);
    default: throw InvalidArgument(std::string("copy between views: no copy for dtype ") + dtype_name(dst.dtype()));
  }
}

}  // namespace detail

Tensor contiguous(const Tensor& x) {
  CUMULUS_CHECK(x.defined(), InvalidArgument, "contiguous: input is undefined", detail::undefined_because(x));
  if (x.is_contiguous()) return x;
  OpScope op_scope("contiguous");
  Tensor y = detail::new_output(x.shape(), x.dtype(), x.device());
  detail::copy_strided(x, y);
  if (should_record({&x})) attach_node(y, std::make_shared<ContiguousBackward>(), {&x});
  return y;
}

Tensor permute(const Tensor& x, const std::vector<int>& dims) {
  constexpr const char* op = "permute";
  CUMULUS_CHECK(x.defined(), InvalidArgument, op, ": input is undefined", detail::undefined_because(x));
  const int n = x.ndim();
  CUMULUS_CHECK(static_cast<int>(dims.size()) == n, ShapeError, op, ": ", dims.size(), " dims for a tensor of shape ",
                x.shape().str());
  std::vector<bool> seen(static_cast<std::size_t>(n), false);
  std::vector<int> wrapped;
  for (int d : dims) {
    wrapped.push_back(wrap_dim(op, d, n));
    CUMULUS_CHECK(!seen[static_cast<std::size_t>(wrapped.back())], ShapeError, op, ": dim ", d, " appears twice");
    seen[static_cast<std::size_t>(wrapped.back())] = true;
  }
  const auto [shape, strides] = permuted(x.shape(), x.strides(), wrapped);
  Tensor y = detail::strided_view(x, shape, strides, 0);
  if (should_record({&x}))
    attach_node(y,
                std::make_shared<StridedViewBackward>(op, x.shape(),
                                                      permuted(x.shape(), dense_strides(x.shape()), wrapped).second),
                {&x});
  return y;
}

Tensor transpose(const Tensor& x, int dim0, int dim1) {
  CUMULUS_CHECK(x.defined(), InvalidArgument, "transpose: input is undefined", detail::undefined_because(x));
  const int n = x.ndim();
  std::vector<int> dims(static_cast<std::size_t>(n));
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[static_cast<std::size_t>(wrap_dim("transpose", dim0, n))],
            dims[static_cast<std::size_t>(wrap_dim("transpose", dim1, n))]);
  return permute(x, dims);
}

Tensor expand(const Tensor& x, const std::vector<int64_t>& sizes) {
  constexpr const char* op = "expand";
  CUMULUS_CHECK(x.defined(), InvalidArgument, op, ": input is undefined", detail::undefined_because(x));
  const int n = x.ndim(), m = static_cast<int>(sizes.size());
  CUMULUS_CHECK(m >= n, ShapeError, op, ": ", m, " sizes for a tensor of shape ", x.shape().str());
  const std::vector<int64_t> xs = x.strides();
  Shape shape;
  std::vector<int64_t> strides;
  for (int d = 0; d < m; ++d) {
    const int k = d - (m - n);  // x's dimension, or a new leading one
    const int64_t want = sizes[static_cast<std::size_t>(d)], have = k >= 0 ? x.shape()[k] : 1;
    CUMULUS_CHECK(want >= 0 || (want == -1 && k >= 0), ShapeError, op, ": size ", want, " for dimension ", d,
                  " (-1 keeps an existing dimension's size)");
    const int64_t size = want == -1 ? have : want;
    CUMULUS_CHECK(size == have || have == 1, ShapeError, op, ": cannot expand ", x.shape().str(), " to size ", size,
                  " in dimension ", d, " (only dimensions of size 1 expand)");
    shape.push_back(size);
    strides.push_back(k >= 0 && size == have ? xs[static_cast<std::size_t>(k)] : 0);
  }
  Tensor y = detail::strided_view(x, shape, strides, 0);
  if (should_record({&x})) attach_node(y, std::make_shared<ExpandBackward>(x.shape(), shape), {&x});
  return y;
}

// squeeze and unsqueeze keep the elements' order: reshapes, which are views whatever x's strides.
Tensor unsqueeze(const Tensor& x, int dim) {
  CUMULUS_CHECK(x.defined(), InvalidArgument, "unsqueeze: input is undefined", detail::undefined_because(x));
  const int at = wrap_dim("unsqueeze", dim, x.ndim() + 1);
  Shape shape;
  for (int d = 0; d <= x.ndim(); ++d) {
    if (d == at) shape.push_back(1);
    if (d < x.ndim()) shape.push_back(x.shape()[d]);
  }
  return reshape(x, shape);
}

Tensor squeeze(const Tensor& x, int dim) {
  CUMULUS_CHECK(x.defined(), InvalidArgument, "squeeze: input is undefined", detail::undefined_because(x));
  const int drop = wrap_dim("squeeze", dim, x.ndim());
  if (x.shape()[drop] != 1) return x;  // as torch.squeeze(x, dim): only a dimension of size 1 goes
  Shape shape;
  for (int d = 0; d < x.ndim(); ++d)
    if (d != drop) shape.push_back(x.shape()[d]);
  return reshape(x, shape);
}

}  // namespace cumulus::ops
