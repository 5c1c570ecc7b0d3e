// Reductions over dimensions (cumulus/ops/reduce.h): sum / mean / amax / amin over a set of
// dimensions (Note [Reduce geometry] in kernels/reduce_dims_rules.h), the selections along one dimension (max, min,
// argmax, argmin, topk: Note [Selection order]) and multinomial sampling. The selections save their
// indices, so the backward scatters dy without the input; sum and mean save nothing; amax and amin
// save their input and result.
#include <cmath>
#include <string>

#include "cumulus/autograd/node.h"
#include "cumulus/ops/reduce.h"
#include "engine/ops/internal.h"
#include "kernels/cpu/reduce_dims_kernels.h"
#if CUMULUS_WITH_CUDA
#include "kernels/cuda/reduce_dims_kernels.h"
#endif

// CUMULUS_DISPATCH_REDUCE(device, launcher, args...): kernels::launcher_cpu(args...) on the CPU,
// kernels::launcher_cuda(args..., stream) on CUDA.
#define CUMULUS_DISPATCH_REDUCE(device, launcher, ...)                           \
  CUMULUS_DISPATCH(device, ctx, ::cumulus::kernels::launcher##_cpu(__VA_ARGS__), \
                   ::cumulus::kernels::launcher##_cuda(__VA_ARGS__, ctx.stream()))

namespace cumulus::ops {

namespace {

using kernels::ReduceGeometry;
static_assert(Shape::kMaxDims <= kernels::kReduceMaxDims, "a geometry holds every dimension of a shape");

// Dimension `dim` of an ndim tensor in [0, ndim); a 0-d tensor takes 0 and -1 (as torch) and gives 0.
int normalize_dim(const char* op, int64_t dim, int ndim) {
  const int64_t n = ndim == 0 ? 1 : ndim;
  CUMULUS_CHECK(dim >= -n && dim < n, InvalidArgument, op, ": dim ", dim, " is out of range for a tensor of ", ndim,
                " dimensions (expected [", -n, ", ", n - 1, "])");
  return static_cast<int>(dim < 0 ? dim + n : dim);
}

// Which dimensions `dims` reduces (empty: all).
std::vector<bool> reduced_dims(const char* op, const Shape& shape, const std::vector<int64_t>& dims) {
  std::vector<bool> mask(static_cast<std::size_t>(shape.ndim()), dims.empty());
  std::vector<bool> seen(static_cast<std::size_t>(std::max(shape.ndim(), 1)), false);
  for (int64_t dim : dims) {
    const int d = normalize_dim(op, dim, shape.ndim());
    CUMULUS_CHECK(!seen[d], InvalidArgument, op, ": dim ", dim, " appears more than once in dims");
    seen[d] = true;
    if (d < shape.ndim()) mask[d] = true;
  }
  return mask;
}

// The geometry of Note [Reduce geometry] for a dense row-major tensor: dimensions of size 1 dropped,
// neighbours of the same kind merged.
ReduceGeometry geometry_of(const Shape& shape, const std::vector<bool>& reduced) {
  ReduceGeometry g;
  int64_t stride = 1;
  int64_t strides[kernels::kReduceMaxDims];
  for (int d = shape.ndim() - 1; d >= 0; --d) {
    strides[d] = stride;
    stride *= shape[d];
  }
  int last_kind = -1;  // the kind of the last dimension kept in g: 0 kept, 1 reduced
  for (int d = 0; d < shape.ndim(); ++d) {
    const int kind = reduced[d] ? 1 : 0;
    (kind ? g.terms : g.outputs) *= shape[d];
    if (shape[d] == 1) continue;
    int& n = kind ? g.reduced_ndim : g.kept_ndim;
    int64_t* size = kind ? g.reduced_size : g.kept_size;
    int64_t* str = kind ? g.reduced_stride : g.kept_stride;
    if (last_kind == kind) {
      size[n - 1] *= shape[d];
      str[n - 1] = strides[d];
    } else {
      size[n] = shape[d];
      str[n] = strides[d];
      ++n;
    }
    last_kind = kind;
  }
  return g;
}

Shape reduced_shape(const Shape& shape, const std::vector<bool>& reduced, bool keepdim) {
  Shape out;
  for (int d = 0; d < shape.ndim(); ++d)
    if (!reduced[d]) out.push_back(shape[d]);
    else if (keepdim) out.push_back(1);
  return out;
}

class SumDimsBackward final : public Node {
 public:
  SumDimsBackward(const char* name, const ReduceGeometry& g, Shape input_shape, float scale, bool mean)
      : Node(name), g_(g), input_shape_(input_shape), scale_(scale) {
    // Over every element: a loss's sum or mean, as ops::sum(x) (Note [Mean-reduced losses]).
    if (g.terms == 1) set_output_reduction(OutputReduction::none);
    else if (g.outputs == 1) set_output_reduction(mean ? OutputReduction::mean : OutputReduction::sum);
  }
  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    if (!grads[0].needed()) return;
    GradSink::Target dx = grads[0].begin(input_shape_, dy.device(), dy.dtype());
    CUMULUS_DISPATCH_FLOAT(dy.dtype(), T,
                           CUMULUS_DISPATCH_REDUCE(dy.device(), sum_dims_backward, g_, dy.data<T>(), scale_, dx.beta(),
                                                   dx.tensor.data<T>()));
  }

 private:
  ReduceGeometry g_;
  Shape input_shape_;
  float scale_;
};

Tensor reduce_dims(const char* op, const Tensor& input, const std::vector<int64_t>& dims, bool keepdim, bool mean) {
  OpScope op_scope(op);
  detail::check_floating(op, "input", input);
  const Tensor x = detail::contiguous(input);
  const std::vector<bool> reduced = reduced_dims(op, x.shape(), dims);
  const ReduceGeometry g = geometry_of(x.shape(), reduced);
  Tensor y = detail::new_output(reduced_shape(x.shape(), reduced, keepdim), x.dtype(), x.device());
  const int64_t divisor = mean ? g.terms : 1;
  CUMULUS_DISPATCH_FLOAT(x.dtype(), T,
                         CUMULUS_DISPATCH_REDUCE(x.device(), sum_dims, g, x.data<T>(), divisor, y.data<T>()));
  if (should_record({&x})) {
    const float scale = mean ? static_cast<float>(1.0 / static_cast<double>(g.terms)) : 1.0f;
    attach_node(y, std::make_shared<SumDimsBackward>(op, g, x.shape(), scale, mean), {&x});
  }
  return y;
}

// amax / amin: saves the input and the result (the gradient goes to the terms equal to it).
class ExtremeBackward final : public Node {
 public:
  ExtremeBackward(const char* name, const ReduceGeometry& g, Tensor x, Tensor y)
      : Node(name), g_(g), x_(std::move(x)), y_(std::move(y)) {}
  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    if (!grads[0].needed()) return;
    GradSink::Target dx = grads[0].begin(x_.shape(), dy.device(), dy.dtype());
    CUMULUS_DISPATCH_FLOAT(dy.dtype(), T,
                           CUMULUS_DISPATCH_REDUCE(dy.device(), extreme_dims_backward, g_, x_.data<T>(), y_.data<T>(),
                                                   dy.data<T>(), dx.beta(), dx.tensor.data<T>()));
  }
  void release_saved() override {
    x_ = Tensor();
    y_ = Tensor();
  }

 private:
  ReduceGeometry g_;
  Tensor x_, y_;
};

Tensor extreme_dims(const char* op, const Tensor& input, const std::vector<int64_t>& dims, bool keepdim, bool largest) {
  OpScope op_scope(op);
  detail::check_floating(op, "input", input);
  const Tensor x = detail::contiguous(input);
  const std::vector<bool> reduced = reduced_dims(op, x.shape(), dims);
  const ReduceGeometry g = geometry_of(x.shape(), reduced);
  CUMULUS_CHECK(g.terms > 0, InvalidArgument, op, ": cannot reduce over no elements (a reduced dimension of ",
                x.shape().str(), " has size 0)");
  Tensor y = detail::new_output(reduced_shape(x.shape(), reduced, keepdim), x.dtype(), x.device());
  CUMULUS_DISPATCH_FLOAT(x.dtype(), T,
                         CUMULUS_DISPATCH_REDUCE(x.device(), extreme_dims, g, x.data<T>(), largest, y.data<T>()));
  if (should_record({&x})) attach_node(y, std::make_shared<ExtremeBackward>(op, g, x.detach(), y.detach()), {&x});
  return y;
}

// A tensor seen along one dimension (a 0-d tensor as [1, 1, 1]), and the shape of a selection of k
// along it: size k there, or the dimension removed (k 1 without keepdim).
struct Along {
  detail::Slab slab;
  Shape out_shape;
};
Along along(const char* op, const Shape& shape, int64_t dim, int64_t k, bool keep) {
  const int d = normalize_dim(op, dim, shape.ndim());
  Along a;
  if (shape.ndim() == 0) {
    if (k != 1) a.out_shape = Shape{k};  // topk(x, 0) of a 0-d x: [0], as torch
    return a;
  }
  a.slab = detail::slab_of(shape, d);
  for (int i = 0; i < shape.ndim(); ++i)
    if (i != d) a.out_shape.push_back(shape[i]);
    else if (keep) a.out_shape.push_back(k);
  return a;
}

class SelectBackward final : public Node {
 public:
  SelectBackward(const char* name, Tensor indices, detail::Slab slab, int64_t k, Shape input_shape)
      : Node(name), indices_(std::move(indices)), slab_(slab), k_(k), input_shape_(input_shape) {}
  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    if (!grads[0].needed()) return;
    GradSink::Target dx = grads[0].begin(input_shape_, dy.device(), dy.dtype());
    CUMULUS_DISPATCH_FLOAT(
        dy.dtype(), T,
        CUMULUS_DISPATCH_REDUCE(dy.device(), scatter_along_dim, dy.data<T>(), indices_.data<int64_t>(), slab_.outer,
                                slab_.dim, slab_.inner, k_, dx.beta(), dx.tensor.data<T>()));
  }
  void release_saved() override { indices_ = Tensor(); }

 private:
  Tensor indices_;
  detail::Slab slab_;
  int64_t k_;
  Shape input_shape_;
};

// The k first-ranking elements along dim (Note [Selection order]); values only when wanted.
ValuesAndIndices select(const char* op, const Tensor& input, int64_t dim, int64_t k, bool keep, bool largest,
                        bool nan_first, bool want_values) {
  detail::check_floating(op, "input", input);
  const Tensor x = detail::contiguous(input);
  const Along a = along(op, x.shape(), dim, k, keep);
  ValuesAndIndices out;
  out.indices = detail::new_output(a.out_shape, DType::i64, x.device());
  if (want_values) out.values = detail::new_output(a.out_shape, x.dtype(), x.device());
  const detail::Slab s = a.slab;
  CUMULUS_DISPATCH_FLOAT(
      x.dtype(), T,
      CUMULUS_DISPATCH_REDUCE(x.device(), select_along_dim, x.data<T>(), s.outer, s.dim, s.inner, k, largest, nan_first,
                              want_values ? out.values.data<T>() : nullptr, out.indices.data<int64_t>()));
  if (want_values && should_record({&x}))
    attach_node(out.values, std::make_shared<SelectBackward>(op, out.indices, s, k, x.shape()), {&x});
  return out;
}

// max / min / argmax / argmin: one element along a dimension that must not be empty.
ValuesAndIndices select_one(const char* op, const Tensor& x, int64_t dim, bool keepdim, bool largest, bool values) {
  OpScope op_scope(op);
  detail::check_floating(op, "input", x);
  const int d = normalize_dim(op, dim, x.ndim());
  CUMULUS_CHECK(x.ndim() == 0 || x.size(d) > 0, InvalidArgument, op, ": cannot reduce dimension ", dim,
                " of size 0 (input ", x.shape().str(), ")");
  return select(op, x, dim, 1, keepdim, largest, /*nan_first=*/true, values);
}

// multinomial's argument checks, on the host: every weight finite and non-negative, each row's sum
// above 0 and, without replacement, at least `samples` positive weights.
void check_weights(const Tensor& probs, int64_t rows, int64_t n, int64_t samples, bool replacement) {
  const std::vector<float> w = probs.to(Device::cpu()).to(DType::f32).to_vector<float>();
  for (int64_t r = 0; r < rows; ++r) {
    double total = 0;
    int64_t positive = 0;
    for (int64_t c = 0; c < n; ++c) {
      const float v = w[static_cast<std::size_t>(r * n + c)];
      CUMULUS_CHECK(std::isfinite(v) && v >= 0, InvalidArgument,
                    "multinomial: probs must be finite and non-negative, got ", v, " in row ", r, " at ", c);
      total += v;
      positive += v > 0;
    }
    CUMULUS_CHECK(total > 0, InvalidArgument, "multinomial: row ", r, " of probs sums to 0");
    CUMULUS_CHECK(replacement || positive >= samples, InvalidArgument, "multinomial: row ", r, " has ", positive,
                  " positive weights, too few to draw ", samples, " samples without replacement");
  }
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce_dims("sum", x, dims, keepdim, false);
}
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce_dims("mean", x, dims, keepdim, true);
}

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extreme_dims("amax", x, dims, keepdim, true);
}
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extreme_dims("amin", x, dims, keepdim, false);
}

ValuesAndIndices max(const Tensor& x, int64_t dim, bool keepdim) {
  return select_one("max", x, dim, keepdim, true, true);
}
ValuesAndIndices min(const Tensor& x, int64_t dim, bool keepdim) {
  return select_one("min", x, dim, keepdim, false, true);
}
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  return select_one("argmax", x, dim, keepdim, true, false).indices;
}
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim) {
  return select_one("argmin", x, dim, keepdim, false, false).indices;
}

ValuesAndIndices topk(const Tensor& x, int64_t k, int64_t dim, bool largest, bool /*sorted*/) {
  OpScope op_scope("topk");
  detail::check_floating("topk", "input", x);
  const int d = normalize_dim("topk", dim, x.ndim());
  const int64_t size = x.ndim() == 0 ? 1 : x.size(d);
  CUMULUS_CHECK(k >= 0 && k <= size, InvalidArgument, "topk: k ", k, " is out of range for dimension ", dim,
                " of size ", size);
  return select("topk", x, dim, k, true, largest, /*nan_first=*/largest, true);
}

Tensor multinomial(const Tensor& input, int64_t num_samples, bool replacement, uint64_t seed) {
  OpScope op_scope("multinomial");
  detail::check_floating("multinomial", "probs", input);
  const Tensor probs = detail::contiguous(input);
  CUMULUS_CHECK(probs.ndim() == 1 || probs.ndim() == 2, InvalidArgument,
                "multinomial: probs must be [n] or [rows, n], got ", probs.shape().str());
  const int64_t n = probs.size(-1), rows = probs.ndim() == 2 ? probs.size(0) : 1;
  CUMULUS_CHECK(num_samples > 0, InvalidArgument, "multinomial: num_samples must be positive, got ", num_samples);
  CUMULUS_CHECK(replacement || num_samples <= n, InvalidArgument, "multinomial: cannot draw ", num_samples,
                " samples from ", n, " categories without replacement");
  check_weights(probs, rows, n, num_samples, replacement);
  const Shape shape = probs.ndim() == 2 ? Shape{rows, num_samples} : Shape{num_samples};
  Tensor out = detail::new_output(shape, DType::i64, probs.device());
  CUMULUS_DISPATCH_FLOAT(probs.dtype(), T,
                         CUMULUS_DISPATCH_REDUCE(probs.device(), multinomial, probs.data<T>(), rows, n, num_samples,
                                                 replacement, seed, out.data<int64_t>()));
  return out;
}

double multinomial_uniform(uint64_t seed, int64_t row, int64_t sample) {
  return kernels::multinomial_uniform(seed, row, sample);
}

}  // namespace cumulus::ops
