// linear: y = x W^T + b, optionally followed by ReLU in the same op.
//   x: [B, in], W: [out, in], b: [out] -> y: [B, out]
// An x of any other rank, [..., in] (or [in]), is viewed as [B, in] with B the product of its leading
// dimensions (reshape: a view, no copy) and y viewed back as [..., out]; the reshapes' nodes view
// the gradient back, so everything below sees 2-D tensors only.
// Forward on the CPU: y is filled with b row by row, then one GEMM adds x W^T (beta = 1; no bias:
// beta = 0), then ReLU in place. On CUDA: one cuBLASLt GEMM whose epilogue adds b, then ReLU in
// place (Note [Fused linear] below).
// Backward, each part only when its input needs a gradient, with dz = dy * (y > 0) under ReLU and
// dz = dy otherwise:
//   dx [B, in]  = dz W        needs W  (saved only if x needs a gradient)
//   dW [out, in] (+)= dz^T x  needs x  (saved only if W needs a gradient)
//   db [out]    (+)= sum_rows dz
// dW and db are written straight into the sinks' buffers with the sinks' beta: for parameters
// that is the persistent gradient buffer, so accumulation happens inside the GEMM.
//
// Note [Fused linear]
// ops::linear(x, W, b, Activation::relu) is linear followed by relu as one op and one autograd
// node ("linear+relu"); nn::Sequential calls it where a Linear is followed by a ReLU.
// - CPU: the arithmetic of the two unfused ops, in the same order (broadcast, GEMM with beta 1,
//   ReLU in place over y), so results are bit-identical to linear + relu, forward and backward.
// - CUDA: one cuBLASLt call with the BIAS epilogue writes x W^T + b (no broadcast kernel), then our
//   ReLU kernel runs over y in place: cuBLASLt's RELU epilogues are not used (Note [ReLU epilogues
//   and NaN]). Where cuBLASLt has no algorithm for the epilogue (gemm_lt_cuda returns false) the
//   broadcast and cuBLAS's GEMM with beta 1 run instead.
// - Memory: the node saves y for the ReLU mask, which is the tensor the next op saves anyway
//   (the next Linear's input), and no longer the pre-activation: the activation footprint is
//   that of linear + relu (relu saved its output; the Linear output before it was freed at once).
//   Backward forms dz in the incoming gradient itself when the engine holds the only reference
//   to it (nothing else can observe the change), else in a temporary of its size: so backward
//   holds no more than linear + relu did, where relu's dz replaced dy before the Linear ran.
// - ReLU mask: backward masks with relu_backward's kernel on both devices (y <= 0 ? 0 : dy). No bit
//   mask is kept and the next Linear's dx GEMM applies none (cuBLASLt's RELU_AUX and DRELU
//   epilogues: Note [ReLU epilogues and NaN]).
// - Bias gradient on CUDA: when db's sink overwrites (the first micro-batch after a step), the
//   weight-gradient GEMM also writes db through the BGRAD epilogue. cuBLASLt's bias gradient
//   overwrites its output, so in accumulate mode it goes to a temporary that the engine adds into
//   db at the end of the backward, with the other Linears' in one launch (Note [Deferred gradient
//   adds] in engine/autograd/engine.cpp); where the sink cannot defer (data parallel's reporting
//   backward), sum_rows_cuda adds it with beta 1. Note [Bias gradient epilogue] in
//   kernels/cuda/gemm.cu says which BGRAD applies.
//
// Note [ReLU epilogues and NaN]
// Our ReLU lets NaN through, as PyTorch's does: forward `x <= 0 ? 0 : x` keeps a NaN pre-activation
// NaN, backward `y <= 0 ? 0 : dy` passes the gradient where the output is NaN and writes 0 (not
// 0 * dy) where it is cut. That holds on the CPU, in relu_forward_cuda / relu_backward_cuda and in
// the fused MLP's kernels (Note [Fused MLP]), so a NaN born in a hidden layer reaches the loss and
// every weight gradient it touches the same way on every path, and the step's non-finite guard
// sees it. cuBLASLt documents its RELU epilogues only as x := max(x, 0) and DRELU as applying the
// ReLU gradient from a bit mask, and says nothing of NaN: a max that returns the number for
// (NaN, 0) would turn the NaN into 0 and let the loss look finite, and a mask bit cannot say NaN.
// So the Linear does not use RELU, RELU_BIAS, RELU_AUX(_BIAS) or DRELU: the BIAS epilogue (an
// addition, which propagates NaN) and our ReLU kernels instead. A run-time probe was the other
// option, but it would vouch only for the algorithm it ran, while the heuristic picks one per
// shape and pointer alignment. The price is one launch per hidden Linear in forward (the ReLU)
// and one in backward (the mask, where DRELU applied it inside the next Linear's dx GEMM).
// tests/test_fused_mlp.cpp checks the two-Linear case: a NaN pre-activation reaches dW1 at the same
// positions through the generic ops, the fused linear+relu and the fused MLP op.
//
// Note [Mixed precision]
// A Linear computes in its input's type: x in bf16 or f16 makes y, dz and dx that type, while the
// weight and bias stay f32 (the master copy the optimizer updates) and so do their gradients.
// - Forward: W is narrowed to x's type for the GEMM (category parameter_copies, saved for dx's
//   GEMM); products are accumulated in f32 and the bias (rounded to x's type, below) added in f32
//   before y is rounded once, then ReLU (rounding is monotonic and keeps 0, so ReLU before or
//   after it gives the same bits). The copy is made per forward, so it can never be stale,
//   whatever changed the weights.
// - Backward: dz = dy * (y > 0) in the 16-bit type; dx = dz W16, rounded once; dW (+)= dz^T x and
//   db (+)= sum_rows dz are accumulated in f32 straight into the f32 gradient buffers (beta 0 or 1
//   as in f32). So the persistent buffers sum micro-batches in f32: a bf16 buffer would drop the
//   small contributions of later micro-batches (test_precision.cpp shows it does).
// - The bias is rounded to x's type as W is (category parameter_copies, per forward) and added in
//   f32 to the f32 sum of products before y is rounded once: cuBLASLt's BIAS epilogue reads its
//   bias in D's type (Note [Epilogue bias type] in kernels/cuda/gemm.cu), so this is the sum it can
//   write into a 16-bit y directly (Note [Direct 16-bit output]; PyTorch's autocast rounds the bias
//   so too).
// - CUDA: cuBLASLt with 16-bit A and B, f32 compute, and C/D in the 16-bit type (y, dx) or f32
//   (dW); cublasGemmEx where cuBLASLt has no algorithm. With a bias the GEMM writes y itself (Note
//   [Direct 16-bit output]; CUMULUS_CUDA_LINEAR16=scratch: an f32 scratch and one conversion).
//   Then our ReLU kernel over y, as in f32.
// - CPU: the same arithmetic in f32 over widened copies (bf16 x bf16 products are exact in f32),
//   rounded where the GPU rounds: tests compare the paths within the 16-bit types' tolerance.
// Losses, softmax and normalization statistics stay f32 (cross_entropy takes 16-bit logits and
// returns an f32 loss). The data loader gathers batches straight into the compute type, so the
// saved activations of a 16-bit run are half an f32 run's.
#include "cumulus/ops/linear.h"

#include "cumulus/autograd/node.h"
#include "cumulus/ops/shape.h"
#include "engine/core/opt_in.h"
#include "engine/ops/internal.h"
#include "engine/tensor/tensor_impl.h"

namespace cumulus::ops {

void detail::linear_forward_cpu(const float* xp, const float* wp, const float* bp, float* yp, int64_t batch,
                                int64_t in, int64_t out, bool relu) {
  if (bp != nullptr) kernels::broadcast_rows_cpu(bp, batch, out, yp);
  kernels::gemm_cpu(false, true, batch, out, in, 1.0f, xp, in, wp, in, bp != nullptr ? 1.0f : 0.0f, yp, out);
  if (relu) kernels::relu_forward_cpu(yp, yp, batch * out);
}

namespace {

using detail::linear_forward_cpu;
using detail::converted;
using detail::convert_into;

// Note [Direct 16-bit output]
// With its bias in y's type, cuBLASLt's bias epilogue writes a 16-bit Linear's y directly, without
// an f32 scratch's write and read and a conversion's launch (measured on an H200 with cuDNN's
// attention: the GPT-2-small bf16 step 4.7x faster than with the scratch and our attention,
// bench/results/2026-11-29-h200). CUMULUS_CUDA_LINEAR16=scratch asks for the scratch: the GEMM
// writes f32 with the bias epilogue and one conversion rounds y. Both add the rounded bias (widened
// exactly for the scratch) to the f32 sum of products and round once: the same sum, and the CPU's.
bool direct_16_bit_output() {
  static const bool direct =
      cumulus::detail::environment_choice("CUMULUS_CUDA_LINEAR16", {"scratch", "direct"}) != 0;
  return direct;
}

#if CUMULUS_WITH_CUDA
// A backward GEMM of a 16-bit Linear (Note [Mixed precision]): cuBLASLt, else cublasGemmEx.
void gemm_16_cuda(cuda::Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a,
                  int64_t lda, const void* b, int64_t ldb, float beta, void* c, int64_t ldc, kernels::GemmTypes types) {
  if (kernels::gemm_lt_cuda(ctx.gemm_lt_plans(), ctx.cublaslt(), ctx.workspace(), cuda::Context::kWorkspaceBytes,
                            trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc, types,
                            kernels::GemmEpilogueArgs{}, ctx.stream()))
    return;
  kernels::gemm_ex_cuda(ctx.cublas(), trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc, types);
}

// c = x W^T + b on CUDA, x and W in types.ab, c in types.cd; bp: the f32 bias, bcp: the same bias
// in c's type (bp itself for an f32 c; Note [Epilogue bias type] in kernels/cuda/gemm.cu). One
// cuBLASLt GEMM with the BIAS epilogue reading bcp, else bp broadcast into c (each value rounded to
// c's type as bcp's were) and cuBLAS's GEMM adding to it (beta 1): both sum in f32, c rounded once.
void forward_gemm_cuda(cuda::Context& ctx, const void* xp, const void* wp, const float* bp, const void* bcp, void* cp,
                       int64_t batch, int64_t in, int64_t out, kernels::GemmTypes types) {
  kernels::GemmEpilogueArgs epilogue;
  epilogue.kind = bcp != nullptr ? kernels::GemmEpilogue::bias : kernels::GemmEpilogue::none;
  epilogue.bias = bcp;
  if (kernels::gemm_lt_cuda(ctx.gemm_lt_plans(), ctx.cublaslt(), ctx.workspace(), cuda::Context::kWorkspaceBytes, false,
                            true, batch, out, in, 1.0f, xp, in, wp, in, 0.0f, cp, out, types, epilogue, ctx.stream()))
    return;
  if (bp != nullptr)
    CUMULUS_DISPATCH_FLOAT(types.cd, C,
                           kernels::broadcast_rows_cuda(bp, batch, out, static_cast<C*>(cp), ctx.stream()));
  const float beta = bp != nullptr ? 1.0f : 0.0f;
  if (types.ab == DType::f32 && types.cd == DType::f32) {
    kernels::gemm_cuda(ctx.cublas(), false, true, batch, out, in, 1.0f, static_cast<const float*>(xp), in,
                       static_cast<const float*>(wp), in, beta, static_cast<float*>(cp), out);
  } else {
    kernels::gemm_ex_cuda(ctx.cublas(), false, true, batch, out, in, 1.0f, xp, in, wp, in, beta, cp, out, types);
  }
}
#endif

// y = act(x W16^T + b16) for a 16-bit x (Note [Mixed precision]): b16 the bias rounded to x's type,
// summed with the products in f32 and rounded once into y, then ReLU, on both devices.
void linear_forward_16(const Tensor& x, const Tensor& w16, const Tensor& bias, const Tensor& y, bool relu) {
  const Device device = x.device();
  const int64_t batch = x.size(0), in = x.size(1), out = w16.size(0);
  const Tensor b16 = bias.defined() ? converted(bias, x.dtype(), MemoryCategory::parameter_copies) : Tensor();
  const bool direct = !device.is_cpu() && direct_16_bit_output();
  const Tensor bf = b16.defined() && !direct ? converted(b16, DType::f32, MemoryCategory::workspace) : Tensor();
  if (device.is_cpu()) {
    const Tensor xf = converted(x, DType::f32, MemoryCategory::workspace);
    const Tensor wf = converted(w16, DType::f32, MemoryCategory::workspace);
    const Tensor yf = detail::f32_scratch(y.shape(), device);
    linear_forward_cpu(xf.data<float>(), wf.data<float>(), bf.defined() ? bf.data<float>() : nullptr,
                       yf.data<float>(), batch, in, out, relu);
    convert_into(yf, y);
    return;
  }
#if CUMULUS_WITH_CUDA
  // Note [Direct 16-bit output]: with a bias, y written directly unless the scratch is asked for.
  const Tensor z = bf.defined() ? detail::f32_scratch(y.shape(), device) : y;
  const float* bp = bf.defined() ? bf.data<float>() : bias.defined() ? bias.data<float>() : nullptr;
  const void* bcp = bf.defined() ? static_cast<const void*>(bp) : b16.defined() ? b16.raw_data() : nullptr;
  const kernels::GemmTypes types{x.dtype(), z.dtype()};
  CUMULUS_DISPATCH(device, ctx, (void)0,
                   forward_gemm_cuda(ctx, x.raw_data(), w16.raw_data(), bp, bcp, z.raw_data(), batch, in, out, types));
  if (bf.defined()) convert_into(z, y);
  if (!relu) return;
  const int64_t n = y.numel();
  CUMULUS_DISPATCH_FLOAT(y.dtype(), T, T* yp = y.data<T>();
                         CUMULUS_DISPATCH(device, ctx, (void)yp, kernels::relu_forward_cuda(yp, yp, n, ctx.stream())));
#endif
}

#if CUMULUS_WITH_CUDA
// y = act(x W^T + b) on CUDA: forward_gemm_cuda, then our ReLU in place (Note [ReLU epilogues and NaN]).
void linear_forward_cuda(cuda::Context& ctx, const float* xp, const float* wp, const float* bp, float* yp,
                         int64_t batch, int64_t in, int64_t out, bool relu) {
  forward_gemm_cuda(ctx, xp, wp, bp, bp, yp, batch, in, out, kernels::GemmTypes{});
  if (relu) kernels::relu_forward_cuda(yp, yp, batch * out, ctx.stream());
}

// dW (+)= dz^T x, and db = sum_rows dz in the same cuBLASLt call when `dbp` is given (db's
// overwriting sink, or a temporary to defer). Returns whether db was written.
bool weight_gradient_cuda(cuda::Context& ctx, const float* dzp, const float* xp, float beta, float* dwp, float* dbp,
                          int64_t batch, int64_t in, int64_t out) {
  if (dbp != nullptr) {
    kernels::GemmEpilogueArgs epilogue;
    epilogue.kind = kernels::GemmEpilogue::bias_grad;
    epilogue.bias_grad = dbp;
    if (kernels::gemm_lt_cuda(ctx.gemm_lt_plans(), ctx.cublaslt(), ctx.workspace(), cuda::Context::kWorkspaceBytes,
                              true, false, out, in, batch, 1.0f, dzp, out, xp, in, beta, dwp, in, epilogue,
                              ctx.stream()))
      return true;
  }
  kernels::gemm_cuda(ctx.cublas(), true, false, out, in, batch, 1.0f, dzp, out, xp, in, beta, dwp, in);
  return false;
}
#endif

class LinearBackward final : public Node {
 public:
  // y: the op's output, saved only with ReLU (its mask is y > 0).
  LinearBackward(Tensor x, Tensor w, Tensor y, bool has_bias, bool relu)
      : Node(relu ? "linear+relu" : "linear"),
        x_(std::move(x)),
        w_(std::move(w)),
        y_(std::move(y)),
        has_bias_(has_bias),
        relu_(relu) {}

  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    if (dy.dtype() != DType::f32) return backward_16(dy, grads);
    const Device device = dy.device();
    const int64_t batch = dy.size(0), out = dy.size(1);
    // dz = dy * (y > 0): ReluBackward's arithmetic with beta 0, so every device gives relu's bits.
    const bool masked_copy = relu_ && !sole_owner(dy);  // checked before `dz` shares dy
    Tensor dz = masked_copy ? Tensor::empty(dy.shape(), DType::f32, device) : dy;
    if (relu_) {
      const float* yp = y_.data<float>();
      const float* dyp = dy.data<float>();
      float* dzp = dz.data<float>();
      const int64_t n = dy.numel();
      CUMULUS_DISPATCH(device, ctx, kernels::relu_backward_cpu(yp, dyp, 0.0f, dzp, n),
                       kernels::relu_backward_cuda(yp, dyp, 0.0f, dzp, n, ctx.stream()));
    }
    const float* dzp = dz.data<float>();
    if (grads[0].needed()) {
      const int64_t in = w_.size(1);
      GradSink::Target dx = grads[0].begin(Shape{batch, in}, device);
      const float* wp = w_.data<float>();
      float* dxp = dx.tensor.data<float>();
      CUMULUS_DISPATCH(device, ctx,
          kernels::gemm_cpu(false, false, batch, in, out, 1.0f, dzp, out, wp, in, dx.beta(), dxp, in),
          kernels::gemm_cuda(ctx.cublas(), false, false, batch, in, out, 1.0f, dzp, out, wp, in, dx.beta(), dxp, in));
    }
    // db's target is taken first: with an overwriting sink the CUDA weight-gradient GEMM writes it.
    const bool want_db = has_bias_ && grads[2].needed();
    GradSink::Target db{Tensor(), GradientMode::overwrite};
    if (want_db) db = grads[2].begin(Shape{out}, device);
    bool db_written = false;
    if (grads[1].needed()) {
      const int64_t in = x_.size(1);
      GradSink::Target dw = grads[1].begin(Shape{out, in}, device);
      const float* xp = x_.data<float>();
      float* dwp = dw.tensor.data<float>();
      // The GEMM's bias gradient is written, never added: straight into an overwriting sink, else
      // into a temporary the engine adds at the end of the backward (Note [Deferred gradient adds]).
      Tensor db_partial;
      float* fused_db = nullptr;
      if (want_db && device.is_cuda()) {
        if (db.mode == GradientMode::overwrite) {
          fused_db = db.tensor.data<float>();
        } else if (grads[2].can_defer_add()) {
          db_partial = Tensor::empty(Shape{out}, DType::f32, device);
          fused_db = db_partial.data<float>();
        }
      }
      (void)fused_db;
      CUMULUS_DISPATCH(device, ctx,
          kernels::gemm_cpu(true, false, out, in, batch, 1.0f, dzp, out, xp, in, dw.beta(), dwp, in),
          db_written = weight_gradient_cuda(ctx, dzp, xp, dw.beta(), dwp, fused_db, batch, in, out));
      if (db_written && db_partial.defined()) grads[2].defer_add(std::move(db_partial));
    }
    if (want_db && !db_written) {
      float* dbp = db.tensor.data<float>();
      CUMULUS_DISPATCH(device, ctx, kernels::sum_rows_cpu(dzp, batch, out, db.beta(), dbp),
                       detail::sum_rows_on_device(dzp, batch, out, db.beta(), dbp, device, ctx.stream()));
    }
  }

  void release_saved() override {
    x_ = Tensor();
    w_ = Tensor();
    y_ = Tensor();
  }

 private:
  // Note [Mixed precision]: dy, y, x and w_ (the forward's 16-bit weight copy) in one 16-bit type;
  // dW and db accumulate in f32.
  void backward_16(const Tensor& dy, std::vector<GradSink>& grads) {
    const Device device = dy.device();
    const DType type = dy.dtype();
    const int64_t batch = dy.size(0), out = dy.size(1);
    Tensor dz = dy;
    if (relu_) {
      const bool in_place = sole_owner(dy);
      if (!in_place) dz = Tensor::empty(dy.shape(), type, device);
      const int64_t n = dy.numel();
      CUMULUS_DISPATCH_FLOAT(type, T, const T* yp = y_.data<T>(); const T* dyp = dy.data<T>(); T* dzp = dz.data<T>();
                             CUMULUS_DISPATCH(device, ctx, kernels::relu_backward_cpu(yp, dyp, 0.0f, dzp, n),
                                              kernels::relu_backward_cuda(yp, dyp, 0.0f, dzp, n, ctx.stream())));
    }
    const bool want_db = has_bias_ && grads[2].needed();
    // The CPU computes in f32 over widened copies, rounding where the GPU rounds.
    Tensor dzf;
    if (device.is_cpu()) dzf = converted(dz, DType::f32, MemoryCategory::workspace);
    if (grads[0].needed()) {
      const int64_t in = w_.size(1);
      GradSink::Target dx = grads[0].begin(Shape{batch, in}, device, type);
      if (device.is_cpu()) {
        const Tensor wf = converted(w_, DType::f32, MemoryCategory::workspace);
        const Tensor dxf = detail::f32_stand_in(dx.tensor, dx.beta());
        kernels::gemm_cpu(false, false, batch, in, out, 1.0f, dzf.data<float>(), out, wf.data<float>(), in, dx.beta(),
                          dxf.data<float>(), in);
        detail::store_stand_in(dxf, dx.tensor);
      } else {
        CUMULUS_DISPATCH(device, ctx, (void)0,
                         gemm_16_cuda(ctx, false, false, batch, in, out, dz.raw_data(), out, w_.raw_data(), in,
                                      dx.beta(), dx.tensor.raw_data(), in, kernels::GemmTypes{type, type}));
      }
    }
    if (grads[1].needed()) {
      const int64_t in = x_.size(1);
      GradSink::Target dw = grads[1].begin(Shape{out, in}, device);
      float* dwp = dw.tensor.data<float>();
      if (device.is_cpu()) {
        const Tensor xf = converted(x_, DType::f32, MemoryCategory::workspace);
        kernels::gemm_cpu(true, false, out, in, batch, 1.0f, dzf.data<float>(), out, xf.data<float>(), in, dw.beta(),
                          dwp, in);
      } else {
        CUMULUS_DISPATCH(device, ctx, (void)0,
                         gemm_16_cuda(ctx, true, false, out, in, batch, dz.raw_data(), out, x_.raw_data(), in,
                                      dw.beta(), dwp, in, kernels::GemmTypes{type, DType::f32}));
      }
    }
    if (want_db) {
      GradSink::Target db = grads[2].begin(Shape{out}, device);
      float* dbp = db.tensor.data<float>();
      if (device.is_cpu()) {
        kernels::sum_rows_cpu(dzf.data<float>(), batch, out, db.beta(), dbp);
      } else {
        CUMULUS_DISPATCH_FLOAT(
            type, T, const T* dzp = dz.data<T>();
            CUMULUS_DISPATCH(device, ctx, (void)dzp,
                             detail::sum_rows_on_device(dzp, batch, out, db.beta(), dbp, device, ctx.stream())));
      }
    }
  }

  Tensor x_, w_, y_;
  bool has_bias_, relu_;
};

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return linear(x, weight, bias, Activation::none);
}

namespace {

// The op on a 2-D x, its arguments checked by linear.
Tensor linear_2d(const Tensor& x, const Tensor& weight, const Tensor& bias, bool relu) {
  const bool has_bias = bias.defined();
  const Device device = x.device();
  const int64_t batch = x.size(0), in = x.size(1), out = weight.size(0);
  const bool record = should_record({&x, &weight, &bias});
  if (x.dtype() != DType::f32) {  // Note [Mixed precision]
    const Tensor w16 = converted(weight, x.dtype(), MemoryCategory::parameter_copies);
    Tensor y = detail::new_output(Shape{batch, out}, x.dtype(), device);
    linear_forward_16(x, w16, bias, y, relu);
    if (record) {
      auto node = std::make_shared<LinearBackward>(weight.requires_grad() ? x.detach() : Tensor(),
                                                   x.requires_grad() ? w16 : Tensor(), relu ? y.detach() : Tensor(),
                                                   has_bias, relu);
      attach_node(y, std::move(node), {&x, &weight, &bias});
    }
    return y;
  }
  Tensor y = detail::new_output(Shape{batch, out}, DType::f32, device);
  const float* xp = x.data<float>();
  const float* wp = weight.data<float>();
  const float* bp = has_bias ? bias.data<float>() : nullptr;
  float* yp = y.data<float>();
  CUMULUS_DISPATCH(device, ctx, linear_forward_cpu(xp, wp, bp, yp, batch, in, out, relu),
                   linear_forward_cuda(ctx, xp, wp, bp, yp, batch, in, out, relu));

  if (record) {
    // Save only what the needed gradients read (detach, so the saved handles hold no graph).
    auto node = std::make_shared<LinearBackward>(weight.requires_grad() ? x.detach() : Tensor(),
                                                 x.requires_grad() ? weight.detach() : Tensor(),
                                                 relu ? y.detach() : Tensor(), has_bias, relu);
    attach_node(y, std::move(node), {&x, &weight, &bias});
  }
  return y;
}

}  // namespace

Tensor linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, Activation activation) {
  const bool relu = activation == Activation::relu;
  const char* op = relu ? "linear+relu" : "linear";
  OpScope op_scope(op);
  const Tensor x = detail::contiguous(x_in), weight = detail::contiguous(weight_in);
  const Tensor bias = bias_in.defined() ? detail::contiguous(bias_in) : bias_in;
  detail::check_floating(op, "input", x);
  detail::check_dtype(op, "weight", weight, DType::f32);
  CUMULUS_CHECK(x.ndim() >= 1, ShapeError, op, ": input must be [..., in_features], got ", x.shape().str());
  CUMULUS_CHECK(weight.ndim() == 2, ShapeError, op, ": weight must be [out_features, in_features], got ",
                weight.shape().str());
  CUMULUS_CHECK(x.size(-1) == weight.size(1), ShapeError, op, ": input ", x.shape().str(), " has ", x.size(-1),
                " features but the weight ", weight.shape().str(), " expects ", weight.size(1));
  detail::check_same_device(op, "weight", weight, x);
  if (bias.defined()) {
    detail::check_dtype(op, "bias", bias, DType::f32);
    CUMULUS_CHECK(bias.ndim() == 1 && bias.size(0) == weight.size(0), ShapeError, op, ": bias ", bias.shape().str(),
                  " does not match ", weight.size(0), " output features");
    detail::check_same_device(op, "bias", bias, x);
  }
  if (x.ndim() == 2) return linear_2d(x, weight, bias, relu);
  const int64_t in = weight.size(1), out = weight.size(0);
  Shape out_shape;
  int64_t rows = 1;
  for (int d = 0; d < x.ndim() - 1; ++d) {
    out_shape.push_back(x.size(d));
    rows *= x.size(d);
  }
  out_shape.push_back(out);
  return reshape(linear_2d(reshape(x, Shape{rows, in}), weight, bias, relu), out_shape);
}

}  // namespace cumulus::ops
