// Tensor: a cheap, shared handle (like torch.Tensor) over reference-counted Storage, up to 8-D.
// Dense and row-major, or a strided view of another tensor's storage (Note [Strided views] in
// engine/ops/view.cpp). Views (reshape, flatten, detach, transpose, permute, narrow, expand) share
// storage; copies are explicit (clone, to, contiguous). Autograd state lives beside the data: requires_grad, grad_fn,
// and for leaves the persistent gradient buffer (see Note [Persistent gradient buffers] in autograd/engine.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <type_traits>
#include <vector>

#include "cumulus/core/device.h"
#include "cumulus/core/error.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/tensor/dtype.h"
#include "cumulus/tensor/shape.h"

namespace cumulus {

class Node;
struct TensorImpl;  // engine/tensor/tensor_impl.h

// The C++ element types a tensor exchanges with host vectors (from_vector, to_vector): float (f32),
// int32_t (i32), int64_t (i64), uint8_t (u8). data<T>() also takes BFloat16 and Half. Any other
// type is a compile error naming these, never a link error.
template <typename T>
inline constexpr bool kHostElementType =
    std::is_same_v<T, float> || std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t> || std::is_same_v<T, uint8_t>;
template <typename T>
inline constexpr bool kStorageElementType =
    kHostElementType<T> || std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>;

// Why a leaf's gradient buffer is stale (logically zero), so that grad() can say why it returns an
// undefined tensor (Note [Why a gradient is undefined] in engine/tensor/tensor.cpp).
enum class StaleReason : uint8_t {
  no_backward,     // no backward has written the buffer since it was made
  zero_grad,       // zero_grad() or mark_grad_stale()
  optimizer_step,  // the Trainer's step used the gradient and released it
  sharded,         // reduced across ranks each micro-batch and released (ZeRO stage 2): the flat sum only
};

class Tensor {
 public:
  Tensor() = default;  // undefined

  // ---- factories (category from the innermost MemoryCategoryScope, else `other`; a tensor made
  // outside any scope that becomes a recorded op's output counts as an activation) ----
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  // torch.full and torch.ones: every element `value` (1), in dtype on device; the f32 form without
  // a dtype. A 16-bit type rounds the value once (to nearest even); an integer type (i32, i64, u8)
  // takes only a whole value it can hold (PyTorch truncates 1.5 to 1 silently; here it is refused).
  static Tensor full(const Shape& shape, float value, Device device = Device::cpu());
  static Tensor full(const Shape& shape, float value, DType dtype, Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  // T: float, int32_t, int64_t or uint8_t (kHostElementType).
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape, Device device = Device::cpu()) {
    static_assert(
        kHostElementType<T>,
        "Tensor::from_vector: the element type must be float (f32), int32_t (i32), int64_t (i64) or uint8_t (u8)");
    if constexpr (kHostElementType<T>)
      return from_host(values.data(), values.size(), dtype_of<T>::value, shape, device);
    else return Tensor();
  }

  // ---- metadata ----
  bool defined() const { return impl_ != nullptr; }
  // Why this tensor is undefined, when the call that returned it said (grad() does); else nullptr.
  // Using an undefined tensor throws with this reason in the message.
  const char* undefined_reason() const { return impl_ == nullptr ? undefined_reason_ : nullptr; }
  const Shape& shape() const;
  int ndim() const { return shape().ndim(); }
  int64_t size(int dim) const;  // negative dims count from the end
  int64_t numel() const;
  DType dtype() const;
  Device device() const;
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype()); }
  // Bytes of the allocation behind this tensor (rounded as the allocator counts them; a view
  // reports its whole storage).
  std::size_t allocated_bytes() const;
  // Memory category of the underlying block (for tests and reports).
  MemoryCategory memory_category() const;

  // ---- layout ----
  // Whether the elements are dense and row-major: every tensor but a strided view.
  bool is_contiguous() const;
  int64_t stride(int dim) const;         // in elements; negative dims count from the end
  std::vector<int64_t> strides() const;  // in elements
  // This tensor when contiguous, else a dense copy (recorded by autograd).
  Tensor contiguous() const;

  // ---- data ----
  // The first element; device pointer on CUDA. Contiguous tensors only (a strided view's elements
  // are not where a flat index would look): call contiguous() first.
  void* raw_data() const;
  // Checks the dtype. T: float, int32_t, int64_t, uint8_t, BFloat16 or Half (kStorageElementType).
  template <typename T>
  T* data() const {
    static_assert(kStorageElementType<T>,
                  "Tensor::data: the element type must be float, int32_t, int64_t, uint8_t, BFloat16 or Half");
    if constexpr (kStorageElementType<T>) return static_cast<T*>(typed_data(dtype_of<T>::value));
    else return nullptr;
  }
  // Copies to the host (synchronizes). T: float, int32_t, int64_t or uint8_t (kHostElementType).
  template <typename T>
  std::vector<T> to_vector() const {
    static_assert(
        kHostElementType<T>,
        "Tensor::to_vector: the element type must be float (f32), int32_t (i32), int64_t (i64) or uint8_t (u8)");
    std::vector<T> out;
    if constexpr (kHostElementType<T>) {
      out.resize(static_cast<std::size_t>(numel()));
      to_host(out.data(), dtype_of<T>::value);
    }
    return out;
  }
  float item() const;                // the one element of an f32 tensor

  // ---- copies and views ----
  Tensor to(Device device) const;  // a copy on `device` (the same tensor if already there)
  // A copy in `dtype` on the same device (the same tensor if already that type), outside the graph:
  // f32 to bf16 or f16 rounds to nearest even, the other way is exact, bf16 <-> f16 goes through
  // f32 (one rounding). Note [Half-precision conversions] in kernels/float16.h. Other pairs throw.
  Tensor to(DType dtype) const;
  Tensor clone() const;            // a copy on the same device, outside the graph
  Tensor detach() const;           // shares storage, outside the graph
  Tensor reshape(const Shape& shape) const;                    // ops::reshape: a view of a dense tensor; recorded
  Tensor reshape(std::initializer_list<int64_t> sizes) const;  // one size may be -1
  Tensor flatten(int start_dim = 1) const;   // a view; recorded by autograd
  Tensor transpose(int dim0, int dim1) const;          // ops::transpose: a view
  Tensor permute(const std::vector<int>& dims) const;  // ops::permute: a view
  // Rows [start, start + length) along dim 0: a view (a batch of a dataset). Not recorded by
  // autograd, so not allowed on tensors that require grad.
  Tensor narrow_rows(int64_t start, int64_t length) const;
  // Same shape and dtype, any devices; either side may be a strided view when both are on one
  // device (a key/value cache written a slice at a time).
  void copy_from(const Tensor& src);

  // ---- autograd ----
  bool requires_grad() const;
  // Leaves only. Freezing a parameter (false) after its optimizer exists makes every update leave it
  // alone until it requires grad again (Note [Frozen parameters] in kernels/optim_rules.h).
  Tensor& set_requires_grad(bool on);
  bool is_leaf() const;
  const std::shared_ptr<Node>& grad_fn() const;
  // The accumulated gradient, or an undefined tensor if none was accumulated since the buffer
  // was marked stale (the equivalent of PyTorch's `grad is None` after zero_grad()). The undefined
  // tensor carries the reason (undefined_reason()): after a Trainer step, for instance, that
  // the step released the gradient, and how to read it (before the step, or grad_buffer()).
  Tensor grad() const;
  // The persistent buffer itself, whatever its state (undefined until first allocated). After an
  // Trainer step it still holds the group's summed gradient until the next backward writes it.
  Tensor grad_buffer() const;
  bool grad_stale() const;
  // The next backward overwrites the buffer instead of adding to it (zero_grad that costs nothing);
  // `why` is what grad() reports meanwhile.
  void mark_grad_stale(StaleReason why = StaleReason::zero_grad) const;
  // Allocates the persistent buffer now (category gradients) instead of at the first backward.
  void allocate_grad() const;
  // Reverse-mode from this scalar; the seed gradient is 1.
  void backward() const;

  std::string str() const;  // "Tensor[64, 784] f32 cpu"
  // The same tensor (one handle's copy, as a tied weight under two names), and tensors over the
  // same storage (a view and its base).
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  bool shares_storage(const Tensor& other) const;

 private:
  // The engine's own access to what a tensor is made of (engine/tensor/tensor_impl.h).
  friend struct TensorAccess;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}
  // The untyped halves of from_vector, data and to_vector: each checks the dtype against the
  // element type's.
  static Tensor from_host(const void* values, std::size_t count, DType dtype, const Shape& shape, Device device);
  void* typed_data(DType dtype) const;
  void to_host(void* out, DType dtype) const;
  TensorImpl& checked() const;
  std::shared_ptr<TensorImpl> impl_;
  const char* undefined_reason_ = nullptr;  // a string literal; only while impl_ is null
};

// Raw copy of `bytes` bytes between any two devices (synchronizes when the host reads).
void copy_bytes(void* dst, const Device& dst_device, const void* src, const Device& src_device,
                std::size_t bytes);

}  // namespace cumulus
