// ClassificationTally: see cumulus/ops/metrics.h.
#include "cumulus/ops/metrics.h"

#include "cumulus/memory/category.h"
#include "engine/ops/indices.h"
#include "engine/ops/internal.h"
#include "kernels/metrics.h"

namespace cumulus::ops {

ClassificationTally::ClassificationTally(Device device) {
  static_assert(sizeof(kernels::ClassificationTotals) == 32, "the totals buffer is 8 i32");
  MemoryCategoryScope scope(MemoryCategory::other);
  totals_ = Tensor::zeros(Shape{8}, DType::i32, device);
}

void ClassificationTally::add(const Tensor& logits_in, const Tensor& labels_in, const Tensor& mean_loss_in) {
  constexpr const char* op = "classification tally";
  OpScope op_scope(op);
  const Tensor logits = detail::contiguous(logits_in), mean_loss = detail::contiguous(mean_loss_in);
  detail::check_floating(op, "logits", logits);
  const Tensor labels = detail::as_i32_indices(op, "labels", detail::contiguous(labels_in));
  detail::check_dtype(op, "mean loss", mean_loss, DType::f32);
  CUMULUS_CHECK(logits.ndim() == 2 && logits.size(1) > 0, ShapeError, op, ": logits must be [rows, classes > 0], got ",
                logits.shape().str());
  CUMULUS_CHECK(labels.ndim() == 1 && labels.size(0) == logits.size(0), ShapeError, op, ": labels ",
                labels.shape().str(), " do not match logits ", logits.shape().str());
  CUMULUS_CHECK(mean_loss.numel() == 1, ShapeError, op, ": the mean loss must be one value, got ",
                mean_loss.shape().str());
  const Device device = totals_.device();
  detail::check_same_device(op, "logits", logits, totals_);
  detail::check_same_device(op, "labels", labels, totals_);
  detail::check_same_device(op, "mean loss", mean_loss, totals_);
  const int32_t* y = labels.data<int32_t>();
  const float* loss = mean_loss.data<float>();
  auto* totals = static_cast<kernels::ClassificationTotals*>(totals_.raw_data());
  const int64_t rows = logits.size(0), cols = logits.size(1);
  CUMULUS_DISPATCH_FLOAT(logits.dtype(), T, const T* x = logits.data<T>(); CUMULUS_DISPATCH(
                             device, ctx, kernels::classification_tally_cpu(x, y, rows, cols, loss, totals),
                             kernels::classification_tally_cuda(x, y, rows, cols, loss, totals, ctx.stream())));
}

ClassificationTally::Totals ClassificationTally::read() const {
  kernels::ClassificationTotals t{};
  copy_bytes(&t, Device::cpu(), totals_.raw_data(), totals_.device(), sizeof(t));
  return {t.loss_sum, t.correct, t.samples, t.batches};
}

}  // namespace cumulus::ops
