#include "step_state.h"

#include <memory>
#include <utility>

#include "engine/tensor/tensor_impl.h"

namespace cumulus::train {

StepStateMemory::StepStateMemory(const Device& device) {
  MemoryCategoryScope scope(MemoryCategory::other);
  memory_ = Tensor::zeros(Shape{static_cast<int64_t>(sizeof(kernels::StepBuffers))}, DType::u8, device);
}

kernels::StepState StepStateMemory::read() const {
  kernels::StepState s;
  copy_bytes(&s, Device::cpu(), state(), memory_.device(), sizeof(s));
  return s;
}

void StepStateMemory::write_bytes(std::size_t at, const void* value, std::size_t bytes) {
  copy_bytes(static_cast<char*>(memory_.raw_data()) + at, memory_.device(), value, Device::cpu(), bytes);
}

Tensor StepStateMemory::view(float kernels::StepState::*field, const Shape& shape) const {
  CUMULUS_CHECK(shape.numel() == 1, InvalidArgument, "StepStateMemory::view: shape ", shape.str());
  auto v = std::make_shared<TensorImpl>();
  v->storage = impl_of(memory_)->storage;
  v->offset_bytes = impl_of(memory_)->offset_bytes + offset_of(field);
  v->shape = shape;
  v->dtype = DType::f32;
  return make_tensor(std::move(v));
}

}  // namespace cumulus::train
