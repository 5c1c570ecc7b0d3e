// The per-element optimizer rules, shared by the CPU loop (kernels/cpu/optim.cpp) and the CUDA
// kernels (kernels/cuda/optim.cu), so both devices apply literally the same arithmetic. The rules
// are multiplies, adds, a division and sqrtf, each IEEE-rounded on both devices as long as neither
// compiler fuses a multiply-add: optim.cu is in CUMULUS_CUDA_BITWISE_FILES (--fmad=false) and
// optim.cpp is compiled with -ffp-contract=off (Note [CUDA bit parity] in CMakeLists.txt). So given
// the same gradient and the same decision (grad_scale, lr, AdamW's constants) an update gives the
// same bits on both. What can still differ: the decision's inputs, the gradient norm (a double sum
// in each device's own order) and AdamW's bias corrections (pow in double: CUDA documents 2 ulp
// where glibc's is correctly rounded, so the float constants differ only where a double result
// lies within 2 ulp of a float rounding boundary).
#pragma once

#include <cmath>
#include <cstdint>

#include "cumulus/optim/update_scalars.h"
#include "kernels/host_device.h"

namespace cumulus::kernels {

// Note [Device-side step]
// Everything an optimizer step decides lives in device memory (host memory on the CPU), so a CUDA
// step never waits for the host and can be captured in a graph: micro-batches add their unit count
// and summed loss into the Trainer's StepState (record_micro_batch), the step's first kernel
// reduces the gradient's squared norm and decides in its last block (prepare_step: normalization,
// clipping, the non-finite skip, the learning rate from a table), and writes the decision into the
// optimizer's UpdateScalars, which the update kernel reads. The host reads the state only when
// asked for a counter (a progress line, the end of an epoch, a checkpoint). The CPU runs the same
// rules on the same structs, so both devices decide identically.

using optim::FrozenChunks;
using optim::UpdateScalars;

// A count of units (samples, tokens) and the loss summed over them.
struct UnitsAndLoss {
  double units;
  double loss;
};

struct StepState {
  UnitsAndLoss group;  // the group in flight: added to by each micro-batch, cleared by the step attempt
  UnitsAndLoss epoch;  // every group attempted since the last clear (the epoch's)
  // The decision of the last attempt.
  float grad_norm;  // L2 norm of the normalized gradient before clipping; NaN if not computed
  float clip;       // the clipping factor applied (1: none)
  int64_t skipped;  // attempts skipped as non-finite
  int64_t lr_base;  // the update index of lr_table[0]
  // Dynamic loss scaling (Note [Loss scaling] in engine/train/trainer_step.cpp): the factor of the
  // backward seed for the group in flight, and the groups stepped since it last changed.
  float loss_scale;
  int32_t loss_scale_clean_steps;
};

// How the Trainer normalizes and guards; kernel arguments, constant for a run.
struct StepConfig {
  int32_t divide_by_units;  // 1: grad_scale starts at 1 / group.units (Normalization::units)
  int32_t need_norm;        // compute the norm (clipping or the non-finite guard is on)
  int32_t skip_non_finite;
  float clip_grad_norm;   // > 0: clip the normalized norm to this
  int32_t lr_table_size;  // entries of lr_table (lr for update lr_base + i); the last one holds
  // Dynamic loss scaling: 0 off (loss_scale unused); else the gradient is divided by loss_scale,
  // a skipped group multiplies it by backoff, but never below loss_scale_min, growth_interval clean
  // groups in a row by growth, but never to infinity.
  int32_t dynamic_loss_scale;
  int32_t loss_scale_growth_interval;
  float loss_scale_growth;
  float loss_scale_backoff;
  float loss_scale_min;  // a power of two >= the smallest normal f32, 2^-126: 1 / it is finite
};

// The step's device memory: the state, the per-block partial sums of the gradient's squared norm,
// the counter that finds the last block and, where the norm spans ranks, their sum (kernels/cuda/
// optim.cu). One allocation.
struct StepBuffers {
  static constexpr int kNormPartials = 256;  // blocks of the norm reduction: fixed, so deterministic
  StepState state;
  double partials[kNormPartials];
  uint32_t blocks_done;
  uint32_t reserved;
  double sum_squares;  // grad_sum_squares_cuda's, all-reduced across ranks (ZeRO stage 2)
};

CUMULUS_HOST_DEVICE void record_micro_batch(StepState& s, double units, double loss) {
  s.group.units += units;
  s.group.loss += loss;
}

// Dynamic loss scaling's rule (Note [Loss scaling] in engine/train/trainer_step.cpp), after the
// skip decision. Powers of two times powers of two stay powers of two, so unscaling stays exact.
// The floor and the ceiling keep the scale usable: backed off to 0, the seed would be 0 and 1 / 0
// infinite, so every later group would be skipped; grown to infinity, every group would overflow.
CUMULUS_HOST_DEVICE void update_loss_scale(StepState& s, bool skipped, const StepConfig& c) {
  if (skipped) {
    const float lower = s.loss_scale * c.loss_scale_backoff;
    s.loss_scale = lower < c.loss_scale_min ? c.loss_scale_min : lower;  // held at the floor
    s.loss_scale_clean_steps = 0;
  } else if (++s.loss_scale_clean_steps >= c.loss_scale_growth_interval) {
    const float higher = s.loss_scale * c.loss_scale_growth;
    if (std::isfinite(higher)) s.loss_scale = higher;  // else held at the largest finite power of two
    s.loss_scale_clean_steps = 0;
  }
}

// The step decision of Note [Device-side step]: `sum_squares` is the squared L2 norm of the
// accumulated gradient; `u` receives what the update reads.
CUMULUS_HOST_DEVICE void prepare_step(StepState& s, UpdateScalars& u, double sum_squares, const StepConfig& c,
                                      const float* lr_table) {
  float scale = c.divide_by_units ? 1.0f / static_cast<float>(s.group.units) : 1.0f;
  if (c.dynamic_loss_scale) scale /= s.loss_scale;  // a power of two: exact
  float clip = 1.0f;
  s.grad_norm = NAN;
  u.skip = 0;
  if (c.need_norm) {
    const double norm = std::sqrt(sum_squares) * scale;
    s.grad_norm = static_cast<float>(norm);
    if (!std::isfinite(norm) && c.skip_non_finite) u.skip = 1;
    else if (c.clip_grad_norm > 0.0f && norm > c.clip_grad_norm)
      clip = static_cast<float>(c.clip_grad_norm / (norm + 1e-6));
  }
  if (c.dynamic_loss_scale) update_loss_scale(s, u.skip != 0, c);
  if (u.skip) {
    s.skipped += 1;
  } else {
    int64_t i = u.updates - s.lr_base;
    i = i < 0 ? 0 : (i >= c.lr_table_size ? c.lr_table_size - 1 : i);
    s.clip = clip;
    u.grad_scale = scale * clip;
    u.lr = lr_table[i];
    u.updates += 1;
  }
  s.epoch.loss += s.group.loss;
  s.epoch.units += s.group.units;
  s.group.loss = 0.0;
  s.group.units = 0.0;
}

// An update with scalars given by the caller (Optimizer::step outside a Trainer).
CUMULUS_HOST_DEVICE void set_step(UpdateScalars& u, float grad_scale, float lr) {
  u.skip = 0;
  u.grad_scale = grad_scale;
  u.lr = lr;
  u.updates += 1;
}

// Note [Frozen parameters]
// A parameter frozen after the optimizer exists (set_requires_grad(false)) must be left bit-identical
// by every update: no weight decay, no momentum, no Adam step, as PyTorch leaves a parameter alone
// while it has no gradient. The update stays one pass over the flat arrays (one launch on CUDA, no
// host synchronization) by reading a mask: FlatParameters aligns every slot to 64 elements, so each
// chunk of 64 belongs to one parameter, and FlatParameters::refresh_frozen writes one byte per chunk
// (1: frozen) from the slots' requires_grad before each step's device part (host work, a small copy
// only when a parameter changed; never inside a captured graph, which reads the mask's memory).
// Until a parameter is first frozen there is no mask (null) and the kernels run their plain loop.
// - A frozen chunk is skipped whole, its optimizer state included; the update that skips it counts
//   it in the optimizer's per-chunk `missed` (Optimizer::prepare_frozen allocates it with the mask).
// - Unfrozen again, a parameter resumes its own state, as in PyTorch where state['step'] is per
//   parameter: its update count is the optimizer's minus the updates it missed, so Adam's bias
//   corrections and SGD's first-update rule (momentum buffer = gradient) are those of its own
//   updates. A parameter frozen before its first update starts as a fresh one. Such chunks compute
//   Adam's constants themselves (two pows in double: per chunk on the CPU, per element on CUDA).
// - Its gradient is not touched: backward writes none while it is frozen (the slot stays stale and
//   is zeroed for the norm); a gradient left from before the freeze still counts in the clipping
//   norm, as clip_grad_norm_ over all parameters with a gradient would.
// - A skipped (non-finite) step updates nothing and counts nothing, frozen chunks included.
// - Data parallel: a frozen slot never reports a finished gradient, so its bucket is reduced at the
//   step instead of during backward (its zeros; correct, only later).
// - A parameter frozen before FlatParameters(model) gets no slot at all (it stays out if unfrozen).

}  // namespace cumulus::kernels

namespace cumulus::kernels::rules {

// Element i's own update count for an update that makes the optimizer's count `updates` (Adam's t,
// SGD's first update at 1), or 0 when its chunk is frozen: the update leaves the element alone, and
// the call for the chunk's first element counts the missed update (Note [Frozen parameters]).
CUMULUS_HOST_DEVICE int64_t own_updates(const FrozenChunks& f, int64_t i, int64_t updates) {
  if (f.frozen == nullptr) return updates;
  const int64_t c = i / FrozenChunks::kChunk;
  if (f.frozen[c]) {
    if (i % FrozenChunks::kChunk == 0) f.missed[c] += 1;
    return 0;
  }
  return updates - f.missed[c];
}

// AdamW's per-step constants for update t (1-based): step_size = lr / (1 - beta1^t) and
// bc2_sqrt = sqrt(1 - beta2^t), the powers in double as torch.optim.AdamW computes them.
CUMULUS_HOST_DEVICE void adamw_constants(float lr, float beta1, float beta2, int64_t t, float& step_size,
                                         float& bc2_sqrt) {
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(t)));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(t)));
  step_size = lr / bc1;
  bc2_sqrt = std::sqrt(bc2);
}

// The rules below take T = float, or on the CPU a vector of floats (kernels/cpu/optim_8bit_vec.h),
// whose lanes then go through the same operations in the same order: the same bits per element.
// SquareRoot<T>::of is sqrtf for float; the vector files specialize it for their lane types.
template <typename T>
struct SquareRoot;
template <>
struct SquareRoot<float> {
  CUMULUS_HOST_DEVICE static float of(float x) { return sqrtf(x); }
};

// torch.optim.SGD: g = s*grad + wd*w; b = g (first) or mu*b + (1-dampening)*g;
// d = nesterov ? g + mu*b : b; w -= lr*d. `buf` is unused when momentum is 0.
template <typename T>
CUMULUS_HOST_DEVICE void sgd(T& w, T grad, T* buf, float grad_scale, float lr, float momentum, float dampening,
                             bool nesterov, float weight_decay, bool first) {
  T g = grad_scale * grad + weight_decay * w;
  if (momentum != 0.0f) {
    const T b = first ? g : momentum * *buf + (1.0f - dampening) * g;
    *buf = b;
    g = nesterov ? g + momentum * b : b;
  }
  w -= lr * g;
}

// torch.optim.AdamW: w *= 1 - lr*wd; m, v moving averages; w -= step_size * m / (sqrt(v)/bc2_sqrt + eps)
// with step_size = lr / (1 - beta1^t) and bc2_sqrt = sqrt(1 - beta2^t).
template <typename T>
CUMULUS_HOST_DEVICE void adamw(T& w, T grad, T& m, T& v, float grad_scale, float lr, float beta1, float beta2,
                               float eps, float weight_decay, float step_size, float bc2_sqrt) {
  const T g = grad_scale * grad;
  w *= 1.0f - lr * weight_decay;
  m = beta1 * m + (1.0f - beta1) * g;
  v = beta2 * v + (1.0f - beta2) * g * g;
  w -= step_size * m / (SquareRoot<T>::of(v) / bc2_sqrt + eps);
}

}  // namespace cumulus::kernels::rules
