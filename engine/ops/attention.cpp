// scaled_dot_product_attention: one op and one autograd node for softmax(scale q k^T [causal]) v,
// computed flash-style (Note [Fused attention] in kernels/cpu/attention.cpp). q, k and v are read
// at their own strides when their last dimension is dense (the heads of a qkv projection are
// permuted views: no copy), and saved as they are; the op adds only its output and each query row's
// log-sum-exp (f32) to the activations. On CUDA, bf16 and f16 run cuDNN's fused attention where the
// build has it and the choice is cudnn (Note [cuDNN attention] in kernels/cuda/cudnn_attention.cpp),
// our kernels otherwise and for what cuDNN does not take; the backward follows its forward.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <vector>

#include "cumulus/autograd/node.h"
#include "cumulus/ops/attention.h"
#include "engine/core/opt_in.h"
#include "engine/ops/attention_internal.h"
#include "engine/ops/internal.h"
#include "kernels/attention_rules.h"
#include "kernels/cpu/attention_kernels.h"
#include "kernels/cuda/cudnn_sdpa_plan.h"
#if CUMULUS_WITH_CUDA
#include "kernels/cuda/attention_kernels.h"
#endif
#if CUMULUS_WITH_CUDNN_FRONTEND
#include "engine/core/cudnn_context.h"
#include "kernels/cuda/cudnn_attention.h"
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

// A tensor whose last dimension is dense, as the kernels read it: itself, or its contiguous copy.
Tensor dense_rows(const Tensor& t) { return t.size(-1) <= 1 || t.stride(-1) == 1 ? t : detail::contiguous(t); }

std::atomic<int64_t> cudnn_calls{0}, own_calls{0};
std::atomic<int> chosen{-1};  // set_cuda_attention's choice; -1: none

CudaAttention choice_from_environment() {
  // cuDNN's by default where the build has it (measured on an H200: bench/results/2026-11-29-h200);
  // CUMULUS_CUDA_ATTENTION=own asks for ours.
  const int asked = cumulus::detail::environment_choice("CUMULUS_CUDA_ATTENTION", {"own", "cudnn"});
  if (asked == 0) return CudaAttention::own;
  if (cudnn_attention_compiled()) return CudaAttention::cudnn;
  if (asked == 1)
    std::fprintf(stderr, "cumulus: CUMULUS_CUDA_ATTENTION=cudnn: this build has no cuDNN attention; ours runs\n");
  return CudaAttention::own;
}

#if CUMULUS_WITH_CUDA
// Our own CUDA kernels: attention.cu's row kernels (run on an H200), or under
// CUMULUS_CUDA_ATTENTION_KERNELS=tiled the register-tiled ones (attention_tiled.cu), which no GPU
// has run yet: opt-in until one measures them.
bool tiled_kernels_asked() {
  static const bool tiled =
      cumulus::detail::environment_choice("CUMULUS_CUDA_ATTENTION_KERNELS", {"rows", "tiled"}) == 1;
  return tiled;
}

template <typename T>
void own_forward_cuda(const kernels::AttentionGeometry& g, const T* q, const T* k, const T* v, T* out, float* lse,
                      cudaStream_t stream) {
  if (tiled_kernels_asked()) kernels::attention_forward_tiled_cuda(g, q, k, v, out, lse, stream);
  else kernels::attention_forward_cuda(g, q, k, v, out, lse, stream);
}

template <typename T>
void own_backward_cuda(const kernels::AttentionGeometry& g, const T* q, const T* k, const T* v, const T* out,
                       const float* lse, const T* dout, float* delta, T* dq, T* dk, T* dv, cudaStream_t stream) {
  if (tiled_kernels_asked())
    kernels::attention_backward_tiled_cuda(g, q, k, v, out, lse, dout, delta, dq, dk, dv, stream);
  else kernels::attention_backward_cuda(g, q, k, v, out, lse, dout, delta, dq, dk, dv, stream);
}
#endif

// Whether cuDNN is asked to run attention of this geometry: 16-bit on CUDA under the choice cudnn,
// a geometry it takes (cudnn_sdpa::unsupported_reason) and 16-byte aligned pointers.
bool cudnn_takes(const kernels::AttentionGeometry& g, const Tensor& q, std::initializer_list<const void*> pointers) {
  if (!cudnn_attention_compiled() || !q.device().is_cuda() || cuda_attention() != CudaAttention::cudnn) return false;
  if (!kernels::cudnn_sdpa::unsupported_reason(g, q.dtype()).empty()) return false;
  for (const void* p : pointers)
    if (!kernels::cudnn_sdpa::aligned16(p)) return false;
  return true;
}

#if CUMULUS_WITH_CUDNN_FRONTEND
// What cuDNN's attention takes of the engine: the device's handle, the process's graphs and
// workspace from the caching allocator (category workspace).
kernels::CudnnSdpa cudnn_sdpa(const Device& device) {
  return kernels::CudnnSdpa{cudnn::handle(device.index()), device.index(), cudnn::attention_graphs(),
                            detail::workspace_source(device), cuda::context(device.index()).capturing()};
}
#endif

// The forward through cuDNN; false (nothing written) where it is not asked or declines.
bool forward_cudnn(const kernels::AttentionGeometry& g, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& out, const Tensor& lse) {
  const void *qp = detail::element_data(q), *kp = detail::element_data(k), *vp = detail::element_data(v);
  void* op = detail::element_data(out);
  if (!cudnn_takes(g, q, {qp, kp, vp, op, lse.raw_data()})) return false;
#if CUMULUS_WITH_CUDNN_FRONTEND
  cuda::DeviceGuard guard(q.device().index());
  return kernels::sdpa_forward_cudnn(cudnn_sdpa(q.device()), g, q.dtype(), qp, kp, vp, op, lse.data<float>());
#else
  return false;
#endif
}

// Where the backward writes dq, dk and dv: separate tensors ([.., T, D], dense; a gradient no input
// needs is not written, except on cuDNN's path, which writes all three: scratch in category
// workspace), or one gradient of the packed projection [B, T, 3C] at q's, k's and v's places.
struct GradientTargets {
  Tensor tensors[3];
  void* data[3] = {nullptr, nullptr, nullptr};
};

// The backward through cuDNN; false (nothing written) where it is not asked or declines.
bool backward_cudnn(const kernels::AttentionGeometry& g, const Tensor* saved, const Tensor& dy,
                    const GradientTargets& t) {
  if (!cudnn_takes(g, dy, {})) return false;
  const void* pointers[6] = {detail::element_data(saved[0]), detail::element_data(saved[1]),
                             detail::element_data(saved[2]), detail::element_data(saved[3]),
                             detail::element_data(dy),       saved[4].raw_data()};
  if (!cudnn_takes(g, dy,
                   {pointers[0], pointers[1], pointers[2], pointers[3], pointers[4], pointers[5], t.data[0], t.data[1],
                    t.data[2]}))
    return false;
#if CUMULUS_WITH_CUDNN_FRONTEND
  cuda::DeviceGuard guard(dy.device().index());
  return kernels::sdpa_backward_cudnn(cudnn_sdpa(dy.device()), g, dy.dtype(), pointers[0], pointers[1], pointers[2],
                                      pointers[3], static_cast<const float*>(pointers[5]), pointers[4], t.data[0],
                                      t.data[1], t.data[2]);
#else
  return false;
#endif
}

// The upstream gradient as the kernels read it, its strides set in g: dy where it lies when it has
// the output's layout (the gradient of merging the heads back, or of the packed op's [B, T, C]) or
// is dense, else a dense copy.
Tensor upstream_gradient(const Tensor& dy_in, const Tensor& out, kernels::AttentionGeometry& g) {
  if (detail::same_layout(dy_in, out) && dy_in.stride(-1) == 1) {
    std::copy(g.o_stride, g.o_stride + 3, g.do_stride);
    return dy_in;
  }
  g.dense(g.do_stride, g.tq);
  return detail::contiguous(dy_in);
}

class AttentionBackward final : public Node {
 public:
  // cudnn: the forward ran on cuDNN, so the backward asks cuDNN first (the statistics are the same
  // log-sum-exp either way, so a backward cuDNN declines runs on our kernel). packed: the node's
  // one input is the [B, T, 3C] projection q, k and v are views of (packed_qkv_attention), and its
  // output is out seen as [B, T, C].
  AttentionBackward(const char* name, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse,
                    const kernels::AttentionGeometry& g, bool cudnn, bool packed)
      : Node(name),
        q_(std::move(q)),
        k_(std::move(k)),
        v_(std::move(v)),
        out_(std::move(out)),
        lse_(std::move(lse)),
        g_(g),
        cudnn_(cudnn),
        packed_(packed) {}

  void backward(const Tensor& dy_in, std::vector<GradSink>& grads) override {
    kernels::AttentionGeometry g = g_;
    // The packed op's [B, T, C] output is out's [B, T, H, D] storage: dy dense is out's layout.
    const Tensor dy = upstream_gradient(
        packed_ ? detail::strided_view(detail::contiguous(dy_in), out_.shape(), out_.strides(), 0) : dy_in, out_, g);
    const GradientTargets targets = packed_ ? packed_targets(g) : separate_targets(grads);
    const Tensor saved[5] = {q_, k_, v_, out_, lse_};
    if (!(cudnn_ && backward_cudnn(g, saved, dy, targets))) backward_own(g, dy, targets);
    if (packed_) grads[0].give(targets.tensors[0]);
    else
      for (std::size_t i = 0; i < 3; ++i)
        if (grads[i].needed()) grads[i].give(targets.tensors[i]);
  }
  void release_saved() override {
    q_ = Tensor();
    k_ = Tensor();
    v_ = Tensor();
    out_ = Tensor();
    lse_ = Tensor();
  }

 private:
  // One gradient of the projection, dense [B, T, 3C] as q, k and v's storage is: the kernels write
  // dq, dk and dv at q's, k's and v's strides and offsets, which together cover every element.
  GradientTargets packed_targets(kernels::AttentionGeometry& g) const {
    GradientTargets t;
    const Shape& shape = q_.shape();  // [B, H, T, D]
    const int64_t c = shape[1] * shape[3];
    t.tensors[0] = Tensor::empty(Shape{shape[0], shape[2], 3 * c}, out_.dtype(), out_.device());
    auto* base = static_cast<char*>(t.tensors[0].raw_data());
    for (std::size_t i = 0; i < 3; ++i) t.data[i] = base + static_cast<std::size_t>(i) * c * dtype_size(out_.dtype());
    std::copy(g.q_stride, g.q_stride + 3, g.dq_stride);
    std::copy(g.k_stride, g.k_stride + 3, g.dk_stride);
    std::copy(g.v_stride, g.v_stride + 3, g.dv_stride);
    return t;
  }

  GradientTargets separate_targets(const std::vector<GradSink>& grads) const {
    GradientTargets t;
    const Tensor* inputs[3] = {&q_, &k_, &v_};
    for (std::size_t i = 0; i < 3; ++i) {
      if (grads[i].needed()) {
        t.tensors[i] = Tensor::empty(inputs[i]->shape(), out_.dtype(), out_.device());
      } else if (cudnn_) {
        MemoryCategoryScope scope(MemoryCategory::workspace);
        t.tensors[i] = Tensor::empty(inputs[i]->shape(), out_.dtype(), out_.device());
      } else {
        continue;
      }
      t.data[i] = t.tensors[i].raw_data();
    }
    return t;
  }

  void backward_own(const kernels::AttentionGeometry& g, const Tensor& dy, const GradientTargets& t) const {
    Tensor delta;
    {
      MemoryCategoryScope scope(MemoryCategory::workspace);
      delta = Tensor::empty(Shape{g.bh() * g.tq}, DType::f32, dy.device());
    }
    CUMULUS_DISPATCH_FLOAT(
        out_.dtype(), T, const T* qp = view_data<T>(q_); const T* kp = view_data<T>(k_); const T* vp = view_data<T>(v_);
        const T* op = view_data<T>(out_); const T* dyp = view_data<T>(dy); const float* lp = lse_.data<float>();
        float* dp = delta.data<float>(); T* dqp = static_cast<T*>(t.data[0]); T* dkp = static_cast<T*>(t.data[1]);
        T* dvp = static_cast<T*>(t.data[2]); CUMULUS_DISPATCH(
            dy.device(), ctx, kernels::attention_backward_cpu(g, qp, kp, vp, op, lp, dyp, dp, dqp, dkp, dvp),
            own_backward_cuda(g, qp, kp, vp, op, lp, dyp, dp, dqp, dkp, dvp, ctx.stream())));
  }

  Tensor q_, k_, v_, out_, lse_;
  kernels::AttentionGeometry g_;
  bool cudnn_, packed_;
};

void check_input(const char* what, const Tensor& t) {
  detail::check_floating(kOp, what, t);
  CUMULUS_CHECK(t.ndim() >= 2, ShapeError, kOp, ": ", what, " must be [..., T, D], got ", t.shape().str());
}

void check_scale(const char* op, std::optional<double> scale) {
  CUMULUS_CHECK(!scale || std::isfinite(*scale), InvalidArgument, op, ": scale must be finite, got ", *scale);
}

void check_head_size(const char* op, const Tensor& q, int64_t d, const std::string& shapes) {
#if CUMULUS_WITH_CUDA
  CUMULUS_CHECK(!q.device().is_cuda() || d <= kernels::kAttentionMaxHeadDimCuda, ShapeError, op,
                ": on CUDA D is at most ", kernels::kAttentionMaxHeadDimCuda, ", got ", shapes);
#else
  (void)op, (void)q, (void)d, (void)shapes;
#endif
}

// The forward both ops run, on checked inputs with a dense last dimension: the output (in
// new_attention_output's layout), each row's log-sum-exp, the geometry and whether cuDNN ran.
struct Attended {
  Tensor q, k, v, out, lse;
  kernels::AttentionGeometry g;
  bool cudnn = false;
};

Attended attend(Tensor q, Tensor k, Tensor v, bool causal, std::optional<double> scale) {
  Tensor out = detail::new_attention_output(q);
  std::optional<kernels::AttentionGeometry> found = detail::attention_geometry(q, k, v, out);
  if (!found) {
    q = detail::contiguous(q);
    k = detail::contiguous(k);
    v = detail::contiguous(v);
    out = detail::new_output(q.shape(), q.dtype(), q.device());
    found = detail::attention_geometry(q, k, v, out);
  }
  kernels::AttentionGeometry g = *found;
  g.causal = causal;
  g.scale = static_cast<float>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(g.d)));
  const Device device = q.device();
  Shape lse_shape;
  for (int i = 0; i < q.ndim() - 1; ++i) lse_shape.push_back(q.size(i));
  Tensor lse = detail::new_output(lse_shape, DType::f32, device);
  const bool cudnn = forward_cudnn(g, q, k, v, out, lse);
  if (device.is_cuda()) (cudnn ? cudnn_calls : own_calls).fetch_add(1, std::memory_order_relaxed);
  if (!cudnn)
    CUMULUS_DISPATCH_FLOAT(q.dtype(), T, const T* qp = view_data<T>(q); const T* kp = view_data<T>(k);
                           const T* vp = view_data<T>(v); T* op = static_cast<T*>(detail::element_data(out));
                           float* lp = lse.data<float>();
                           CUMULUS_DISPATCH(device, ctx, kernels::attention_forward_cpu(g, qp, kp, vp, op, lp),
                                            own_forward_cuda(g, qp, kp, vp, op, lp, ctx.stream())));
  return Attended{std::move(q), std::move(k), std::move(v), std::move(out), std::move(lse), g, cudnn};
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
  check_scale(kOp, scale);
  check_head_size(kOp, q_in, d, shapes);

  Attended a = attend(dense_rows(q_in), dense_rows(k_in), dense_rows(v_in), causal, scale);
  if (should_record({&a.q, &a.k, &a.v}))
    attach_node(a.out,
                std::make_shared<AttentionBackward>(kOp, a.q.detach(), a.k.detach(), a.v.detach(), a.out.detach(),
                                                    a.lse, a.g, a.cudnn, false),
                {&a.q, &a.k, &a.v});
  return a.out;
}

Tensor packed_qkv_attention(const Tensor& qkv_in, int64_t heads, bool causal, std::optional<double> scale) {
  constexpr const char* kPacked = "packed_qkv_attention";
  OpScope op_scope(kPacked);
  detail::check_floating(kPacked, "qkv", qkv_in);
  CUMULUS_CHECK(heads >= 1, InvalidArgument, kPacked, ": heads must be at least 1, got ", heads);
  const std::string shape = qkv_in.shape().str();
  CUMULUS_CHECK(qkv_in.ndim() == 3 && qkv_in.size(2) % (3 * heads) == 0 && qkv_in.size(2) > 0, ShapeError, kPacked,
                ": qkv must be [B, T, 3 * heads * D] with D >= 1, got ", shape, " and ", heads, " heads");
  CUMULUS_CHECK(qkv_in.size(1) >= 1, ShapeError, kPacked, ": qkv needs at least one position, got ", shape);
  check_scale(kPacked, scale);
  const Tensor qkv = detail::contiguous(qkv_in);
  const int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3, d = c / heads;
  check_head_size(kPacked, qkv, d, shape + " (D = " + std::to_string(d) + ")");
  // q, k and v: [B, H, T, D] views at offsets 0, C and 2C, read where they lie.
  const std::vector<int64_t> strides{t * 3 * c, d, 3 * c, 1};
  const Shape head_shape{b, heads, t, d};
  Attended a =
      attend(detail::strided_view(qkv, head_shape, strides, 0), detail::strided_view(qkv, head_shape, strides, c),
             detail::strided_view(qkv, head_shape, strides, 2 * c), causal, scale);
  Tensor y = detail::strided_view(a.out, Shape{b, t, c}, {t * c, c, 1}, 0);  // out's [B, T, H, D] storage
  if (should_record({&qkv}))
    attach_node(y,
                std::make_shared<AttentionBackward>(kPacked, a.q.detach(), a.k.detach(), a.v.detach(), a.out.detach(),
                                                    a.lse, a.g, a.cudnn, true),
                {&qkv});
  return y;
}

bool cudnn_attention_compiled() {
#if CUMULUS_WITH_CUDNN_FRONTEND
  return true;
#else
  return false;
#endif
}

CudaAttention cuda_attention() {
  static const CudaAttention from_environment = choice_from_environment();
  const int set = chosen.load(std::memory_order_relaxed);
  return set < 0 ? from_environment : static_cast<CudaAttention>(set);
}

void set_cuda_attention(CudaAttention choice) {
  CUMULUS_CHECK(choice == CudaAttention::own || cudnn_attention_compiled(), InvalidArgument,
                "set_cuda_attention(cudnn): this build has no cuDNN attention (cuDNN or the cuDNN frontend's "
                "headers were not found when configuring; scripts/install-deps.sh fetches the headers)");
  chosen.store(static_cast<int>(choice), std::memory_order_relaxed);
}

std::string cuda_attention_description(DType dtype) {
#if CUMULUS_WITH_CUDNN_FRONTEND
  if ((dtype == DType::bf16 || dtype == DType::f16) && cuda_attention() == CudaAttention::cudnn)
    return kernels::cudnn_attention_version_text();
#endif
  (void)dtype;
  return "cumulus's own kernels";
}

CudaAttentionCalls cuda_attention_calls() {
  return CudaAttentionCalls{cudnn_calls.load(std::memory_order_relaxed), own_calls.load(std::memory_order_relaxed)};
}

namespace detail {

bool same_layout(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  for (int i = 0; i < a.ndim(); ++i)
    if (a.size(i) > 1 && a.stride(i) != b.stride(i)) return false;
  return true;
}

std::optional<kernels::AttentionGeometry> attention_geometry(const Tensor& q, const Tensor& k, const Tensor& v,
                                                             const Tensor& out) {
  kernels::AttentionGeometry g;
  if (!leading_geometry({&q, &k, &v, &out}, g)) return std::nullopt;
  g.tq = q.size(-2);
  g.tk = k.size(-2);
  g.d = q.size(-1);
  g.set_dense_gradients();
  return g;
}

// A 4-D output is laid out as PyTorch's CPU and CUDA kernels lay it out, so that the usual
// transpose(1, 2).reshape(B, Tq, H * D) merging the heads is a view, not a copy kept for the output
// projection's backward.
Tensor new_attention_output(const Tensor& q) {
  if (q.ndim() != 4) return new_output(q.shape(), q.dtype(), q.device());
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3);
  const Tensor rows = new_output(Shape{b, t, h, d}, q.dtype(), q.device());
  return strided_view(rows, q.shape(), {t * h * d, d, h * d, 1}, 0);
}

}  // namespace detail

}  // namespace cumulus::ops
