// cross_entropy: softmax cross-entropy of logits [..., C] against i32 or i64 labels [...], reduced
// to a scalar (Sum, Mean) or kept per position (None), with PyTorch's ignore_index. The logits are
// seen as rows [N, C] with N = labels.numel() (contiguous: no copy) and i64 labels are converted to
// i32 for the kernels (engine/ops/indices.h). Saves the logits and labels (both alive anyway: the
// logits are the last Linear's output) and recomputes the softmax in backward rather than keeping
// an [N, C] probability tensor. Logits may be bf16 or f16 (their gradient then is too); the
// softmax and the loss are f32.
// Mean divides by the positions not ignored. The CPU counts them on the host; CUDA counts them on
// the device in the loss's own launch and keeps 1 / count there for the backward (a [1] tensor the
// node saves), so no count is read back.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cumulus/autograd/node.h"
#include "cumulus/ops/loss.h"
#include "cumulus/ops/shape.h"
#include "engine/ops/indices.h"
#include "engine/ops/internal.h"
#include "kernels/cpu/loss_kernels.h"
#if CUMULUS_WITH_CUDA
#include "kernels/cuda/loss_kernels.h"
#endif

namespace cumulus::ops {

namespace {

OutputReduction output_reduction_of(Reduction reduction) {
  switch (reduction) {
    case Reduction::Mean: return OutputReduction::mean;
    case Reduction::Sum: return OutputReduction::sum;
    case Reduction::None: break;
  }
  return OutputReduction::unknown;
}

class CrossEntropyBackward final : public Node {
 public:
  // labels: i32. scale: the CPU's; device_scale: CUDA's [1] (undefined on the CPU). kept: the
  // positions not ignored where the host counted them (the CPU), else -1. stats: the CPU forward's
  // row maxima and log sums [2 rows] (undefined on CUDA), so the backward need not compute them again.
  CrossEntropyBackward(Tensor logits, Tensor labels, int64_t ignore_index, Reduction reduction, float scale,
                       Tensor device_scale, int64_t kept, Tensor stats)
      : Node("cross_entropy"),
        logits_(std::move(logits)),
        labels_(std::move(labels)),
        device_scale_(std::move(device_scale)),
        stats_(std::move(stats)),
        ignore_index_(ignore_index),
        per_row_(reduction == Reduction::None),
        scale_(scale),
        kept_(kept) {
    set_output_reduction(output_reduction_of(reduction));
  }

  // The positions whose labels are not ignore_index: counted by the CPU's forward, or read from
  // the device's labels (one copy and a wait) while they are saved, before backward releases them.
  int64_t summed_positions(bool read_device) const override {
    if (per_row_ || (kept_ < 0 && !labels_.defined())) return kNoPositions;
    if (kept_ >= 0) return kept_;
    if (!read_device) return kPositionsOnDevice;
    const std::vector<int32_t> labels = labels_.to_vector<int32_t>();
    const auto ignored = std::count(labels.begin(), labels.end(), ignore_index_);
    return static_cast<int64_t>(labels.size()) - static_cast<int64_t>(ignored);
  }

  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    if (!grads[0].needed()) return;
    const Device device = dy.device();
    GradSink::Target dx = grads[0].begin(logits_.shape(), device, logits_.dtype());
    const int32_t* yp = labels_.data<int32_t>();
    const float* g = dy.data<float>();
    const int64_t rows = labels_.numel(), c = logits_.size(-1), stride = per_row_ ? 1 : 0, ignore = ignore_index_;
    const float beta = dx.beta(), scale = scale_;
    const float* sp = device_scale_.defined() ? device_scale_.data<float>() : nullptr;
    const float* rs = stats_.defined() ? stats_.data<float>() : nullptr;
    (void)sp, (void)rs;
    CUMULUS_DISPATCH_FLOAT(
        logits_.dtype(), T, const T* lp = logits_.data<T>(); T* dxp = dx.tensor.data<T>(); CUMULUS_DISPATCH(
            device, ctx, kernels::cross_entropy_rows_backward_cpu(lp, yp, rows, c, ignore, g, stride, scale, beta, dxp, rs),
            kernels::cross_entropy_rows_backward_cuda(lp, yp, rows, c, ignore, g, stride, sp, beta, dxp,
                                                      ctx.stream())));
  }
  void release_saved() override {
    logits_ = Tensor();
    labels_ = Tensor();
    device_scale_ = Tensor();
    stats_ = Tensor();
  }

 private:
  Tensor logits_, labels_, device_scale_, stats_;
  int64_t ignore_index_;
  bool per_row_;
  float scale_;
  int64_t kept_;
};

void check_arguments(const char* op, const Tensor& logits, const Tensor& labels) {
  detail::check_floating(op, "logits", logits);
  CUMULUS_CHECK(labels.defined(), InvalidArgument, op, ": labels is undefined", detail::undefined_because(labels));
  CUMULUS_CHECK(labels.dtype() == DType::i32 || labels.dtype() == DType::i64, InvalidArgument, op,
                ": labels must be i32 or i64, got ", dtype_name(labels.dtype()));
  CUMULUS_CHECK(logits.ndim() >= 1 && logits.size(-1) > 0, ShapeError, op, ": logits must be [..., classes > 0], got ",
                logits.shape().str());
  bool match = labels.ndim() == logits.ndim() - 1;
  for (int d = 0; match && d < labels.ndim(); ++d) match = labels.size(d) == logits.size(d);
  CUMULUS_CHECK(match, ShapeError, op, ": labels ", labels.shape().str(), " do not match logits ", logits.shape().str(),
                " (labels must have the logits' shape without its last, class dimension)");
  detail::check_same_device(op, "labels", labels, logits);
}

// The CPU forward into `out` (a scalar, or per row for None): returns the scale of the backward;
// `kept` gets the positions not ignored, `stats` (where defined) the rows' statistics.
float forward_cpu(const char* op, const Tensor& logits, const Tensor& labels, int64_t ignore_index, Reduction reduction,
                  const Tensor& out, int64_t& kept, const Tensor& stats) {
  const int64_t rows = labels.numel(), c = logits.size(-1);
  const int32_t* yp = labels.data<int32_t>();
  kept = 0;
  for (int64_t i = 0; i < rows; ++i) kept += yp[i] != ignore_index;
  const float scale = reduction == Reduction::Mean ? (kept > 0 ? 1.0f / static_cast<float>(kept) : NAN) : 1.0f;
  float* loss = reduction == Reduction::None ? nullptr : out.data<float>();
  float* row_loss = reduction == Reduction::None ? out.data<float>() : nullptr;
  float* sp = stats.defined() ? stats.data<float>() : nullptr;
  int64_t bad = -1;
  CUMULUS_DISPATCH_FLOAT(logits.dtype(), T,
                         bad = kernels::cross_entropy_rows_forward_cpu(logits.data<T>(), yp, rows, c, ignore_index,
                                                                       scale, loss, row_loss, sp));
  CUMULUS_CHECK(bad < 0, InvalidArgument, op, ": label ", bad >= 0 ? yp[bad] : 0, " at position ", bad,
                " is outside [0, ", c, ") and is not ignore_index ", ignore_index);
  return scale;
}

}  // namespace

Tensor cross_entropy(const Tensor& logits_in, const Tensor& labels_in, Reduction reduction, int64_t ignore_index) {
  constexpr const char* op = "cross_entropy";
  OpScope op_scope(op);
  const Tensor logits = detail::contiguous(logits_in);
  check_arguments(op, logits, labels_in);
  const Tensor labels = detail::as_i32_indices(op, "labels", detail::contiguous(labels_in));

  const Device device = logits.device();
  const int64_t rows = labels.numel();
  const bool per_row = reduction == Reduction::None;
  const bool on_cuda = device.is_cuda();
  // On CUDA a reduced loss and the backward's scale share one allocation: [loss, scale].
  const Tensor loss_and_scale =
      detail::new_output(per_row ? labels.shape() : Shape{on_cuda ? 2 : 1}, DType::f32, device);
  Tensor loss = per_row ? loss_and_scale : loss_and_scale.narrow_rows(0, 1).reshape(Shape{});
  float scale = 1.0f;
  int64_t kept = -1;  // on CUDA the device counts them
  Tensor device_scale, stats;
  const bool record = should_record({&logits});
  if (!on_cuda) {
    if (record) stats = detail::new_output(Shape{2 * rows}, DType::f32, device);
    scale = forward_cpu(op, logits, labels, ignore_index, reduction, loss, kept, stats);
  } else {
    Tensor scratch;  // row losses and the rows counted (freed on return)
    if (!per_row) {
      scratch = detail::new_output(Shape{2 * rows}, DType::f32, device);
      device_scale = loss_and_scale.narrow_rows(1, 1);
    }
    float* row_loss = per_row ? loss.data<float>() : scratch.data<float>();
    float* valid = per_row ? nullptr : row_loss + rows;
    float* lp = per_row ? nullptr : loss.data<float>();
    float* sp = per_row ? nullptr : device_scale.data<float>();
    const int32_t* yp = labels.data<int32_t>();
    const bool mean = reduction == Reduction::Mean;
    const int64_t c = logits.size(-1);
    (void)row_loss, (void)valid, (void)lp, (void)sp, (void)yp, (void)mean, (void)c;
    CUMULUS_DISPATCH_FLOAT(logits.dtype(), T, const T* xp = logits.data<T>(); (void)xp; CUMULUS_DISPATCH(
                               device, ctx, (void)0 /* CPU handled above */,
                               kernels::cross_entropy_rows_forward_cuda(xp, yp, rows, c, ignore_index, mean, row_loss,
                                                                        valid, lp, sp, ctx.stream())));
  }
  if (record)
    attach_node(loss,
                std::make_shared<CrossEntropyBackward>(logits.detach(), labels.detach(), ignore_index, reduction, scale,
                                                       device_scale, kept, stats),
                {&logits});
  return loss;
}

}  // namespace cumulus::ops
