// Losses, forward with autograd recording (engine/ops/cross_entropy.cpp).
#pragma once

#include <cstdint>

#include "cumulus/tensor/tensor.h"

namespace cumulus::ops {

// PyTorch's reduction argument: Sum, Mean, or None (one value per element: reduction='none').
enum class Reduction { Sum, Mean, None };

// logits: [..., C] f32, bf16 or f16 (C > 0), labels: [...] i32 or i64 in [0, C) (the logits' shape
// without its last dimension: [B] for [B, C]) -> each position's loss
// logsumexp(logits_i) - logits_i[label_i], taken around the row maximum, f32:
//   Reduction::None  shaped as labels; a position whose label is ignore_index gives 0
//   Reduction::Sum   a scalar, the sum over the positions (ignored ones add 0)
//   Reduction::Mean  a scalar, the sum divided by the number of positions not ignored (NaN when all
//                    are, as PyTorch)
// ignore_index (PyTorch's default -100): positions with that label add no loss and no gradient.
// PyTorch's [N, C, d1, ...] layout is not taken: the classes are the last dimension.
// A label outside [0, C) (and not ignore_index) is an InvalidArgument on CPU and gives a NaN loss on
// CUDA (the kernel cannot throw, and checking on the host would cost a synchronization every
// micro-batch).
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, Reduction reduction = Reduction::Mean,
                     int64_t ignore_index = -100);

}  // namespace cumulus::ops
