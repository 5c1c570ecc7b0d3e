// reshape / flatten: views over the same storage (no copy, no allocation) of a dense input; a
// strided view is first made dense (Note [Strided views] in view.cpp). Backward hands the
// gradient on as a view with the input's shape.
// cast: a copy in another floating type; backward hands the gradient on converted back.
#include "cumulus/autograd/node.h"
#include "cumulus/ops/ops.h"
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

Tensor view(const Tensor& x, const Shape& shape) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = x.impl()->storage;
  impl->offset_bytes = x.impl()->offset_bytes;
  impl->shape = shape;
  impl->dtype = x.dtype();
  return Tensor(std::move(impl));
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
  CUMULUS_CHECK(shape.numel() == x_in.numel(), ShapeError, "reshape: cannot view ", x_in.shape().str(),
                " (", x_in.numel(), " elements) as ", shape.str(), " (", shape.numel(), " elements)");
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
