// Gradient clipping for a training loop written by hand (train::Trainer clips on its own: its
// AccumulationOptions::clip_grad_norm).
#pragma once

#include "cumulus/nn/flat_parameters.h"

namespace cumulus::nn {

// PyTorch's torch.nn.utils.clip_grad_norm_(parameters, max_norm) over the gradients of
// `parameters` (an optimizer's: optimizer.parameters()): returns their global L2 norm and, when it
// is above max_norm (> 0), scales every gradient in place by max_norm / (norm + 1e-6), as PyTorch.
// The norm and the factor come from the Trainer's own kernels and rule (kernels::prepare_step over
// the flat gradient, Note [Device-side step] in kernels/optim_rules.h), so clipping here and then
// optimizer.step() gives the bits of a Trainer clipping the same gradients (normalization none, the
// non-finite guard off). Stale gradients count as zeros. A NaN norm leaves the gradients as they
// are and an infinite one scales them by 0 (the Trainer's skip_non_finite is the guard that skips
// such a step). On CUDA, reading the norm waits for the device.
float clip_grad_norm(FlatParameters& parameters, float max_norm);

}  // namespace cumulus::nn
