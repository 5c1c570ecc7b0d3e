// Modules for the activations (ReLU, GELU, SiLU, Tanh, Sigmoid) and dropout (ops in cumulus/ops/pointwise.h). None has
// parameters or buffers, so they add nothing to a state dict, as PyTorch's.
#pragma once

#include <cstdint>

#include "cumulus/nn/module.h"
#include "cumulus/ops/pointwise.h"

namespace cumulus::nn {

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

class GELU : public Module {
 public:
  explicit GELU(ops::GeluApproximation approximate = ops::GeluApproximation::none) : approximate_(approximate) {}
  Tensor forward(const Tensor& x) override { return ops::gelu(x, approximate_); }

 private:
  ops::GeluApproximation approximate_;
};

// PyTorch's nn.SiLU: x * sigmoid(x) (ops::silu).
class SiLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return ops::silu(x); }
};

class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) override { return ops::tanh(x); }
};

class Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& x) override { return ops::sigmoid(x); }
};

// ops::dropout with probability p while the module is training (the identity in eval mode). Each
// training call uses the offset `calls()` and advances it, so successive micro-batches get
// different masks and a run is reproducible from the seed (and from a restored offset: set_calls).
// The count lives on the device of the module's input and advances there, so a CUDA graph replay of
// a training micro-batch draws a fresh mask like an eager call (Note [Dropout offsets on the
// device] in engine/ops/dropout.cpp); reading it (calls()) waits for the device.
// Inside a recompute segment (Note [Recompute] in engine/autograd/checkpoint.cpp) the recomputed
// forward reuses the offset of the module's last call and does not advance: the mask is the first
// run's, so the gradients are a stored run's. That holds when the module runs once per forward, as
// a layer of a Sequential does; a Dropout called twice inside one checkpointed segment would replay
// its second mask for both calls (use two modules).
class Dropout : public Module {
 public:
  explicit Dropout(float p = 0.5f, uint64_t seed = 0);
  Tensor forward(const Tensor& x) override;
  float p() const { return p_; }
  uint64_t seed() const { return seed_; }
  // Training calls so far: the offset of the next one.
  uint64_t calls() const;
  void set_calls(uint64_t calls);

 private:
  float p_;
  uint64_t seed_;
  uint64_t initial_calls_ = 0;  // the count until the first training call makes counter_
  Tensor counter_;              // one i64 on the device of the last training call: the next offset
  Tensor last_offset_;          // the offset the last training call took (a recomputation reuses it)
};

}  // namespace cumulus::nn
