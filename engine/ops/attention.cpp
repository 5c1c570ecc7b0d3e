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
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "cumulus/autograd/node.h"
#include "cumulus/ops/attention.h"
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
  // Ours by default: cuDNN's path has not run on a GPU yet, so it is asked for, never assumed.
  const CudaAttention otherwise = CudaAttention::own;
  const char* value = std::getenv("CUMULUS_CUDA_ATTENTION");
  if (value == nullptr || *value == '\0') return otherwise;
  if (std::strcmp(value, "own") == 0) return CudaAttention::own;
  if (std::strcmp(value, "cudnn") == 0 && cudnn_attention_compiled()) return CudaAttention::cudnn;
  // A speed setting, as CUMULUS_CPU_CAPABILITY: said once and ignored rather than failing the program.
  std::fprintf(stderr, "cumulus: CUMULUS_CUDA_ATTENTION=%s is not %s; ignored\n", value,
               cudnn_attention_compiled() ? "cudnn or own" : "own (this build has no cuDNN attention)");
  return otherwise;
}

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

// The backward through cuDNN, which writes all three gradients: a gradient no input needs goes to
// a scratch tensor (category workspace). False (nothing written) where it is not asked or declines.
bool backward_cudnn(const kernels::AttentionGeometry& g, const Tensor* saved, const Tensor& dy_in,
                    Tensor (&grad)[3]) {
  if (!cudnn_takes(g, dy_in, {})) return false;
  const Tensor dy = detail::dout_like_output(dy_in, saved[3], saved[0]);
  if (!detail::same_layout(dy, saved[3])) return false;
  const void* pointers[6] = {detail::element_data(saved[0]), detail::element_data(saved[1]),
                             detail::element_data(saved[2]), detail::element_data(saved[3]),
                             detail::element_data(dy), saved[4].raw_data()};
  if (!cudnn_takes(g, dy, {pointers[0], pointers[1], pointers[2], pointers[3], pointers[4], pointers[5]}))
    return false;
  Tensor target[3];  // fresh from the allocator: aligned
  for (int i = 0; i < 3; ++i) {
    MemoryCategoryScope scope(MemoryCategory::workspace);
    target[i] = grad[i].defined() ? grad[i] : Tensor::empty(saved[i].shape(), dy.dtype(), dy.device());
  }
#if CUMULUS_WITH_CUDNN_FRONTEND
  cuda::DeviceGuard guard(dy.device().index());
  return kernels::sdpa_backward_cudnn(cudnn_sdpa(dy.device()), g, dy.dtype(), pointers[0], pointers[1], pointers[2],
                                      pointers[3], static_cast<const float*>(pointers[5]), pointers[4],
                                      target[0].raw_data(), target[1].raw_data(), target[2].raw_data());
#else
  return false;
#endif
}

class AttentionBackward final : public Node {
 public:
  // cudnn: the forward ran on cuDNN, so the backward asks cuDNN first (the statistics are the same
  // log-sum-exp either way, so a backward cuDNN declines runs on our kernel).
  AttentionBackward(Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, const kernels::AttentionGeometry& g,
                    bool cudnn)
      : Node(kOp),
        q_(std::move(q)),
        k_(std::move(k)),
        v_(std::move(v)),
        out_(std::move(out)),
        lse_(std::move(lse)),
        g_(g),
        cudnn_(cudnn) {}

  void backward(const Tensor& dy_in, std::vector<GradSink>& grads) override {
    const Device device = dy_in.device();
    const DType dtype = out_.dtype();
    // Fresh dense gradients handed to the sinks (an inner node's first one takes it without a
    // copy): q, k and v may be one tensor, whose sink must be written once per begin().
    Tensor grad[3];
    const Tensor* inputs[3] = {&q_, &k_, &v_};
    for (int i = 0; i < 3; ++i)
      if (grads[static_cast<std::size_t>(i)].needed()) grad[i] = Tensor::empty(inputs[i]->shape(), dtype, device);
    const Tensor saved[5] = {q_, k_, v_, out_, lse_};
    if (cudnn_ && backward_cudnn(g_, saved, dy_in, grad)) {
      for (int i = 0; i < 3; ++i)
        if (grad[i].defined()) grads[static_cast<std::size_t>(i)].give(grad[i]);
      return;
    }
    const Tensor dy = detail::contiguous(dy_in);
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
  bool cudnn_;
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
  g.scale = static_cast<float>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(d)));

  const Device device = q.device();
  Shape lse_shape;
  for (int i = 0; i < n - 1; ++i) lse_shape.push_back(q.size(i));
  Tensor lse = detail::new_output(lse_shape, DType::f32, device);
  const bool cudnn = forward_cudnn(g, q, k, v, out, lse);
  if (device.is_cuda()) (cudnn ? cudnn_calls : own_calls).fetch_add(1, std::memory_order_relaxed);
  if (!cudnn)
    CUMULUS_DISPATCH_FLOAT(q.dtype(), T, const T* qp = view_data<T>(q); const T* kp = view_data<T>(k);
                           const T* vp = view_data<T>(v); T* op = static_cast<T*>(detail::element_data(out));
                           float* lp = lse.data<float>();
                           CUMULUS_DISPATCH(device, ctx, kernels::attention_forward_cpu(g, qp, kp, vp, op, lp),
                                            kernels::attention_forward_cuda(g, qp, kp, vp, op, lp, ctx.stream())));
  if (should_record({&q, &k, &v}))
    attach_node(out,
                std::make_shared<AttentionBackward>(q.detach(), k.detach(), v.detach(), out.detach(), lse, g, cudnn),
                {&q, &k, &v});
  return out;
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

Tensor dout_like_output(const Tensor& dy, const Tensor& out, const Tensor& q) {
  if (same_layout(dy, out)) return dy;
  if (out.is_contiguous()) return contiguous(dy);
  const Tensor like = new_attention_output(q);
  copy_strided(dy, like);
  return like;
}

std::optional<kernels::AttentionGeometry> attention_geometry(const Tensor& q, const Tensor& k, const Tensor& v,
                                                             const Tensor& out) {
  kernels::AttentionGeometry g;
  if (!leading_geometry({&q, &k, &v, &out}, g)) return std::nullopt;
  g.tq = q.size(-2);
  g.tk = k.size(-2);
  g.d = q.size(-1);
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
