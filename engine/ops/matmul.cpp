// bmm / matmul: c[p] = a[p] b[p] for p in [0, batch), row-major, one strided-batched GEMM.
// matmul takes PyTorch's shapes: 1-D operands are viewed as a row or a column (reshape) and the
// batch dimensions broadcast: a b repeated along every batch dimension is read once (the 2-D b
// case below), an a repeated along every batch dimension is read with a batch stride of 0 (its
// gradient the sum over the batch of the entries' products), any other repeated operand is expanded
// to the full batch first (a copy).
// Backward, each only where its input needs a gradient (a saved only for db, b only for da):
//   da[p] (+)= dc[p] b[p]^T     db[p] (+)= a[p]^T dc[p]
// with the transposes given to the GEMM (no transposed copies) and the sinks' beta as the GEMM's.
// A batched a times a 2-D b is one GEMM over all of a's rows, so db sums over the batch inside it.
// 16-bit a and b: products summed in f32 and c rounded once, on CUDA by cuBLAS itself (f32 compute),
// on the CPU by the f32 GEMM over widened copies (Note [Mixed precision] in engine/ops/linear.cpp).
#include "cumulus/autograd/node.h"
#include "cumulus/ops/linear.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/shape.h"
#include "engine/ops/internal.h"
#include "kernels/cpu/structural_kernels.h"
#if CUMULUS_WITH_CUDA
#include "kernels/cuda/structural_kernels.h"
#endif

namespace cumulus::ops {

namespace {

// The problem, per batch entry: [m, k] x [k, n] -> [m, n]. a_once: a is one [m, k] matrix for every
// entry (matmul's broadcast a), read with a batch stride of 0. trans_a / trans_b: the operand is
// stored transposed (a as [k, m], b as [n, k]: the transpose view of a dense tensor, read through the
// GEMM's flag instead of a copy; never with a_once).
struct Dims {
  int64_t batch, m, k, n;
  bool a_once = false;
  bool trans_a = false, trans_b = false;
};

// c (+)= op(a) op(b) for each of `batch` entries: op(a) [m, k], op(b) [k, n], c [m, n], all
// contiguous per entry; a is stored [k, m] when trans_a, b [n, k] when trans_b. beta 0 overwrites.
// a_once / b_once: that operand is one matrix for every entry (a batch stride of 0).
void batched_gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, float beta,
                  int64_t batch, int64_t m, int64_t n, int64_t k, bool a_once = false, bool b_once = false) {
  const int64_t stride_a = a_once ? 0 : m * k, stride_b = b_once ? 0 : k * n;
  const int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;
  const Device device = c.device();
  if (device.is_cpu()) {
    const Tensor af = detail::converted(a, DType::f32, MemoryCategory::workspace);
    const Tensor bf = detail::converted(b, DType::f32, MemoryCategory::workspace);
    const Tensor cf = detail::f32_stand_in(c, beta);
    const float *ap = af.data<float>(), *bp = bf.data<float>();
    float* cp = cf.data<float>();
    for (int64_t p = 0; p < batch; ++p)
      kernels::gemm_cpu(trans_a, trans_b, m, n, k, 1.0f, ap + p * stride_a, lda, bp + p * stride_b, ldb, beta,
                        cp + p * m * n, n);
    detail::store_stand_in(cf, c);
    return;
  }
#if CUMULUS_WITH_CUDA
  if (k == 0) {  // the empty sum: zeros, or c unchanged
    if (beta == 0.0f)
      CUMULUS_DISPATCH_FLOAT(c.dtype(), T, T* cp = c.data<T>(); CUMULUS_DISPATCH(
                                 device, ctx, (void)cp, kernels::fill_zero_cuda(cp, c.numel(), ctx.stream())));
    return;
  }
  const kernels::GemmTypes types{a.dtype(), c.dtype()};
  CUMULUS_DISPATCH(
      device, ctx, (void)0,
      kernels::gemm_strided_batched_cuda(ctx.cublas(), trans_a, trans_b, m, n, k, 1.0f, a.raw_data(), lda, stride_a,
                                         b.raw_data(), ldb, stride_b, beta, c.raw_data(), n, m * n, batch, types));
#endif
}

// c [m, n] (+)= sum over the batch of op(a_p) op(b_p): the gradient of an operand read once for every
// entry. Each entry's product goes to f32 scratch, summed over the entries in a fixed order
// (sum_rows) into c with its beta, rounded once for a 16-bit c.
void summed_gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, float beta,
                 int64_t batch, int64_t m, int64_t n, int64_t k) {
  const Device device = c.device();
  Tensor entries;
  if (k == 0) {  // the empty sums (no GEMM is run with k = 0)
    MemoryCategoryScope scope(MemoryCategory::workspace);
    entries = Tensor::zeros(Shape{batch, m * n}, DType::f32, device);
  } else {
    entries = detail::f32_scratch(Shape{batch, m * n}, device);
    batched_gemm(a, trans_a, b, trans_b, entries, 0.0f, batch, m, n, k);
  }
  const Tensor out = detail::f32_stand_in(c, beta);
  const float* ep = entries.data<float>();
  float* op = out.data<float>();
  CUMULUS_DISPATCH(device, ctx, kernels::sum_rows_cpu(ep, batch, m * n, beta, op),
                   detail::sum_rows_on_device(ep, batch, m * n, beta, op, device, ctx.stream()));
  detail::store_stand_in(out, c);
}

class MatmulBackward final : public Node {
 public:
  MatmulBackward(const char* name, Tensor a, Tensor b, Shape a_shape, Shape b_shape, Dims dims)
      : Node(name), a_(std::move(a)), b_(std::move(b)), a_shape_(a_shape), b_shape_(b_shape), dims_(dims) {}

  void backward(const Tensor& dc, std::vector<GradSink>& grads) override {
    const Device device = dc.device();
    const auto [batch, m, k, n, a_once, ta, tb] = dims_;
    // Each gradient in its operand's stored layout: da = dc op(b)^T [m, k] (its transpose, op(b) dc^T,
    // when a is stored transposed); db = op(a)^T dc [k, n] (dc^T op(a) when b is).
    if (grads[0].needed()) {
      GradSink::Target da = grads[0].begin(a_shape_, device, dc.dtype());
      if (a_once) {  // summed over the batch
        summed_gemm(dc, false, b_, true, da.tensor, da.beta(), batch, m, k, n);
      } else if (!ta) {
        batched_gemm(dc, false, b_, !tb, da.tensor, da.beta(), batch, m, k, n);
      } else {
        batched_gemm(b_, tb, dc, true, da.tensor, da.beta(), batch, k, m, n);
      }
    }
    if (grads[1].needed()) {
      GradSink::Target db = grads[1].begin(b_shape_, device, dc.dtype());
      if (!tb) {
        batched_gemm(a_, !ta, dc, false, db.tensor, db.beta(), batch, k, n, m, a_once);
      } else {
        batched_gemm(dc, true, a_, ta, db.tensor, db.beta(), batch, n, k, m);
      }
    }
  }
  void release_saved() override {
    a_ = Tensor();
    b_ = Tensor();
  }

 private:
  Tensor a_, b_;  // a for db, b for da (undefined where not needed)
  Shape a_shape_, b_shape_;
  Dims dims_;
};

void check_types(const char* op, const Tensor& a, const Tensor& b) {
  detail::check_floating(op, "a", a);
  detail::check_floating(op, "b", b);
  CUMULUS_CHECK(a.dtype() == b.dtype(), InvalidArgument, op, ": a is ", dtype_name(a.dtype()), " but b is ",
                dtype_name(b.dtype()), " (cast one of them)");
  detail::check_same_device(op, "b", b, a);
}

void check_operands(const char* op, const Tensor& a, const Tensor& b) {
  check_types(op, a, b);
  CUMULUS_CHECK(a.ndim() >= 2 && b.ndim() >= 2, ShapeError, op, ": a and b must have at least 2 dimensions, got ",
                a.shape().str(), " and ", b.shape().str());
  CUMULUS_CHECK(a.size(-1) == b.size(-2), ShapeError, op, ": a ", a.shape().str(), " and b ", b.shape().str(),
                " do not multiply (", a.size(-1), " != ", b.size(-2), ")");
}

Tensor product(const char* op, const Tensor& a, const Tensor& b, const Dims& dims, const Shape& out_shape) {
  Tensor c;
  {
    MemoryCategoryScope scope(detail::output_category());
    c = dims.k == 0 ? Tensor::zeros(out_shape, a.dtype(), a.device()) : Tensor::empty(out_shape, a.dtype(), a.device());
  }
  if (dims.k > 0)
    batched_gemm(a, dims.trans_a, b, dims.trans_b, c, 0.0f, dims.batch, dims.m, dims.n, dims.k, dims.a_once);
  if (should_record({&a, &b})) {
    Tensor saved_a = edge_to(b).needs_grad() ? a.detach() : Tensor();
    Tensor saved_b = edge_to(a).needs_grad() ? b.detach() : Tensor();
    attach_node(c, std::make_shared<MatmulBackward>(op, saved_a, saved_b, a.shape(), b.shape(), dims), {&a, &b});
  }
  return c;
}

}  // namespace

Tensor bmm(const Tensor& a_in, const Tensor& b_in) {
  constexpr const char* op = "bmm";
  OpScope op_scope(op);
  const Tensor a = detail::contiguous(a_in), b = detail::contiguous(b_in);
  check_operands(op, a, b);
  CUMULUS_CHECK(a.ndim() == 3 && b.ndim() == 3 && a.size(0) == b.size(0), ShapeError, op,
                ": a and b must be [B, n, k] and [B, k, m] with the same B, got ", a.shape().str(), " and ",
                b.shape().str());
  const Dims dims{a.size(0), a.size(1), a.size(2), b.size(2)};
  return product(op, a, b, dims, Shape{dims.batch, dims.m, dims.n});
}

namespace {

// The batch shape both operands' batch dimensions broadcast to (numpy's rules, aligned at the last).
Shape broadcast_batch(const Tensor& a, const Tensor& b) {
  const int na = a.ndim() - 2, nb = b.ndim() - 2, n = std::max(na, nb);
  Shape out;
  for (int i = 0; i < n; ++i) {
    const int ia = i - (n - na), ib = i - (n - nb);
    const int64_t da = ia >= 0 ? a.size(ia) : 1, db = ib >= 0 ? b.size(ib) : 1;
    CUMULUS_CHECK(da == db || da == 1 || db == 1, ShapeError, "matmul: the batch dimensions of a ", a.shape().str(),
                  " and b ", b.shape().str(), " do not broadcast (", da, " vs ", db, ")");
    out.push_back(da == 1 ? db : da);
  }
  return out;
}

Shape with_matrix(Shape batch, int64_t rows, int64_t cols) {
  batch.push_back(rows);
  batch.push_back(cols);
  return batch;
}

int64_t batch_count(const Tensor& x) {
  int64_t p = 1;
  for (int d = 0; d < x.ndim() - 2; ++d) p *= x.size(d);
  return p;
}

// x [..., r, c] repeated to [batch..., r, c]: x itself when its batch dimensions already are
// `batch` (leading ones aside), else a dense copy of its expand view, whose backward sums the
// gradient back over the repeated dimensions.
Tensor expanded(const Tensor& x, const Shape& batch) {
  if (batch_count(x) == batch.numel()) return x;
  std::vector<int64_t> sizes;
  for (int d = 0; d < batch.ndim(); ++d) sizes.push_back(batch[d]);
  sizes.push_back(x.size(-2));
  sizes.push_back(x.size(-1));
  return contiguous(expand(x, sizes));
}

// a [..., n, k] x b [..., k, m], both at least 2-D, the batch dimensions broadcast.
Tensor matmul_batched(const char* op, const Tensor& a, const Tensor& b) {
  const int64_t n = a.size(-2), k = a.size(-1), m = b.size(-1);
  const Shape batch = broadcast_batch(a, b);
  const Shape out = with_matrix(batch, n, m);
  if (batch_count(b) == 1 && batch_count(a) == batch.numel()) {
    // b repeated along every batch dimension: one GEMM over every row of a, b read once (a batch
    // stride of 0, without a copy), db summed over the batch inside the GEMM.
    const Tensor b2 = b.ndim() == 2 ? b : reshape(b, Shape{k, m});
    Shape rows_shape;
    int64_t rows = 1;
    for (int d = 0; d < a.ndim() - 1; ++d) {
      rows_shape.push_back(a.size(d));
      rows *= a.size(d);
    }
    rows_shape.push_back(m);
    const Tensor c = product(op, a, b2, Dims{1, rows, k, m}, rows_shape);
    return c.shape() == out ? c : reshape(c, out);
  }
  if (batch_count(a) == 1 && batch_count(b) == batch.numel()) {
    // a repeated along every batch dimension: read once (a batch stride of 0), its gradient summed
    // over the batch.
    const Tensor a2 = a.ndim() == 2 ? a : reshape(a, Shape{n, k});
    Dims dims{batch.numel(), n, k, m};
    dims.a_once = true;
    return product(op, a2, b, dims, out);
  }
  const Tensor ae = expanded(a, batch), be = expanded(b, batch);
  return product(op, ae, be, Dims{batch.numel(), n, k, m}, out);
}

// Whether x is the transpose of its last two dimensions of a dense tensor (k.transpose(-2, -1)).
bool transposed_dense(const Tensor& x) {
  return x.defined() && x.ndim() >= 2 && !x.is_contiguous() && transpose(x.detach(), -2, -1).is_contiguous();
}

// a x b where one operand (or both) is a transposed dense tensor and the batch dimensions are equal:
// the operand's dense tensor read through the GEMM's transpose flag, no copy. Undefined otherwise.
Tensor matmul_of_transposed(const char* op, const Tensor& a_in, const Tensor& b_in) {
  const bool ta = transposed_dense(a_in), tb = transposed_dense(b_in);
  if (!ta && !tb) return Tensor();
  if (a_in.ndim() != b_in.ndim() || a_in.size(-1) != b_in.size(-2)) return Tensor();
  for (int d = 0; d < a_in.ndim() - 2; ++d)
    if (a_in.size(d) != b_in.size(d)) return Tensor();
  check_types(op, a_in, b_in);
  // The stored layouts: transpose views of the views, dense, recorded so each gradient finds its way.
  const Tensor a = ta ? transpose(a_in, -2, -1) : detail::contiguous(a_in);
  const Tensor b = tb ? transpose(b_in, -2, -1) : detail::contiguous(b_in);
  Dims dims{batch_count(a_in), a_in.size(-2), a_in.size(-1), b_in.size(-1)};
  dims.trans_a = ta;
  dims.trans_b = tb;
  return product(op, a, b, dims, with_matrix(broadcast_batch(a_in, b_in), dims.m, dims.n));
}

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  constexpr const char* op = "matmul";
  OpScope op_scope(op);
  if (Tensor c = matmul_of_transposed(op, a_in, b_in); c.defined()) return c;
  const Tensor a = detail::contiguous(a_in), b = detail::contiguous(b_in);
  check_types(op, a, b);
  CUMULUS_CHECK(a.ndim() >= 1 && b.ndim() >= 1, ShapeError, op, ": a and b must have at least 1 dimension, got ",
                a.shape().str(), " and ", b.shape().str());
  // PyTorch's 1-D operands: a row [1, k] on the left, a column [k, 1] on the right, the added
  // dimension removed from the result.
  const bool row = a.ndim() == 1, column = b.ndim() == 1;
  const Tensor a2 = row ? reshape(a, Shape{1, a.size(0)}) : a;
  const Tensor b2 = column ? reshape(b, Shape{b.size(0), 1}) : b;
  CUMULUS_CHECK(a2.size(-1) == b2.size(-2), ShapeError, op, ": a ", a.shape().str(), " and b ", b.shape().str(),
                " do not multiply (", a2.size(-1), " != ", b2.size(-2), ")");
  const Tensor c = matmul_batched(op, a2, b2);
  if (!row && !column) return c;
  Shape out;
  for (int d = 0; d < c.ndim(); ++d)
    if (!(row && d == c.ndim() - 2) && !(column && d == c.ndim() - 1)) out.push_back(c.size(d));
  return reshape(c, out);
}

}  // namespace cumulus::ops
