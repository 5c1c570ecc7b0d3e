// What a Tensor is made of: its storage, its view geometry and its autograd state. Internal to the
// engine (not installed): the public Tensor holds a pointer to a TensorImpl, and only engine code
// reaches it, through impl_of() and make_tensor().
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "cumulus/tensor/tensor.h"

namespace cumulus {

// One allocation on one device; shared by a tensor and its views.
struct Storage {
  Allocation memory;
  Device device;
  // Allocated with no MemoryCategoryScope open (category other): if it becomes an autograd node's
  // output, it is counted as an activation (Note [Custom op outputs are activations]).
  bool category_by_default = false;
};

struct AutogradMeta {
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;  // null for leaves
  Tensor grad;                    // leaves: the persistent gradient buffer
  bool grad_stale = true;         // buffer contents are logically zero
  StaleReason stale_reason = StaleReason::no_backward;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  std::size_t offset_bytes = 0;
  Shape shape;
  bool contiguous = true;
  std::array<int64_t, Shape::kMaxDims> strides{};  // in elements; set only when !contiguous
  DType dtype = DType::f32;
  AutogradMeta autograd;
};

struct TensorAccess {
  static const std::shared_ptr<TensorImpl>& impl(const Tensor& t) { return t.impl_; }
  static Tensor wrap(std::shared_ptr<TensorImpl> impl) { return Tensor(std::move(impl)); }
};

// The tensor's implementation (null for an undefined tensor), and a tensor over one.
inline const std::shared_ptr<TensorImpl>& impl_of(const Tensor& t) { return TensorAccess::impl(t); }
inline Tensor make_tensor(std::shared_ptr<TensorImpl> impl) { return TensorAccess::wrap(std::move(impl)); }

// An uninitialized tensor of `allocator`'s memory (on its device), in `category`: the tensors of a
// pool other than the device's own (host_state_allocator()).
Tensor empty_from(CachingAllocator& allocator, const Shape& shape, DType dtype, MemoryCategory category);

// Whether the caller's reference is the only one to the tensor and to its storage, so that writing
// it in place changes nothing anyone else can see (a backward's dy, a pending gradient).
inline bool sole_owner(const Tensor& t) {
  return impl_of(t).use_count() == 1 && impl_of(t)->storage.use_count() == 1;
}

}  // namespace cumulus
