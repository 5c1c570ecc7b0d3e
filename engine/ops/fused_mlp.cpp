// mlp_cross_entropy: Linear, ReLU, ..., Linear, softmax cross-entropy as one op and one node.
//
// Note [Fused MLP]
// At micro-batch 16 the seed MLP's generic path is bound by launches, not arithmetic: each
// cuBLASLt call is 2-3 kernels, and even captured in a CUDA graph a micro-batch of 9 GEMMs plus the
// loss costs several times the ~5 us that moving its 9 MB of weights and gradients (all in L2) and
// its 64 MFLOP would. This op runs the whole micro-batch with kernels of our own
// (kernels/cuda/fused_mlp.cu), two per layer, each computing everything that depends on the same
// inputs:
//   forward   one kernel per hidden layer (x W^T + b, ReLU), one for the head (logits, softmax,
//             the row losses and their sum, by the last block to finish);
//   backward  one for the head (the last layer's dW and db, and the gradient of its input, masked
//             by the ReLU before it), one per hidden layer (its dW and db, and its input's gradient).
// For the seed MLP that is 3 + 3 launches where the generic path makes 14-15 (plus the batch gather
// and the step state's record in both). Every sum runs in a fixed order and nothing adds with
// atomics, so two runs give the same bits; dW and db are written with their sink's beta (overwrite
// after a step, add otherwise), so accumulation is the generic path's.
// - Saved for backward: x (the batch, alive anyway), each hidden layer's output (its ReLU mask is
//   output > 0) and [B, classes] of the head: the softmax on CUDA, the logits on the CPU. The
//   activation footprint is B * (hidden widths + classes) floats plus the loss, the same as the
//   generic path's; the memory test checks it against that analytic size.
// - The CPU runs the unfused ops' kernels in their order (broadcast, GEMM with beta 1, ReLU in
//   place; the cross-entropy kernels; then per layer dx, dW, db, the ReLU mask in place), so on
//   the CPU the op equals the generic path bit for bit: the reference the CUDA kernels are tested
//   against, besides double-precision finite differences.
// - ReLU: `t <= 0 ? 0 : t` forward and zero where the layer's output is <= 0 backward, relu's own
//   tests, so a NaN pre-activation reaches the loss and the gradients at the same positions as on
//   the generic path (Note [ReLU epilogues and NaN] in engine/ops/linear.cpp).
// - Where it applies: f32 (mixed precision keeps the generic path), at most kFusedMaxClasses classes
//   on CUDA. The kernels have no tensor cores and no register tiling for large batches, so models
//   would choose it automatically only up to a micro-batch size (models::SeedMLP::kFusedAutoMaxBatch)
//   and fall back to cuBLASLt above it (measured on a GPU: kFusedMlpMeasuredOnGpu).
#include "cumulus/ops/fused_mlp.h"

#include "cumulus/autograd/node.h"
#include "engine/ops/indices.h"
#include "engine/ops/internal.h"

namespace cumulus::ops {

namespace {

constexpr const char* kOp = "mlp_cross_entropy";

class MLPCrossEntropyBackward final : public Node {
 public:
  // hidden[i]: layer i's output after its ReLU (i < layers - 1). head: the CPU's logits or the
  // softmax on CUDA. x: saved only when a first-layer gradient needs it.
  MLPCrossEntropyBackward(Tensor x, std::vector<Tensor> hidden, Tensor head, Tensor labels, std::vector<Tensor> weights,
                          float scale, Reduction reduction)
      : Node("mlp_cross_entropy"),
        x_(std::move(x)),
        hidden_(std::move(hidden)),
        head_(std::move(head)),
        labels_(std::move(labels)),
        weights_(std::move(weights)),
        scale_(scale) {
    set_output_reduction(reduction == Reduction::Mean ? OutputReduction::mean : OutputReduction::sum);
    positions_ = labels_.size(0);  // no ignore_index: every sample counts
  }
  int64_t summed_positions(bool) const override { return positions_; }

  // grads: x, then weight and bias of each layer in order.
  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    const Device device = dy.device();
    const int64_t layers = detail::to_int(weights_.size());
    const int64_t batch = labels_.size(0), classes = weights_.back().size(0);
    // The gradient of the current layer's output, on the CPU; on CUDA the head's backward forms it
    // from the saved softmax as it goes.
    Tensor dz;
    if (device.is_cpu()) {
      dz = Tensor::empty(Shape{batch, classes}, DType::f32, device);
      kernels::cross_entropy_backward_cpu(head_.data<float>(), labels_.data<int32_t>(), batch, classes,
                                          dy.data<float>(), scale_, 0.0f, dz.data<float>());
    }
    for (int64_t l = layers - 1; l >= 0; --l) {
      const LayerGradients g = begin_layer(l, batch, device, grads);
      if (device.is_cpu()) backward_layer_cpu(l, dz, g);
      else backward_layer_cuda(l, dy, dz, g);
      dz = g.dx;  // the layer below's output gradient, masked; freed once that layer has used it
    }
  }

  void release_saved() override {
    x_ = Tensor();
    hidden_.clear();
    head_ = Tensor();
    labels_ = Tensor();
    weights_.clear();
  }

 private:
  // One layer's gradient targets with the betas their sinks ask for (dx a temporary for a hidden
  // layer's output, x's sink for the first layer; undefined where nothing needs it).
  struct LayerGradients {
    Tensor dx, dw, db;
    float beta_x = 0.0f, beta_w = 0.0f, beta_b = 0.0f;
  };

  LayerGradients begin_layer(int64_t l, int64_t batch, Device device, std::vector<GradSink>& grads) const {
    const Tensor& w = weights_[static_cast<std::size_t>(l)];
    GradSink& x_sink = grads[0];
    GradSink& w_sink = grads[static_cast<std::size_t>(1 + 2 * l)];
    GradSink& b_sink = grads[static_cast<std::size_t>(2 + 2 * l)];
    LayerGradients g;
    const auto take = [&](GradSink& sink, const Shape& shape, Tensor& tensor, float& beta) {
      const GradSink::Target t = sink.begin(shape, device);
      tensor = t.tensor;
      beta = t.beta();
    };
    if (l > 0) g.dx = Tensor::empty(Shape{batch, w.size(1)}, DType::f32, device);
    else if (x_sink.needed()) take(x_sink, Shape{batch, w.size(1)}, g.dx, g.beta_x);
    if (w_sink.needed()) take(w_sink, w.shape(), g.dw, g.beta_w);
    if (b_sink.needed()) take(b_sink, Shape{w.size(0)}, g.db, g.beta_b);
    return g;
  }

  // The layer's input: the hidden output below it, or x (kept only if dW1 needs it).
  const float* layer_input(int64_t l) const {
    const Tensor& input = l > 0 ? hidden_[static_cast<std::size_t>(l - 1)] : x_;
    return input.defined() ? input.data<float>() : nullptr;
  }

  static float* data_or_null(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }

  // LinearBackward's order and kernels (engine/ops/linear.cpp): dx, dW, db; then the ReLU mask of
  // the layer below, in place (its output is the only reference to the gradient).
  void backward_layer_cpu(int64_t l, const Tensor& dz, const LayerGradients& g) const {
    const Tensor& w = weights_[static_cast<std::size_t>(l)];
    const int64_t batch = labels_.size(0), in = w.size(1), out = w.size(0);
    const float* dzp = dz.data<float>();
    const float* ap = layer_input(l);
    float* dxp = data_or_null(g.dx);
    if (dxp != nullptr)
      kernels::gemm_cpu(false, false, batch, in, out, 1.0f, dzp, out, w.data<float>(), in, g.beta_x, dxp, in);
    if (g.dw.defined())
      kernels::gemm_cpu(true, false, out, in, batch, 1.0f, dzp, out, ap, in, g.beta_w, g.dw.data<float>(), in);
    if (g.db.defined()) kernels::sum_rows_cpu(dzp, batch, out, g.beta_b, g.db.data<float>());
    if (l > 0) kernels::relu_backward_cpu(ap, dxp, 0.0f, dxp, batch * in);
  }

  // The head's kernel forms its output gradient from the saved softmax; a hidden layer's reads dz.
  void backward_layer_cuda(int64_t l, const Tensor& dy, const Tensor& dz, const LayerGradients& g) const {
#if CUMULUS_WITH_CUDA
    const Tensor& w = weights_[static_cast<std::size_t>(l)];
    const int64_t batch = labels_.size(0), in = w.size(1), out = w.size(0);
    const bool head = l == detail::to_int(weights_.size()) - 1;
    const float* ap = layer_input(l);
    const float* wp = w.data<float>();
    const kernels::FusedGradients fg{data_or_null(g.dw), g.beta_w, data_or_null(g.db), g.beta_b,
                                     data_or_null(g.dx), g.beta_x, /*mask_relu=*/l > 0};
    CUMULUS_DISPATCH(
        dy.device(), ctx, (void)fg,
        head ? kernels::fused_head_backward_cuda(head_.data<float>(), labels_.data<int32_t>(), dy.data<float>(), scale_,
                                                 ap, wp, batch, in, out, fg, ctx.stream())
             : kernels::fused_linear_backward_cuda(dz.data<float>(), ap, wp, batch, in, out, fg, ctx.stream()));
#else
    (void)l, (void)dy, (void)dz, (void)g;
#endif
  }

  Tensor x_;
  std::vector<Tensor> hidden_;
  Tensor head_, labels_;
  int64_t positions_ = 0;
  std::vector<Tensor> weights_;
  float scale_;
};

void check_arguments(const Tensor& x, const Tensor& labels, const std::vector<Tensor>& weights,
                     const std::vector<Tensor>& biases) {
  const std::string unsupported = mlp_cross_entropy_unsupported_reason(x, weights);
  CUMULUS_CHECK(unsupported.empty(), InvalidArgument, kOp, ": ", unsupported);
  CUMULUS_CHECK(x.ndim() == 2 && x.size(0) > 0, ShapeError, kOp, ": input must be [batch > 0, features], got ",
                x.shape().str());
  CUMULUS_CHECK(labels.defined() && (labels.dtype() == DType::i32 || labels.dtype() == DType::i64), InvalidArgument,
                kOp, ": labels must be i32 or i64",
                labels.defined() ? std::string(", got ") + dtype_name(labels.dtype()) : std::string(" (undefined)"));
  CUMULUS_CHECK(labels.ndim() == 1 && labels.size(0) == x.size(0), ShapeError, kOp, ": labels ", labels.shape().str(),
                " do not match the input ", x.shape().str());
  detail::check_same_device(kOp, "labels", labels, x);
  CUMULUS_CHECK(biases.size() == weights.size(), InvalidArgument, kOp, ": ", weights.size(), " weights but ",
                biases.size(), " biases");
  int64_t features = x.size(1);
  for (std::size_t i = 0; i < weights.size(); ++i) {
    const Tensor& w = weights[i];
    const Tensor& b = biases[i];
    const std::string which = "layer " + std::to_string(i);
    detail::check_dtype(kOp, (which + " weight").c_str(), w, DType::f32);
    detail::check_dtype(kOp, (which + " bias").c_str(), b, DType::f32);
    CUMULUS_CHECK(w.ndim() == 2 && w.size(1) == features && w.size(0) > 0, ShapeError, kOp, ": ", which, " weight ",
                  w.shape().str(), " does not take ", features, " input features");
    CUMULUS_CHECK(b.ndim() == 1 && b.size(0) == w.size(0), ShapeError, kOp, ": ", which, " bias ", b.shape().str(),
                  " does not match ", w.size(0), " output features");
    detail::check_same_device(kOp, (which + " weight").c_str(), w, x);
    detail::check_same_device(kOp, (which + " bias").c_str(), b, x);
    features = w.size(0);
  }
}

// The hidden layers (x W^T + b, ReLU): each output is the next one's input and, recorded, saved.
std::vector<Tensor> forward_hidden_layers(const Tensor& x, const std::vector<Tensor>& weights,
                                          const std::vector<Tensor>& biases) {
  const Device device = x.device();
  const int64_t batch = x.size(0);
  std::vector<Tensor> hidden;
  Tensor h = x;
  for (std::size_t l = 0; l + 1 < weights.size(); ++l) {
    const int64_t in = weights[l].size(1), out = weights[l].size(0);
    Tensor y = detail::new_output(Shape{batch, out}, DType::f32, device);
    const float* hp = h.data<float>();
    const float* wp = weights[l].data<float>();
    const float* bp = biases[l].data<float>();
    float* yp = y.data<float>();
    CUMULUS_DISPATCH(device, ctx, detail::linear_forward_cpu(hp, wp, bp, yp, batch, in, out, /*relu=*/true),
                     kernels::fused_linear_forward_cuda(hp, wp, bp, batch, in, out, /*relu=*/true, yp, ctx.stream()));
    hidden.push_back(y);
    h = y;
  }
  return hidden;
}

// The head: its logits (the CPU) or softmax (CUDA, which the backward uses) into head, the loss into
// loss.
void forward_head(const Tensor& h, const Tensor& w, const Tensor& b, const Tensor& labels, float scale, Tensor& head,
                  Tensor& loss) {
  const Device device = h.device();
  const int64_t batch = h.size(0), in = w.size(1), classes = w.size(0);
  const float* hp = h.data<float>();
  const float* wp = w.data<float>();
  const float* bp = b.data<float>();
  const int32_t* yp = labels.data<int32_t>();
  float* headp = head.data<float>();
  if (device.is_cpu()) {
    detail::linear_forward_cpu(hp, wp, bp, headp, batch, in, classes, /*relu=*/false);
    const int64_t bad = kernels::cross_entropy_forward_cpu(headp, yp, batch, classes, scale, loss.data<float>());
    CUMULUS_CHECK(bad < 0, InvalidArgument, kOp, ": label ", bad >= 0 ? yp[bad] : 0, " at row ", bad,
                  " is outside [0, ", classes, ")");
    return;
  }
  Tensor row_loss = detail::new_output(Shape{batch}, DType::f32, device);  // freed on return
  float* rl = row_loss.data<float>();
  float* lp = loss.data<float>();
  CUMULUS_DISPATCH(device, ctx, ((void)rl, (void)lp) /* CPU handled above */,
                   kernels::fused_head_forward_cuda(hp, wp, bp, yp, batch, in, classes, scale, headp, rl, lp,
                                                    ctx.arrival_counter(), ctx.stream()));
}

}  // namespace

std::string mlp_cross_entropy_unsupported_reason(const Tensor& x, const std::vector<Tensor>& weights) {
  if (!x.defined()) return "the input is undefined";
  if (x.dtype() != DType::f32)
    return std::string("the input is ") + dtype_name(x.dtype()) + "; the fused path is f32 only";
  if (weights.empty()) return "there are no layers";
  if (!weights.back().defined() || weights.back().ndim() != 2) return "the last layer's weight is not a matrix";
#if CUMULUS_WITH_CUDA
  if (x.device().is_cuda() && weights.back().size(0) > kernels::kFusedMaxClasses)
    return "the head has " + std::to_string(weights.back().size(0)) + " classes; the CUDA kernels take at most " +
           std::to_string(kernels::kFusedMaxClasses);
#endif
  return {};
}

Tensor mlp_cross_entropy(const Tensor& x_in, const Tensor& labels_in, const std::vector<Tensor>& weights_in,
                         const std::vector<Tensor>& biases_in, Reduction reduction) {
  OpScope op_scope(kOp);
  const Tensor x = detail::contiguous(x_in);
  std::vector<Tensor> weights, biases;
  for (const Tensor& w : weights_in) weights.push_back(detail::contiguous(w));
  for (const Tensor& b : biases_in) biases.push_back(detail::contiguous(b));
  check_arguments(x, labels_in, weights, biases);
  CUMULUS_CHECK(reduction != Reduction::None, InvalidArgument, kOp,
                ": reduction must be Sum or Mean (per-row losses: ops::cross_entropy with Reduction::None)");
  const Tensor labels = detail::as_i32_indices(kOp, "labels", detail::contiguous(labels_in));
  const Device device = x.device();
  const int64_t batch = x.size(0), layers = detail::to_int(weights.size());
  const int64_t classes = weights.back().size(0);
  const float scale = reduction == Reduction::Mean ? 1.0f / static_cast<float>(batch) : 1.0f;
  std::vector<const Tensor*> inputs{&x};
  for (int64_t l = 0; l < layers; ++l) {
    inputs.push_back(&weights[static_cast<std::size_t>(l)]);
    inputs.push_back(&biases[static_cast<std::size_t>(l)]);
  }
  const bool record = should_record(inputs);

  const std::vector<Tensor> hidden = forward_hidden_layers(x, weights, biases);
  Tensor head = detail::new_output(Shape{batch, classes}, DType::f32, device);
  Tensor loss = detail::new_output(Shape{}, DType::f32, device);
  forward_head(hidden.empty() ? x : hidden.back(), weights.back(), biases.back(), labels, scale, head, loss);
  if (record) {
    std::vector<Tensor> saved_hidden;
    for (const Tensor& t : hidden) saved_hidden.push_back(t.detach());
    std::vector<Tensor> saved_weights;
    for (const Tensor& t : weights) saved_weights.push_back(t.detach());
    // x is read by the first layer's weight gradient only.
    Tensor saved_x = weights.front().requires_grad() ? x.detach() : Tensor();
    attach_node(loss,
                std::make_shared<MLPCrossEntropyBackward>(std::move(saved_x), std::move(saved_hidden), head.detach(),
                                                          labels.detach(), std::move(saved_weights), scale, reduction),
                inputs);
  }
  return loss;
}

}  // namespace cumulus::ops
