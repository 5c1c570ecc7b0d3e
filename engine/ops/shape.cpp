// reshape / flatten: views over the same storage (no copy, no allocation), of a dense input or of a
// strided view whose strides allow it (splitting the last dimension of a qkv projection's slice into
// heads); otherwise the input is first made dense (Note [Strided views] in view.cpp). Backward
// hands the gradient on as a view with the input's shape.
// cast: a copy in another floating type; backward hands the gradient on converted back.
#include "cumulus/ops/shape.h"
#include "cumulus/autograd/node.h"
#include "engine/ops/compare_internal.h"
#include "engine/ops/internal.h"

namespace cumulus::ops {

namespace {

class ReshapeBackward final : public Node {
 public:
  explicit ReshapeBackward(Shape input_shape) : Node("reshape"), input_shape_(input_shape) {
    set_output_reduction(OutputReduction::none);
  }
  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    if (grads[0].needed()) grads[0].give(dy.detach().reshape(input_shape_));
  }

 private:
  Shape input_shape_;
};

// The strides that show x's elements, in row-major order, as `shape`, when its strides allow it
// (each run of x's dimensions that lie back to back in memory is split or merged alone); empty when
// they do not (the reshape must copy). As torch.view decides it.
std::vector<int64_t> view_strides(const Tensor& x, const Shape& shape) {
  const Shape& old = x.shape();
  const std::vector<int64_t> os = x.strides();
  std::vector<int64_t> ns(static_cast<std::size_t>(shape.ndim()), 1);
  int view_d = shape.ndim() - 1;
  int64_t base = os.empty() ? 1 : os.back(), tensor_numel = 1, view_numel = 1;
  for (int d = old.ndim() - 1; d >= 0; --d) {
    tensor_numel *= old[d];
    const bool chunk_ends = d == 0 || (old[d - 1] != 1 && os[static_cast<std::size_t>(d - 1)] != tensor_numel * base);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
      ns[static_cast<std::size_t>(view_d)] = view_numel * base;
      view_numel *= shape[view_d--];
    }
    if (view_numel != tensor_numel) return {};
    if (d > 0) {
      base = os[static_cast<std::size_t>(d - 1)];
      tensor_numel = view_numel = 1;
    }
  }
  if (view_d != -1) return {};
  return ns;
}

Tensor view(const Tensor& x, const Shape& shape) {
  std::vector<int64_t> dense(static_cast<std::size_t>(shape.ndim()));
  int64_t running = 1;
  for (int d = shape.ndim() - 1; d >= 0; --d) {
    dense[static_cast<std::size_t>(d)] = running;
    running *= shape[d];
  }
  return detail::strided_view(x, shape, dense, 0);
}

class CastBackward final : public Node {
 public:
  explicit CastBackward(DType input_dtype) : Node("cast"), input_dtype_(input_dtype) {
    set_output_reduction(OutputReduction::none);
  }
  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    if (grads[0].needed()) grads[0].give(dy.to(input_dtype_));
  }

 private:
  DType input_dtype_;
};

}  // namespace

Tensor cast(const Tensor& x_in, DType dtype) {
  OpScope op_scope("cast");
  const Tensor x = detail::contiguous(x_in);
  // To or from bool: not recorded (engine/ops/compare.cpp, Note [Bool tensors]).
  if (x.defined() && (x.dtype() == DType::boolean || dtype == DType::boolean)) return detail::cast_bool(x, dtype);
  detail::check_floating("cast", "input", x);
  CUMULUS_CHECK(is_floating(dtype), InvalidArgument, "cast: to f32, bf16 or f16, not ", dtype_name(dtype));
  if (x.dtype() == dtype) return x;
  Tensor y;
  {
    MemoryCategoryScope scope(detail::output_category());
    y = x.to(dtype);
  }
  if (should_record({&x})) attach_node(y, std::make_shared<CastBackward>(x.dtype()), {&x});
  return y;
}

Tensor reshape(const Tensor& x_in, const Shape& shape) {
  CUMULUS_CHECK(x_in.defined(), InvalidArgument, "reshape: input is undefined");
  CUMULUS_CHECK(shape.numel() == x_in.numel(), ShapeError, "reshape: cannot view ", x_in.shape().str(), " (",
                x_in.numel(), " elements) as ", shape.str(), " (", shape.numel(), " elements)");
  if (!x_in.is_contiguous() && x_in.numel() > 0) {
    const std::vector<int64_t> strides = view_strides(x_in, shape);
    if (!strides.empty() || shape.ndim() == 0) {  // a view of the view: no copy
      Tensor y = detail::strided_view(x_in, shape, strides, 0);
      if (should_record({&x_in})) attach_node(y, std::make_shared<ReshapeBackward>(x_in.shape()), {&x_in});
      return y;
    }
  }
  const Tensor x = detail::contiguous(x_in);
  Tensor y = view(x, shape);
  if (should_record({&x})) attach_node(y, std::make_shared<ReshapeBackward>(x.shape()), {&x});
  return y;
}

Tensor reshape(const Tensor& x, const std::vector<int64_t>& sizes) {
  CUMULUS_CHECK(x.defined(), InvalidArgument, "reshape: input is undefined");
  int inferred = -1;
  int64_t known = 1;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    CUMULUS_CHECK(sizes[k] >= -1, ShapeError, "reshape: invalid size ", sizes[k], " for dimension ", k);
    if (sizes[k] >= 0) {
      known *= sizes[k];
      continue;
    }
    CUMULUS_CHECK(inferred < 0, ShapeError, "reshape: only one dimension can be -1");
    inferred = static_cast<int>(k);
  }
  Shape shape;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    if (static_cast<int>(k) != inferred) {
      shape.push_back(sizes[k]);
      continue;
    }
    CUMULUS_CHECK(known != 0 && x.numel() % known == 0, ShapeError, "reshape: cannot infer dimension ", k,
                  " of a view of ", x.shape().str(), " (", x.numel(), " elements) with the other sizes' product ",
                  known);
    shape.push_back(x.numel() / known);
  }
  return reshape(x, shape);
}

Tensor reshape(const Tensor& x, std::initializer_list<int64_t> sizes) {
  return reshape(x, std::vector<int64_t>(sizes));
}

Tensor flatten(const Tensor& x, int start_dim) {
  CUMULUS_CHECK(x.defined(), InvalidArgument, "flatten: input is undefined");
  const int n = x.ndim();
  const int start = start_dim < 0 ? start_dim + n : start_dim;
  // As torch.flatten: start_dim names a dimension (a 0-d tensor has dimension 0, and becomes [1]).
  CUMULUS_CHECK(start >= 0 && (start < n || start == 0), ShapeError, "flatten: start_dim ", start_dim,
                " out of range for ", x.shape().str());
  Shape s;
  int64_t merged = 1;
  for (int i = 0; i < n; ++i) {
    if (i < start) s.push_back(x.shape()[i]);
    else merged *= x.shape()[i];
  }
  s.push_back(merged);
  return reshape(x, s);
}

}  // namespace cumulus::ops
