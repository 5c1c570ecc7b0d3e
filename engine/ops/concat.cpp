// cat, narrow and split along any dimension. A contiguous tensor seen along `dim` is [outer,
// size(dim), inner] (kernels/cpu/structural_kernels.h), so each op is slab copies:
// - cat: each input's slab copied into the output; backward copies each input's slab of the
//   gradient into its sink (beta as the sink's).
// - narrow: a view (a strided one unless outer == 1; Note [Strided views] in view.cpp). Backward
//   writes the slab and zeros elsewhere in one pass (beta 0), or adds the
//   slab (beta 1; zeros added elsewhere leave the values as they are).
// - split: one narrow per piece, named "split". The first piece's gradient to reach x's pending
//   gradient writes all of it (zeros outside its slab), the others then add their slabs.
// - chunk: split's pieces of PyTorch's chunk sizes, named "chunk".
#include <string>

#include "cumulus/autograd/node.h"
#include "cumulus/ops/shape.h"
#include "engine/ops/internal.h"
#include "kernels/cpu/structural_kernels.h"
#if CUMULUS_WITH_CUDA
#include "kernels/cuda/structural_kernels.h"
#endif

namespace cumulus::ops {

namespace {

using detail::Slab;
using detail::slab_of;

int checked_dim(const char* op, const Shape& shape, int dim) {
  const int nd = shape.ndim(), d = dim < 0 ? dim + nd : dim;
  CUMULUS_CHECK(d >= 0 && d < nd, ShapeError, op, ": dim ", dim, " out of range for ", shape.str());
  return d;
}

Shape with_size(const Shape& shape, int d, int64_t size) {
  Shape s;
  for (int i = 0; i < shape.ndim(); ++i) s.push_back(i == d ? size : shape[i]);
  return s;
}

// dst[o, dst_start + j, i] = src[o, src_start + j, i] (+ beta dst) for j < length, on src's device.
void copy_slab(const Tensor& src, int64_t src_dim, int64_t src_start, const Tensor& dst, int64_t dst_dim,
               int64_t dst_start, int64_t outer, int64_t length, int64_t inner, float beta) {
  const Device device = dst.device();
  CUMULUS_DISPATCH_FLOAT(
      dst.dtype(), T, const T* sp = src.data<T>(); T* dp = dst.data<T>(); CUMULUS_DISPATCH(
          device, ctx,
          kernels::copy_slab_cpu(sp, src_dim, src_start, dp, dst_dim, dst_start, outer, length, inner, beta),
          kernels::copy_slab_cuda(sp, src_dim, src_start, dp, dst_dim, dst_start, outer, length, inner, beta,
                                  ctx.stream())));
}

class CatBackward final : public Node {
 public:
  CatBackward(std::vector<Shape> shapes, int d) : Node("cat"), shapes_(std::move(shapes)), d_(d) {}

  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    const Slab out = slab_of(dy.shape(), d_);
    int64_t offset = 0;
    for (std::size_t k = 0; k < shapes_.size(); ++k) {
      const int64_t length = shapes_[k][d_];
      if (grads[k].needed()) {
        GradSink::Target dx = grads[k].begin(shapes_[k], dy.device(), dy.dtype());
        copy_slab(dy, out.dim, offset, dx.tensor, length, 0, out.outer, length, out.inner, dx.beta());
      }
      offset += length;
    }
  }

 private:
  std::vector<Shape> shapes_;
  int d_;
};

class NarrowBackward final : public Node {
 public:
  NarrowBackward(const char* name, Shape x_shape, int d, int64_t start, int64_t length)
      : Node(name), x_shape_(x_shape), d_(d), start_(start), length_(length) {}

  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    if (!grads[0].needed()) return;
    const Device device = dy.device();
    GradSink::Target dx = grads[0].begin(x_shape_, device, dy.dtype());
    const Slab s = slab_of(x_shape_, d_);
    const float beta = dx.beta();
    const int64_t start = start_, length = length_;
    if (beta != 0.0f) {  // only the slab changes
      copy_slab(dy, length, 0, dx.tensor, s.dim, start, s.outer, length, s.inner, beta);
      return;
    }
    CUMULUS_DISPATCH_FLOAT(
        dy.dtype(), T, const T* dyp = dy.data<T>(); T* dxp = dx.tensor.data<T>(); CUMULUS_DISPATCH(
            device, ctx, kernels::narrow_backward_cpu(dyp, s.outer, s.dim, start, length, s.inner, beta, dxp),
            kernels::narrow_backward_cuda(dyp, s.outer, s.dim, start, length, s.inner, beta, dxp, ctx.stream())));
  }

 private:
  Shape x_shape_;
  int d_;
  int64_t start_, length_;
};

// narrow's work under the name of `op` (narrow, split or chunk); x checked floating, d in range.
Tensor narrow_as(const char* op, const Tensor& x, int d, int64_t start, int64_t length) {
  const Slab s = slab_of(x.shape(), d);
  CUMULUS_CHECK(start >= 0 && length >= 0 && start + length <= s.dim, ShapeError, op, ": start ", start, " and length ",
                length, " out of range for dim ", d, " of ", x.shape().str());
  const std::vector<int64_t> strides = x.strides();
  Tensor y =
      detail::strided_view(x, with_size(x.shape(), d, length), strides, start * strides[static_cast<std::size_t>(d)]);
  if (should_record({&x})) attach_node(y, std::make_shared<NarrowBackward>(op, x.shape(), d, start, length), {&x});
  return y;
}

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors_in, int dim) {
  constexpr const char* op = "cat";
  OpScope op_scope(op);
  CUMULUS_CHECK(!tensors_in.empty(), InvalidArgument, op, ": no tensors to join");
  std::vector<Tensor> tensors;
  for (const Tensor& t : tensors_in) tensors.push_back(detail::contiguous(t));
  const Tensor& first = tensors[0];
  detail::check_floating(op, "tensor 0", first);
  const int d = checked_dim(op, first.shape(), dim);
  int64_t total = 0;
  std::vector<Shape> shapes;
  std::vector<const Tensor*> inputs;
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    const Tensor& t = tensors[k];
    const std::string what = "tensor " + std::to_string(k);
    detail::check_dtype(op, what.c_str(), t, first.dtype());
    detail::check_same_device(op, what.c_str(), t, first);
    CUMULUS_CHECK(t.ndim() == first.ndim() && with_size(t.shape(), d, 0) == with_size(first.shape(), d, 0), ShapeError,
                  op, ": ", what, " ", t.shape().str(), " does not match tensor 0 ", first.shape().str(),
                  " outside dim ", d);
    total += t.size(d);
    shapes.push_back(t.shape());
    inputs.push_back(&t);
  }
  Tensor y = detail::new_output(with_size(first.shape(), d, total), first.dtype(), first.device());
  const Slab out = slab_of(y.shape(), d);
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    copy_slab(t, t.size(d), 0, y, out.dim, offset, out.outer, t.size(d), out.inner, 0.0f);
    offset += t.size(d);
  }
  if (should_record(inputs)) attach_node(y, std::make_shared<CatBackward>(std::move(shapes), d), inputs);
  return y;
}

Tensor narrow(const Tensor& x, int dim, int64_t start, int64_t length) {
  constexpr const char* op = "narrow";
  OpScope op_scope(op);  // any dtype: a view copies nothing (an integer tensor records no node)
  return narrow_as(op, x, checked_dim(op, x.shape(), dim), start, length);
}

namespace {

// x cut into pieces of `sizes` along dim, each narrow's view named `op`.
std::vector<Tensor> pieces_as(const char* op, const Tensor& x, const std::vector<int64_t>& sizes, int dim) {
  OpScope op_scope(op);
  detail::check_floating(op, "input", x);
  const int d = checked_dim(op, x.shape(), dim);
  int64_t total = 0;
  for (int64_t s : sizes) {
    CUMULUS_CHECK(s >= 0, ShapeError, op, ": negative size ", s);
    total += s;
  }
  CUMULUS_CHECK(total == x.size(d), ShapeError, op, ": sizes sum to ", total, " but dim ", d, " of ", x.shape().str(),
                " has ", x.size(d));
  std::vector<Tensor> pieces;
  int64_t start = 0;
  for (int64_t s : sizes) {
    pieces.push_back(narrow_as(op, x, d, start, s));
    start += s;
  }
  return pieces;
}

}  // namespace

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int dim) {
  return pieces_as("split", x, sizes, dim);
}

std::vector<Tensor> split(const Tensor& x, int64_t size, int dim) {
  detail::check_floating("split", "input", x);
  const int d = checked_dim("split", x.shape(), dim);
  CUMULUS_CHECK(size > 0, ShapeError, "split: size must be > 0, got ", size);
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < x.size(d); start += size) sizes.push_back(std::min(size, x.size(d) - start));
  if (sizes.empty()) sizes.push_back(0);  // as PyTorch: one empty piece
  return split(x, sizes, dim);
}

// PyTorch's chunk: pieces of ceil(size / chunks), so there may be fewer than `chunks` (7 in 3:
// 3, 3, 1; 1 in 4: one piece); an empty dimension gives `chunks` empty pieces.
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int dim) {
  constexpr const char* op = "chunk";
  detail::check_floating(op, "input", x);
  const int d = checked_dim(op, x.shape(), dim);
  CUMULUS_CHECK(chunks > 0, ShapeError, op, ": chunks must be > 0, got ", chunks);
  const int64_t n = x.size(d);
  if (n == 0) return pieces_as(op, x, std::vector<int64_t>(static_cast<std::size_t>(chunks), 0), d);
  const int64_t size = (n + chunks - 1) / chunks;
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < n; start += size) sizes.push_back(std::min(size, n - start));
  return pieces_as(op, x, sizes, d);
}

}  // namespace cumulus::ops
