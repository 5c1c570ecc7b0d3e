// Model: a network as a training loop sees it, whatever its type. The app, the planner and a
// user's own loop ask every model the same things through this interface (the loss of a
// micro-batch, activation checkpointing, the kernels, a name for reports), so no caller needs to
// know which model it trains. A model that overrides only forward() and name() trains with the
// cross-entropy of its logits, on the generic kernels, with every activation stored.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cumulus/core/device.h"
#include "cumulus/nn/module.h"
#include "cumulus/ops/linear.h"
#include "cumulus/ops/loss.h"
#include "cumulus/tensor/dtype.h"

namespace cumulus::nn {

// The kernels a model's training loss runs on: a fused op of the model's own (the seed MLP's
// ops::mlp_cross_entropy, Note [Fused MLP] in engine/ops/fused_mlp.cpp), the generic ops (one op
// per layer: the reference, and what every model has), or the model's choice by device, dtype and
// micro-batch size.
enum class KernelChoice { automatic, fused, generic };
const char* kernel_choice_name(KernelChoice choice);  // "auto", "fused", "generic"
// The choice named `name`; false for an unknown name.
bool parse_kernel_choice(const std::string& name, KernelChoice& choice);

class Model : public Module {
 public:
  // For reports and metrics ("seed_mlp", "cnn"): a model's name, not its C++ type's.
  virtual std::string name() const = 0;

  // The loss of a micro-batch (labels: i32 class indices), recorded for backward, summed or
  // averaged over its samples. Default: ops::cross_entropy(forward(x), labels, reduction).
  virtual Tensor loss(const Tensor& x, const Tensor& labels, ops::Reduction reduction);

  // Activation checkpointing (Note [Recompute] in engine/autograd/checkpoint.cpp): on, the model
  // recomputes activations of its choice in backward instead of keeping them; gradients do not
  // change. A model that offers none (the default) stores everything: set_recompute(false) does
  // nothing, set_recompute(true) is an InvalidArgument, so asking for the saving never silently
  // gets none.
  virtual bool offers_recompute() const { return false; }
  virtual Model& set_recompute(bool on);
  virtual bool recompute() const { return false; }
  // Recompute by segment, for a choice of some (the planner weighs every subset, Note [Plan levers]
  // in engine/plan/planner.cpp): the names of the segments set_recompute(true) recomputes, and
  // set_recompute_segments(mask) turns on those whose bit is set (bit i: segment i). Default: one
  // segment, "all", where the model offers recompute (mask 1 is set_recompute(true)), none where it
  // does not; a mask with a bit past the segments is an InvalidArgument.
  virtual std::vector<std::string> recompute_segment_names() const;
  virtual Model& set_recompute_segments(uint32_t mask);

  // Which kernels loss() runs. Default: the generic ones alone; `automatic` and `generic` are
  // taken, `fused` is an InvalidArgument.
  virtual Model& set_kernels(KernelChoice choice);
  // The kernels loss() would run a micro-batch of `batch` samples of `dtype` on `device` with:
  // fused or generic, never automatic. Default: generic.
  virtual KernelChoice kernels_for(Device device, DType dtype, int64_t batch) const;

  // Whether a training forward normalizes with statistics of its own micro-batch (batch norm):
  // then a sample's loss depends on the samples beside it, and accumulating micro-batches is not
  // one large batch (reports say so). Default: false.
  virtual bool uses_batch_statistics() const { return false; }
};

}  // namespace cumulus::nn
