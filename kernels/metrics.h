// Device-side evaluation totals, shared by the CPU loop (kernels/cpu/cross_entropy.cpp) and the
// CUDA kernel (kernels/cuda/cross_entropy.cu): a test pass adds every batch into one of these in
// device memory (host memory on the CPU) and the host reads it once at the end
// (ops::ClassificationTally).
#pragma once

#include <cstdint>

namespace cumulus::kernels {

struct ClassificationTotals {
  double loss_sum;  // the batches' mean losses, summed in double (as the seed's Python loop does)
  int64_t correct;  // rows whose top-1 prediction equals the label
  int64_t samples;
  int64_t batches;
};

}  // namespace cumulus::kernels
