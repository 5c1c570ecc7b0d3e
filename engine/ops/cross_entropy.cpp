// cross_entropy: softmax cross-entropy of logits [B, C] against i32 labels [B] -> scalar.
// Saves the logits and labels (both alive anyway: the logits are the last Linear's output) and
// recomputes the softmax in backward rather than keeping a [B, C] probability tensor.
// Logits may be bf16 or f16 (their gradient then is too); the softmax and the loss are f32.
#include <cmath>

#include "cumulus/autograd/node.h"
#include "cumulus/ops/ops.h"
#include "engine/ops/internal.h"

namespace cumulus::ops {

namespace {

class CrossEntropyBackward final : public Node {
 public:
  CrossEntropyBackward(Tensor logits, Tensor labels, float scale, Reduction reduction)
      : Node("cross_entropy"), logits_(std::move(logits)), labels_(std::move(labels)), scale_(scale) {
    set_output_reduction(reduction == Reduction::Mean ? OutputReduction::mean : OutputReduction::sum);
  }

  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    if (!grads[0].needed()) return;
    const Device device = dy.device();
    GradSink::Target dx = grads[0].begin(logits_.shape(), device, logits_.dtype());
    const int32_t* yp = labels_.data<int32_t>();
    const float* g = dy.data<float>();
    const int64_t b = logits_.size(0), c = logits_.size(1);
    const float beta = dx.beta();
    CUMULUS_DISPATCH_FLOAT(logits_.dtype(), T, const T* lp = logits_.data<T>(); T* dxp = dx.tensor.data<T>();
        CUMULUS_DISPATCH(device, ctx, kernels::cross_entropy_backward_cpu(lp, yp, b, c, g, scale_, beta, dxp),
                         kernels::cross_entropy_backward_cuda(lp, yp, b, c, g, scale_, beta, dxp, ctx.stream())));
  }
  void release_saved() override {
    logits_ = Tensor();
    labels_ = Tensor();
  }

 private:
  Tensor logits_, labels_;
  float scale_;
};

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& labels, Reduction reduction) {
  constexpr const char* op = "cross_entropy";
  OpScope op_scope(op);
  detail::check_floating(op, "logits", logits);
  detail::check_dtype(op, "labels", labels, DType::i32);
  CUMULUS_CHECK(logits.ndim() == 2 && logits.size(1) > 0, ShapeError, op,
                ": logits must be [batch, classes > 0], got ", logits.shape().str());
  CUMULUS_CHECK(labels.ndim() == 1 && labels.size(0) == logits.size(0), ShapeError, op, ": labels ",
                labels.shape().str(), " do not match logits ", logits.shape().str());
  detail::check_same_device(op, "labels", labels, logits);

  const Device device = logits.device();
  const int64_t b = logits.size(0), c = logits.size(1);
  const float scale = reduction == Reduction::Mean ? (b > 0 ? 1.0f / static_cast<float>(b) : NAN) : 1.0f;
  Tensor loss = detail::new_output(Shape{}, DType::f32, device);
  const int32_t* yp = labels.data<int32_t>();
  float* out = loss.data<float>();
  if (device.is_cpu()) {
    int64_t bad = -1;
    CUMULUS_DISPATCH_FLOAT(logits.dtype(), T,
                           bad = kernels::cross_entropy_forward_cpu(logits.data<T>(), yp, b, c, scale, out));
    CUMULUS_CHECK(bad < 0, InvalidArgument, op, ": label ", bad >= 0 ? yp[bad] : 0, " at row ", bad,
                  " is outside [0, ", c, ")");
  } else {
#if CUMULUS_WITH_CUDA
    const int64_t partials = kernels::sum_all_blocks(b);  // the loss's sum: kernels/cuda/kernels.h
#else
    const int64_t partials = 0;
#endif
    Tensor row_loss = detail::new_output(Shape{b + partials}, DType::f32, device);  // freed on return
    CUMULUS_DISPATCH_FLOAT(logits.dtype(), T, const T* lp = logits.data<T>(); float* rl = row_loss.data<float>();
                           CUMULUS_DISPATCH(device, ctx, ((void)lp, (void)rl) /* CPU handled above */,
                                            kernels::cross_entropy_forward_cuda(lp, yp, b, c, scale, rl, out,
                                                                                ctx.stream())));
  }
  if (should_record({&logits}))
    attach_node(loss, std::make_shared<CrossEntropyBackward>(logits.detach(), labels.detach(), scale, reduction),
                {&logits});
  return loss;
}

}  // namespace cumulus::ops
