// The Trainer's device-side step state (kernels::StepState, Note [Device-side step] in
// kernels/optim_rules.h) with the norm's scratch, in the parameters' memory: the host reads it
// whole and writes one field at a time, by the field's name.
#pragma once

#include <cstddef>

#include "cumulus/tensor/tensor.h"
#include "kernels/optim_rules.h"

namespace cumulus::train {

class StepStateMemory {
 public:
  explicit StepStateMemory(const Device& device);

  // The memory the step's kernels read and write.
  kernels::StepBuffers* buffers() const { return static_cast<kernels::StepBuffers*>(memory_.raw_data()); }
  kernels::StepState* state() const { return &buffers()->state; }
  // The state as of now: on CUDA it waits for the queued work (a host synchronization).
  kernels::StepState read() const;
  // Queues a write of one field: state.write(&kernels::StepState::loss_scale, 1.0f).
  template <class T>
  void write(T kernels::StepState::*field, const T& value) {
    write_bytes(offset_of(field), &value, sizeof(T));
  }
  // The f32 `field` as a one-element tensor of `shape` sharing its memory: the loss scale, which
  // backward reads as its seed (Note [Loss scaling]).
  Tensor view(float kernels::StepState::*field, const Shape& shape) const;

 private:
  // Where `field` lies in the memory, measured on a host object of the same type.
  template <class T>
  static std::size_t offset_of(T kernels::StepState::*field) {
    static const kernels::StepBuffers probe{};
    return static_cast<std::size_t>(reinterpret_cast<const char*>(&(probe.state.*field)) -
                                    reinterpret_cast<const char*>(&probe));
  }
  void write_bytes(std::size_t at, const void* value, std::size_t bytes);

  Tensor memory_;  // one kernels::StepBuffers, category other
};

}  // namespace cumulus::train
