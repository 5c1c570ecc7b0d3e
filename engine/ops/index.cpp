// index_select and embedding: gathers along a dimension (x seen as [outer, size(dim), inner]) whose
// backward scatter-adds the gradient: dx[o, d, i] = sum over j with indices[j] == d of dy[o, j, i].
// Repeated indices add up. The sum for each d runs in the order of j, from beta * dx, in f32, and is
// rounded once: the same order on the CPU and CUDA (no atomics), so the two give the same bits. The
// sink's beta 0 zeros the rows no index names; an embedding's weight gradient is the weight's
// persistent f32 buffer, written in place (Note [Gradient sinks]).
// Indices are i32 or i64 (converted to i32: engine/ops/indices.h) on x's device. The CPU rejects
// one outside [0, size(dim)) before any work; CUDA cannot without synchronizing, so there it gives
// NaN rows and no gradient (ops/shape.h).
#include <string>

#include "cumulus/autograd/node.h"
#include "cumulus/ops/shape.h"
#include "engine/ops/indices.h"
#include "engine/ops/internal.h"
#include "kernels/cpu/structural_kernels.h"
#if CUMULUS_WITH_CUDA
#include "kernels/cuda/structural_kernels.h"
#endif

namespace cumulus::ops {

namespace {

using Gather = detail::Slab;  // x along the gathered dimension: [outer, dim, inner]
using detail::slab_of;

// indices: i32 (as_i32_indices'), on any device.
void check_indices(const char* op, const Tensor& indices, const Tensor& x, int64_t dim) {
  detail::check_same_device(op, "indices", indices, x);
  if (!indices.device().is_cpu()) return;  // documented: NaN rows on CUDA
  const int32_t* ip = indices.data<int32_t>();
  const int64_t bad = kernels::first_index_out_of_range_cpu(ip, indices.numel(), dim);
  CUMULUS_CHECK(bad < 0, InvalidArgument, op, ": index ", bad >= 0 ? ip[bad] : 0, " at position ", bad,
                " is outside [0, ", dim, ")");
}

void gather(const Tensor& x, const Gather& g, const Tensor& indices, const Tensor& y) {
  const Device device = x.device();
  const int32_t* ip = indices.data<int32_t>();
  const int64_t count = indices.numel();
  CUMULUS_DISPATCH_FLOAT(x.dtype(), T, const T* xp = x.data<T>(); T* yp = y.data<T>(); CUMULUS_DISPATCH(
                             device, ctx, kernels::index_gather_cpu(xp, g.outer, g.dim, ip, count, g.inner, yp),
                             kernels::index_gather_cuda(xp, g.outer, g.dim, ip, count, g.inner, yp, ctx.stream())));
}

#if CUMULUS_WITH_CUDA
// index_scatter_add_cuda with its scratch, the positions sorted by index, and the partial sums of
// long runs' segments (Note [Sorted scatter-add] in kernels/cuda/structural.cu), in category
// workspace and freed on return.
template <typename T>
void scatter_add_on_device(const T* dy, const Gather& g, int64_t count, const int32_t* indices, float beta, T* dx,
                           Device device, cudaStream_t stream) {
  Tensor keys, partials;
  {
    MemoryCategoryScope scope(MemoryCategory::workspace);
    keys = Tensor::empty(Shape{kernels::index_scatter_add_scratch(count)}, DType::i64, device);
    partials = Tensor::empty(Shape{kernels::index_scatter_add_partials(count, g.outer, g.inner)}, DType::f32, device);
  }
  auto* scratch = static_cast<uint64_t*>(keys.raw_data());
  auto* sums = static_cast<float*>(partials.raw_data());
  kernels::index_scatter_add_cuda(dy, g.outer, count, indices, g.dim, g.inner, beta, dx, scratch, sums, stream);
}
#endif

void scatter_add(const Tensor& dy, const Gather& g, const Tensor& indices, const GradSink::Target& dx) {
  const Device device = dy.device();
  const int32_t* ip = indices.data<int32_t>();
  const int64_t count = indices.numel();
  const float beta = dx.beta();
  CUMULUS_DISPATCH_FLOAT(
      dy.dtype(), T, const T* dyp = dy.data<T>(); T* dxp = dx.tensor.data<T>();
      CUMULUS_DISPATCH(device, ctx, kernels::index_scatter_add_cpu(dyp, g.outer, count, ip, g.dim, g.inner, beta, dxp),
                       scatter_add_on_device(dyp, g, count, ip, beta, dxp, device, ctx.stream())));
}

class IndexBackward final : public Node {
 public:
  // input: which of the op's inputs is the data (index_select's 0, embedding's 1); an embedding's
  // weight gradient is f32 (its buffer's type) whatever the output's type.
  IndexBackward(const char* name, Tensor indices, Shape x_shape, int d, std::size_t input, bool f32_grad)
      : Node(name), indices_(std::move(indices)), x_shape_(x_shape), d_(d), input_(input), f32_grad_(f32_grad) {}

  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    const std::size_t input = input_;
    if (!grads[input].needed()) return;
    const DType dtype = f32_grad_ ? DType::f32 : dy.dtype();
    const Tensor g = dy.dtype() == dtype ? dy : detail::converted(dy, dtype, MemoryCategory::workspace);
    GradSink::Target dx = grads[input].begin(x_shape_, dy.device(), dtype);
    scatter_add(g, slab_of(x_shape_, d_), indices_, dx);
  }
  void release_saved() override { indices_ = Tensor(); }

 private:
  Tensor indices_;
  Shape x_shape_;
  int d_;
  std::size_t input_;
  bool f32_grad_;
};

}  // namespace

Tensor index_select(const Tensor& x_in, int dim, const Tensor& indices_in) {
  constexpr const char* op = "index_select";
  OpScope op_scope(op);
  const Tensor x = detail::contiguous(x_in);
  detail::check_floating(op, "input", x);
  const int nd = x.ndim(), d = dim < 0 ? dim + nd : dim;
  CUMULUS_CHECK(d >= 0 && d < nd, ShapeError, op, ": dim ", dim, " out of range for ", x.shape().str());
  CUMULUS_CHECK(indices_in.defined() && indices_in.ndim() == 1, ShapeError, op, ": indices must be 1-D, got ",
                indices_in.defined() ? indices_in.shape().str() : std::string("undefined"));
  const Tensor indices = detail::as_i32_indices(op, "indices", detail::contiguous(indices_in));
  check_indices(op, indices, x, x.size(d));
  Shape shape;
  for (int i = 0; i < nd; ++i) shape.push_back(i == d ? indices.size(0) : x.size(i));
  Tensor y = detail::new_output(shape, x.dtype(), x.device());
  gather(x, slab_of(x.shape(), d), indices, y);
  if (should_record({&x}))
    attach_node(y, std::make_shared<IndexBackward>(op, indices.detach(), x.shape(), d, 0, false), {&x});
  return y;
}

Tensor embedding(const Tensor& indices_in, const Tensor& weight_in, DType dtype) {
  constexpr const char* op = "embedding";
  OpScope op_scope(op);
  const Tensor weight = detail::contiguous(weight_in);
  detail::check_dtype(op, "weight", weight, DType::f32);
  CUMULUS_CHECK(weight.ndim() == 2, ShapeError, op, ": weight must be [num, dim], got ", weight.shape().str());
  CUMULUS_CHECK(is_floating(dtype), InvalidArgument, op, ": the output type must be f32, bf16 or f16, not ",
                dtype_name(dtype));
  CUMULUS_CHECK(indices_in.defined() && indices_in.ndim() < Shape::kMaxDims, ShapeError, op,
                ": indices must have at most ", Shape::kMaxDims - 1, " dimensions, got ",
                indices_in.defined() ? indices_in.shape().str() : "undefined");
  const Tensor indices = detail::as_i32_indices(op, "indices", detail::contiguous(indices_in));
  check_indices(op, indices, weight, weight.size(0));
  Shape shape = indices.shape();
  shape.push_back(weight.size(1));
  Tensor y = detail::new_output(shape, dtype, weight.device());
  const Tensor flat = indices.detach().reshape(Shape{indices.numel()});
  if (dtype == DType::f32) {
    gather(weight, slab_of(weight.shape(), 0), flat, y);
  } else {  // the f32 rows, rounded once
    const Tensor rows = detail::f32_scratch(shape, weight.device());
    gather(weight, slab_of(weight.shape(), 0), flat, rows);
    detail::convert_into(rows, y);
  }
  if (should_record({&indices, &weight}))
    attach_node(y, std::make_shared<IndexBackward>(op, flat, weight.shape(), 0, 1, true), {&indices, &weight});
  return y;
}

}  // namespace cumulus::ops
