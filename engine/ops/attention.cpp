// scaled_dot_product_attention: one op and one autograd node for softmax(scale q k^T [causal]) v,
// computed flash-style (Note [Fused attention] in kernels/cpu/attention.cpp). q, k and v are read
// at their own strides when their last dimension is dense (the heads of a qkv projection are
// permuted views: no copy), and saved as they are; the op adds only its output and each query row's
// log-sum-exp (f32) to the activations.
#include <cmath>
#include <vector>

#include "cumulus/autograd/node.h"
#include "cumulus/ops/attention.h"
#include "engine/ops/internal.h"
#include "kernels/attention_rules.h"
#include "kernels/cpu/attention_kernels.h"
#if CUMULUS_WITH_CUDA
#include "kernels/cuda/attention_kernels.h"
#endif

namespace cumulus::ops {

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

template <typename T>
const T* view_data(const Tensor& t) {
  return static_cast<const T*>(detail::element_data(t));
}

// The leading dimensions of q, k, v and the output as kernels::AttentionGeometry's (batch, heads):
// dimensions of size 1 dropped, neighbours merged where all four tensors allow it. False when more
// than two remain (the caller then makes the inputs dense and the output too, which always merges).
bool leading_geometry(const std::vector<const Tensor*>& ts, kernels::AttentionGeometry& g) {
  struct Dim {
    int64_t size, stride[4];
  };
  std::vector<std::vector<int64_t>> strides;
  for (const Tensor* t : ts) strides.push_back(t->strides());
  std::vector<Dim> dims;
  for (int i = 0; i < ts[0]->ndim() - 2; ++i) {
    const auto u = static_cast<std::size_t>(i);
    const int64_t size = ts[0]->size(i);
    if (size == 1) continue;
    bool merges = !dims.empty();
    for (std::size_t t = 0; merges && t < ts.size(); ++t) merges = dims.back().stride[t] == size * strides[t][u];
    if (merges) {
      dims.back().size *= size;
      for (std::size_t t = 0; t < ts.size(); ++t) dims.back().stride[t] = strides[t][u];
      continue;
    }
    Dim dim{size, {}};
    for (std::size_t t = 0; t < ts.size(); ++t) dim.stride[t] = strides[t][u];
    dims.push_back(dim);
  }
  if (dims.size() > 2) return false;
  while (dims.size() < 2) dims.insert(dims.begin(), Dim{1, {0, 0, 0, 0}});
  g.batch = dims[0].size;
  g.heads = dims[1].size;
  int64_t* geometry[4] = {g.q_stride, g.k_stride, g.v_stride, g.o_stride};
  for (std::size_t t = 0; t < ts.size(); ++t) {
    for (std::size_t l = 0; l < 2; ++l) geometry[t][l] = dims[l].stride[t];
    geometry[t][2] = ts[t]->stride(-2);
  }
  return true;
}

// The output of q [..., H, Tq, D]: a 4-D one ([B, H, Tq, D]) laid out as [B, Tq, H, D], as PyTorch's
// CPU and CUDA kernels lay it out, so that the usual transpose(1, 2).reshape(B, Tq, H * D) merging
// the heads is a view, not a copy kept for the output projection's backward; dense otherwise.
Tensor new_attention_output(const Tensor& q) {
  if (q.ndim() != 4) return detail::new_output(q.shape(), q.dtype(), q.device());
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3);
  const Tensor rows = detail::new_output(Shape{b, t, h, d}, q.dtype(), q.device());
  return detail::strided_view(rows, q.shape(), {t * h * d, d, h * d, 1}, 0);
}

// A tensor whose last dimension is dense, as the kernels read it: itself, or its contiguous copy.
Tensor dense_rows(const Tensor& t) { return t.size(-1) <= 1 || t.stride(-1) == 1 ? t : detail::contiguous(t); }

class AttentionBackward final : public Node {
 public:
  AttentionBackward(Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, const kernels::AttentionGeometry& g)
      : Node(kOp),
        q_(std::move(q)),
        k_(std::move(k)),
        v_(std::move(v)),
        out_(std::move(out)),
        lse_(std::move(lse)),
        g_(g) {}

  void backward(const Tensor& dy_in, std::vector<GradSink>& grads) override {
    const Tensor dy = detail::contiguous(dy_in);
    const Device device = dy.device();
    const DType dtype = out_.dtype();
    // Fresh dense gradients handed to the sinks (an inner node's first one takes it without a
    // copy): q, k and v may be one tensor, whose sink must be written once per begin().
    Tensor grad[3];
    const Tensor* inputs[3] = {&q_, &k_, &v_};
    for (int i = 0; i < 3; ++i)
      if (grads[static_cast<std::size_t>(i)].needed()) grad[i] = Tensor::empty(inputs[i]->shape(), dtype, device);
    Tensor delta;
    {
      MemoryCategoryScope scope(MemoryCategory::workspace);
      delta = Tensor::empty(Shape{g_.bh() * g_.tq}, DType::f32, device);
    }
    CUMULUS_DISPATCH_FLOAT(
        dtype, T, const T* qp = view_data<T>(q_); const T* kp = view_data<T>(k_); const T* vp = view_data<T>(v_);
        const T* op = view_data<T>(out_); const T* dyp = dy.data<T>(); const float* lp = lse_.data<float>();
        float* dp = delta.data<float>(); T* dqp = grad[0].defined() ? grad[0].data<T>() : nullptr;
        T* dkp = grad[1].defined() ? grad[1].data<T>() : nullptr;
        T* dvp = grad[2].defined() ? grad[2].data<T>() : nullptr; CUMULUS_DISPATCH(
            device, ctx, kernels::attention_backward_cpu(g_, qp, kp, vp, op, lp, dyp, dp, dqp, dkp, dvp),
            kernels::attention_backward_cuda(g_, qp, kp, vp, op, lp, dyp, dp, dqp, dkp, dvp, ctx.stream())));
    for (int i = 0; i < 3; ++i)
      if (grad[i].defined()) grads[static_cast<std::size_t>(i)].give(grad[i]);
  }
  void release_saved() override {
    q_ = Tensor();
    k_ = Tensor();
    v_ = Tensor();
    out_ = Tensor();
    lse_ = Tensor();
  }

 private:
  Tensor q_, k_, v_, out_, lse_;
  kernels::AttentionGeometry g_;
};

void check_input(const char* what, const Tensor& t) {
  detail::check_floating(kOp, what, t);
  CUMULUS_CHECK(t.ndim() >= 2, ShapeError, kOp, ": ", what, " must be [..., T, D], got ", t.shape().str());
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, bool causal,
                                    std::optional<double> scale) {
  OpScope op_scope(kOp);
  check_input("q", q_in);
  check_input("k", k_in);
  check_input("v", v_in);
  const std::string shapes = "q " + q_in.shape().str() + ", k " + k_in.shape().str() + ", v " + v_in.shape().str();
  CUMULUS_CHECK(q_in.dtype() == k_in.dtype() && q_in.dtype() == v_in.dtype(), InvalidArgument, kOp,
                ": q, k and v must have one dtype, got ", dtype_name(q_in.dtype()), ", ", dtype_name(k_in.dtype()),
                " and ", dtype_name(v_in.dtype()));
  detail::check_same_device(kOp, "k", k_in, q_in);
  detail::check_same_device(kOp, "v", v_in, q_in);
  const int n = q_in.ndim();
  bool same_leading = k_in.ndim() == n && v_in.ndim() == n;
  for (int i = 0; same_leading && i < n - 2; ++i)
    same_leading = k_in.size(i) == q_in.size(i) && v_in.size(i) == q_in.size(i);
  CUMULUS_CHECK(same_leading, ShapeError, kOp, ": q, k and v must have the same leading dimensions, got ", shapes);
  const int64_t tq = q_in.size(-2), tk = k_in.size(-2), d = q_in.size(-1);
  CUMULUS_CHECK(k_in.size(-1) == d && v_in.size(-1) == d && v_in.size(-2) == tk, ShapeError, kOp,
                ": expected q [..., Tq, D], k and v [..., Tk, D], got ", shapes);
  CUMULUS_CHECK(tk >= 1, ShapeError, kOp, ": k and v need at least one position, got ", shapes);
  CUMULUS_CHECK(!causal || tq == tk, ShapeError, kOp, ": causal attention needs Tq == Tk (got ", shapes,
                "); a decoding step against a cache is causal = false");
  CUMULUS_CHECK(!scale || std::isfinite(*scale), InvalidArgument, kOp, ": scale must be finite, got ", *scale);
#if CUMULUS_WITH_CUDA
  CUMULUS_CHECK(!q_in.device().is_cuda() || d <= kernels::kAttentionMaxHeadDimCuda, ShapeError, kOp,
                ": on CUDA D is at most ", kernels::kAttentionMaxHeadDimCuda, ", got ", shapes);
#endif

  Tensor q = dense_rows(q_in), k = dense_rows(k_in), v = dense_rows(v_in);
  Tensor out = new_attention_output(q);
  kernels::AttentionGeometry g;
  if (!leading_geometry({&q, &k, &v, &out}, g)) {
    q = detail::contiguous(q);
    k = detail::contiguous(k);
    v = detail::contiguous(v);
    out = detail::new_output(q.shape(), q.dtype(), q.device());
    leading_geometry({&q, &k, &v, &out}, g);
  }
  g.tq = tq;
  g.tk = tk;
  g.d = d;
  g.causal = causal;
  g.scale = static_cast<float>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(d)));

  const Device device = q.device();
  Shape lse_shape;
  for (int i = 0; i < n - 1; ++i) lse_shape.push_back(q.size(i));
  Tensor lse = detail::new_output(lse_shape, DType::f32, device);
  CUMULUS_DISPATCH_FLOAT(q.dtype(), T, const T* qp = view_data<T>(q); const T* kp = view_data<T>(k);
                         const T* vp = view_data<T>(v); T* op = static_cast<T*>(detail::element_data(out));
                         float* lp = lse.data<float>();
                         CUMULUS_DISPATCH(device, ctx, kernels::attention_forward_cpu(g, qp, kp, vp, op, lp),
                                          kernels::attention_forward_cuda(g, qp, kp, vp, op, lp, ctx.stream())));
  if (should_record({&q, &k, &v}))
    attach_node(out, std::make_shared<AttentionBackward>(q.detach(), k.detach(), v.detach(), out.detach(), lse, g),
                {&q, &k, &v});
  return out;
}

}  // namespace cumulus::ops
