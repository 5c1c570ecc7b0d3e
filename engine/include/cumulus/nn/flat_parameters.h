// FlatParameters: packs a model's parameters into one contiguous buffer and their gradients into
// another (docs/ARCHITECTURE.md, "Gradients and accumulation"; llm.c and Megatron do the same).
// Every parameter, and its persistent gradient buffer, becomes a view at a fixed offset, so the
// optimizer update, the global gradient norm and the stale marking are each one pass over one
// array: one launch on CUDA, whatever the number of parameters. Offsets are aligned to 64
// elements (256 B).
#pragma once

#include <string>
#include <vector>

#include "cumulus/nn/module.h"

namespace cumulus::nn {

class FlatParameters {
 public:
  static constexpr int64_t kAlignElements = 64;

  struct Slot {
    std::string name;
    Tensor param;  // the model's own handle, now a view into values()
    int64_t offset;
    int64_t numel;
  };

  // Moves every parameter of `model` that requires grad (and its gradient buffer) into the flat
  // buffers, keeping values; a shared one once (Note [Shared parameters] in nn/module.h). The
  // model's tensor handles stay valid and point into the flat storage afterwards. Frozen
  // parameters (requires_grad false) are left out, and stay out if unfrozen later: to train a
  // parameter in phases, freeze it after this instead (Note [Frozen parameters] in
  // kernels/optim_rules.h: the optimizer then leaves it alone until it is unfrozen).
  explicit FlatParameters(const Module& model);
  // The same for named leaf tensors that require grad (all f32, on one device, each once: a tensor
  // listed twice is an InvalidArgument). Do this before any forward: tensors saved by a recorded
  // graph would still point at the old storage.
  explicit FlatParameters(const std::vector<std::pair<std::string, Tensor>>& named);

  const std::vector<Slot>& slots() const { return slots_; }
  const Tensor& values() const { return values_; }     // [size] f32, category parameters
  // [size] f32, category gradients; with sharded gradients, elements [gradients_offset(),
  // gradients_offset() + gradients().numel()) of it only.
  const Tensor& gradients() const { return grads_; }
  int64_t gradients_offset() const { return grads_offset_; }
  int64_t size() const { return values_.numel(); }     // including alignment padding
  int64_t num_parameters() const;                      // excluding padding
  Device device() const { return values_.device(); }

  // ---- gradients kept for a shard only (ZeRO stage 2: Note [ZeRO stage 2] in
  // engine/dist/sharded_gradients.cpp) ----
  // Frees the flat gradient and keeps the elements [offset, offset + count) in a buffer of their
  // own, zeros; the parameters' gradient buffers are released (marked StaleReason::sharded), so a
  // backward gives each a buffer through its LeafGradientBuffer (a no-op where this shard is kept
  // already, InvalidArgument for another). unshard_gradients() undoes it: a flat gradient again,
  // every slot stale. zero_stale_gradients() leaves a shard alone (what the
  // ranks reduce into it is whole) and gradient_sum_of_squares() refuses one (the norm is all ranks').
  void shard_gradients(int64_t offset, int64_t count);
  void unshard_gradients();
  bool gradients_sharded() const { return sharded_; }

  // Whether any slot holds an accumulated (non-stale) gradient.
  bool any_gradient() const;
  // sum of squares of the flat gradient (stale slots zeroed first); synchronizes on CUDA.
  double gradient_sum_of_squares() const;
  // Zeroes the gradient slice of every stale slot (and the padding is always zero), so a pass over
  // gradients() sees exact zeros where no backward wrote. Cheap when nothing is stale.
  void zero_stale_gradients() const;
  // `why`: what each parameter's grad() reports until the next backward (Tensor::mark_grad_stale).
  void mark_gradients_stale(StaleReason why = StaleReason::zero_grad) const;

  // ---- frozen parameters (Note [Frozen parameters] in kernels/optim_rules.h) ----
  // Re-reads which slots are frozen (requires_grad false) into the mask the optimizer's update
  // reads: host work before a step's device part (a small copy when a slot changed), never during
  // a graph capture. The mask is allocated when a slot is first frozen, or now if `need_mask`.
  void refresh_frozen(bool need_mask = false);
  // One byte per kAlignElements elements, 1 where frozen (as of the last refresh_frozen); null
  // until a mask was needed.
  const uint8_t* frozen_chunks() const;
  int64_t num_chunks() const { return size() / kAlignElements; }

 private:
  std::vector<Slot> slots_;
  Tensor values_, grads_;
  int64_t grads_offset_ = 0;
  bool sharded_ = false;
  Tensor frozen_mask_;             // u8 [num_chunks()], category other; undefined until needed
  std::vector<bool> slot_frozen_;  // what frozen_mask_ holds, per slot
};

}  // namespace cumulus::nn
