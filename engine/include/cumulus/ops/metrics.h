// Evaluation totals kept on the device, so a test pass reads the device once, not once per batch
// (three reads per batch, for the loss, the predictions and the labels, each a host
// synchronization that stalls the queue on CUDA).
#pragma once

#include <cstdint>

#include "cumulus/tensor/tensor.h"

namespace cumulus::ops {

class ClassificationTally {
 public:
  explicit ClassificationTally(Device device);  // zeroed totals on `device` (category other)

  // Adds one batch: `mean_loss` is the batch's loss as a device scalar (what
  // cross_entropy(logits, labels, Reduction::Mean) returns), summed in double; a row counts as
  // correct when the argmax of its logits (ops::argmax's rule) equals its label. Queued, no read.
  void add(const Tensor& logits, const Tensor& labels, const Tensor& mean_loss);

  struct Totals {
    double loss_sum = 0.0;  // sum over batches of each batch's mean loss
    int64_t correct = 0;
    int64_t samples = 0;
    int64_t batches = 0;
  };
  Totals read() const;  // one copy to the host

 private:
  Tensor totals_;  // kernels::ClassificationTotals (kernels/metrics.h), 32 bytes
};

}  // namespace cumulus::ops
