#include "cumulus/tensor/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cumulus/autograd/node.h"
#include "cumulus/ops/shape.h"
#include "engine/ops/internal.h"
#include "engine/tensor/host_reads.h"
#include "engine/tensor/tensor_impl.h"

#if CUMULUS_WITH_CUDA
#include "engine/core/cuda_context.h"
#include "kernels/cuda/cuda_check.h"
#endif

namespace cumulus {

// ---- copies between devices ------------------------------------------------------------------

void copy_bytes(void* dst, const Device& dst_device, const void* src, const Device& src_device,
                std::size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if CUMULUS_WITH_CUDA
  // Queued on the CUDA device's stream, so it is ordered after the ops that produced `src` and
  // before those that will read `dst`. A host destination is complete when this returns.
  const Device& gpu = dst_device.is_cuda() ? dst_device : src_device;
  cuda::DeviceGuard guard(gpu.index());
  cudaStream_t s = cuda::stream(gpu.index());
  if (dst_device.is_cuda() && src_device.is_cuda() && dst_device != src_device) {
    // The copy runs on the destination's stream; the work that produces `src` is on the source's.
    cudaEvent_t produced = nullptr;
    {
      cuda::DeviceGuard source_guard(src_device.index());
      CUMULUS_CUDA_CHECK(cudaEventCreateWithFlags(&produced, cudaEventDisableTiming));
      CUMULUS_CUDA_CHECK(cudaEventRecord(produced, cuda::stream(src_device.index())));
    }
    const cudaError_t waited = cudaStreamWaitEvent(s, produced, 0);
    CUMULUS_CUDA_WARN(cudaEventDestroy(produced));  // released once the wait is satisfied
    CUMULUS_CUDA_CHECK(waited);
    CUMULUS_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device.index(), src, src_device.index(), bytes, s));
    cuda::synchronize_stream(s);
    return;
  }
  CUMULUS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
  if (dst_device.is_cpu()) cuda::synchronize_stream(s);
#else
  throw DeviceError("copy involving " + (dst_device.is_cuda() ? dst_device : src_device).str() +
                    ": cumulus was built without CUDA");
#endif
}

void read_to_host(const Device& device, std::initializer_list<HostRead> reads) {
  read_to_host(device, std::vector<HostRead>(reads));
}

void read_to_host(const Device& device, const std::vector<HostRead>& reads) {
  if (device.is_cpu()) {
    for (const HostRead& r : reads) std::memcpy(r.dst, r.src, r.bytes);
    return;
  }
#if CUMULUS_WITH_CUDA
  cuda::DeviceGuard guard(device.index());
  cudaStream_t s = cuda::stream(device.index());
  for (const HostRead& r : reads) CUMULUS_CUDA_CHECK(cudaMemcpyAsync(r.dst, r.src, r.bytes, cudaMemcpyDefault, s));
  cuda::synchronize_stream(s);
#else
  throw DeviceError("read from " + device.str() + ": cumulus was built without CUDA");
#endif
}

// ---- factories -------------------------------------------------------------------------------

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>();
  impl->storage->device = device;
  impl->storage->memory = allocator_for(device).allocate(static_cast<std::size_t>(shape.numel()) * dtype_size(dtype),
                                                         current_memory_category(unscoped_memory_category()));
  impl->storage->category_by_default = !memory_category_scope_open();
  impl->shape = shape;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor empty_from(CachingAllocator& allocator, const Shape& shape, DType dtype, MemoryCategory category) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>();
  impl->storage->device = allocator.device();
  impl->storage->memory = allocator.allocate(static_cast<std::size_t>(shape.numel()) * dtype_size(dtype), category);
  impl->shape = shape;
  impl->dtype = dtype;
  return make_tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (t.nbytes() == 0) return t;  // no storage: memset of a null pointer is undefined even for 0 bytes
  if (device.is_cpu()) {
    std::memset(t.raw_data(), 0, t.nbytes());
  } else {
#if CUMULUS_WITH_CUDA
    cuda::DeviceGuard guard(device.index());
    CUMULUS_CUDA_CHECK(cudaMemsetAsync(t.raw_data(), 0, t.nbytes(), cuda::stream(device.index())));
#endif
  }
  return t;
}

Tensor Tensor::full(const Shape& shape, float value, Device device) {
  Tensor t = empty(shape, DType::f32, device);
  CUMULUS_DISPATCH(device, ctx, kernels::fill_cpu(t.data<float>(), value, t.numel()),
                   kernels::fill_cuda(t.data<float>(), value, t.numel(), ctx.stream()));
  return t;
}

Tensor Tensor::full(const Shape& shape, float value, DType dtype, Device device) {
  // An integer type's tensor filled on the host and copied to `device`.
  const auto full_integer = [&](auto zero, double lo, double hi) {
    CUMULUS_CHECK(std::trunc(value) == value && value >= lo && value <= hi, InvalidArgument, "Tensor::full: ", value,
                  " is not a whole value ", dtype_name(dtype), " holds (", lo, " to ", hi, ")");
    const std::vector<decltype(zero)> host(static_cast<std::size_t>(shape.numel()), static_cast<decltype(zero)>(value));
    return from_host(host.data(), host.size(), dtype, shape, device);
  };
  switch (dtype) {
    case DType::f32: return full(shape, value, device);
    case DType::bf16:
    case DType::f16: return full(shape, value, device).to(dtype);
    case DType::i32: return full_integer(int32_t{0}, -2147483648.0, 2147483647.0);
    case DType::i64: return full_integer(int64_t{0}, -9223372036854775808.0, 9223371487098961920.0);  // below 2^63
    case DType::u8: return full_integer(uint8_t{0}, 0.0, 255.0);
    case DType::boolean: return full_integer(uint8_t{0}, 0.0, 1.0);
  }
  throw InvalidArgument("Tensor::full: unknown dtype");
}

Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0f, dtype, device); }

Tensor Tensor::from_host(const void* values, std::size_t count, DType dtype, const Shape& shape, Device device) {
  CUMULUS_CHECK(static_cast<int64_t>(count) == shape.numel(), ShapeError, "from_vector: ", count, " values for shape ",
                shape.str());
  Tensor t = empty(shape, dtype, device);
  copy_bytes(t.raw_data(), device, values, Device::cpu(), t.nbytes());
  return t;
}

// ---- metadata and data -----------------------------------------------------------------------

TensorImpl& Tensor::checked() const {
  CUMULUS_CHECK(impl_ != nullptr, InvalidArgument, "use of an undefined tensor",
                undefined_reason_ ? std::string(": ") + undefined_reason_ : std::string());
  return *impl_;
}

const Shape& Tensor::shape() const { return checked().shape; }
int64_t Tensor::numel() const { return checked().shape.numel(); }
DType Tensor::dtype() const { return checked().dtype; }
Device Tensor::device() const { return checked().storage->device; }
std::size_t Tensor::allocated_bytes() const { return checked().storage->memory.size(); }
MemoryCategory Tensor::memory_category() const { return checked().storage->memory.category(); }

int64_t Tensor::size(int dim) const {
  const int n = ndim();
  const int d = dim < 0 ? dim + n : dim;
  CUMULUS_CHECK(d >= 0 && d < n, ShapeError, "size(", dim, ") of a tensor of shape ", shape().str());
  return shape()[d];
}

bool Tensor::is_contiguous() const { return checked().contiguous; }

int64_t Tensor::stride(int dim) const {
  const int n = ndim();
  const int d = dim < 0 ? dim + n : dim;
  CUMULUS_CHECK(d >= 0 && d < n, ShapeError, "stride(", dim, ") of a tensor of shape ", shape().str());
  return strides()[static_cast<std::size_t>(d)];
}

std::vector<int64_t> Tensor::strides() const {
  const TensorImpl& t = checked();
  std::vector<int64_t> out(static_cast<std::size_t>(t.shape.ndim()));
  int64_t running = 1;
  for (int d = t.shape.ndim() - 1; d >= 0; --d) {
    out[static_cast<std::size_t>(d)] = t.contiguous ? running : t.strides[static_cast<std::size_t>(d)];
    running *= t.shape[d];
  }
  return out;
}

Tensor Tensor::contiguous() const { return ops::contiguous(*this); }

void* Tensor::raw_data() const {
  TensorImpl& t = checked();
  CUMULUS_CHECK(t.contiguous, InvalidArgument, "the data of ", str(),
                " is a strided view (not dense and row-major): call contiguous() first");
  return static_cast<char*>(t.storage->memory.get()) + t.offset_bytes;
}

void* Tensor::typed_data(DType dtype) const {
  CUMULUS_CHECK(this->dtype() == dtype, InvalidArgument, "data<", dtype_name(dtype), ">() on a tensor of dtype ",
                dtype_name(this->dtype()));
  return raw_data();
}

// A bool tensor also reads as uint8_t (0 or 1), as std::vector<bool> has no data() to copy into
// (Note [Bool tensors] in engine/ops/compare.cpp).
void Tensor::to_host(void* out, DType dtype) const {
  if (!is_contiguous()) return detach().contiguous().to_host(out, dtype);
  const bool bool_as_u8 = dtype == DType::u8 && this->dtype() == DType::boolean;
  copy_bytes(out, Device::cpu(), bool_as_u8 ? raw_data() : typed_data(dtype), device(), nbytes());
}

float Tensor::item() const {
  CUMULUS_CHECK(numel() == 1, ShapeError, "item() on a tensor of shape ", shape().str());
  return to_vector<float>()[0];
}

bool Tensor::shares_storage(const Tensor& other) const {
  return impl_ != nullptr && other.impl_ != nullptr && impl_->storage != nullptr &&
         impl_->storage == other.impl_->storage;
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  return "Tensor" + shape().str() + " " + dtype_name(dtype()) + " " + device().str();
}

// ---- copies and views ------------------------------------------------------------------------

Tensor Tensor::to(Device target) const {
  if (device() == target) return *this;
  if (!is_contiguous()) return detach().contiguous().to(target);
  Tensor t = empty(shape(), dtype(), target);
  copy_bytes(t.raw_data(), target, raw_data(), device(), nbytes());
  return t;
}

Tensor Tensor::to(DType target) const {
  const DType from = dtype();
  if (from == target) return *this;
  CUMULUS_CHECK(is_floating(from) && is_floating(target), InvalidArgument, "Tensor::to: no conversion from ",
                dtype_name(from), " to ", dtype_name(target), " (f32, bf16 and f16 convert among themselves)");
  if (!is_contiguous()) return detach().contiguous().to(target);
  Tensor t = empty(shape(), target, device());
  ops::detail::convert_into(*this, t);  // through f32: one rounding
  return t;
}

Tensor Tensor::clone() const {
  if (!is_contiguous()) return detach().contiguous();  // a fresh dense copy already
  Tensor t = empty(shape(), dtype(), device());
  copy_bytes(t.raw_data(), device(), raw_data(), device(), nbytes());
  return t;
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = checked().storage;
  impl->offset_bytes = impl_->offset_bytes;
  impl->shape = impl_->shape;
  impl->contiguous = impl_->contiguous;
  impl->strides = impl_->strides;
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::narrow_rows(int64_t start, int64_t length) const {
  CUMULUS_CHECK(ndim() >= 1, ShapeError, "narrow_rows on a scalar");
  CUMULUS_CHECK(start >= 0 && length >= 0 && start + length <= size(0), ShapeError, "narrow_rows(",
                start, ", ", length, ") out of range for ", shape().str());
  CUMULUS_CHECK(!requires_grad(), InvalidArgument, "narrow_rows on a tensor that requires grad");
  Tensor v = detach();
  Shape s{length};
  for (int d = 1; d < ndim(); ++d) s.push_back(shape()[d]);
  v.impl_->offset_bytes += static_cast<std::size_t>(start * stride(0)) * dtype_size(dtype());
  v.impl_->shape = s;
  return v;
}

Tensor Tensor::reshape(const Shape& s) const { return ops::reshape(*this, s); }
Tensor Tensor::reshape(std::initializer_list<int64_t> sizes) const { return ops::reshape(*this, sizes); }
Tensor Tensor::flatten(int start_dim) const { return ops::flatten(*this, start_dim); }
Tensor Tensor::transpose(int dim0, int dim1) const { return ops::transpose(*this, dim0, dim1); }
Tensor Tensor::permute(const std::vector<int>& dims) const { return ops::permute(*this, dims); }

void Tensor::copy_from(const Tensor& src) {
  CUMULUS_CHECK(src.shape() == shape() && src.dtype() == dtype(), ShapeError, "copy_from: ",
                src.str(), " into ", str());
  if (!is_contiguous() || !src.is_contiguous()) {
    ops::detail::copy_strided(src.device() == device() ? src : src.to(device()), *this);
    return;
  }
  copy_bytes(raw_data(), device(), src.raw_data(), src.device(), nbytes());
}

// ---- autograd --------------------------------------------------------------------------------

bool Tensor::requires_grad() const { return checked().autograd.requires_grad; }
bool Tensor::is_leaf() const { return checked().autograd.grad_fn == nullptr; }
const std::shared_ptr<Node>& Tensor::grad_fn() const { return checked().autograd.grad_fn; }

Tensor& Tensor::set_requires_grad(bool on) {
  CUMULUS_CHECK(is_leaf(), InvalidArgument, "set_requires_grad on a non-leaf tensor (made by op '",
                grad_fn()->name(), "'); use detach() first");
  // 16-bit leaves too: a checkpoint's recomputation starts at a leaf of its input's type
  // (Note [Mixed precision]: activations are 16-bit), and a leaf's gradient is of its own type.
  CUMULUS_CHECK(!on || is_floating(dtype()), InvalidArgument,
                "only floating tensors (f32, bf16, f16) can require grad, got ", dtype_name(dtype()));
  impl_->autograd.requires_grad = on;
  return *this;
}

// Note [Why a gradient is undefined]
// grad() returns an undefined tensor where PyTorch's .grad is None. Used anyway, it would only say
// "use of an undefined tensor", and the likeliest cause, reading p.grad() after the Trainer's
// step, looks like a bug in the library. So the undefined tensor carries a reason (a string
// literal: Tensor::undefined_reason), told apart by the leaf's state and by why its buffer was
// marked stale (StaleReason: the step marks it optimizer_step, zero_grad marks it zero_grad).
namespace {
const char* why_no_gradient(const AutogradMeta& m) {
  if (m.grad_fn != nullptr)
    return "grad() of a tensor made by an op: only leaves keep a gradient (read the gradient of the leaves it "
           "was made from)";
  if (!m.requires_grad)
    return "grad() of a tensor that does not require grad (a frozen parameter has none): call "
           "set_requires_grad(true) before the forward";
  switch (m.grad.defined() || m.stale_reason == StaleReason::sharded ? m.stale_reason : StaleReason::no_backward) {
    case StaleReason::sharded:
      return "grad() under ZeRO stage 2 (or reduce_every_micro_batch): each backward's gradients are reduced "
             "across the ranks as they finish and released; this rank keeps only the sum of its shard (the whole "
             "under reduce_every_micro_batch) in FlatParameters::gradients(), from element gradients_offset(), so no "
             "parameter has a gradient of its own to read";
    case StaleReason::optimizer_step:
      return "grad() after the optimizer step: the Trainer's step used the group's gradient and released it "
             "(the next backward overwrites the buffer). Read grad() after the group's last backward and before "
             "step_if_ready() or flush(), or read grad_buffer(), which keeps the group's summed gradient "
             "(before the division by its samples) until the next backward";
    case StaleReason::zero_grad:
      return "grad() after zero_grad(): no backward has reached this tensor since its gradient was zeroed";
    case StaleReason::no_backward: break;
  }
  return "grad() before any backward reached this tensor";
}
}  // namespace

Tensor Tensor::grad() const {
  const AutogradMeta& m = checked().autograd;
  if (m.grad.defined() && !m.grad_stale) return m.grad;
  Tensor none;
  none.undefined_reason_ = why_no_gradient(m);
  return none;
}

Tensor Tensor::grad_buffer() const { return checked().autograd.grad; }
bool Tensor::grad_stale() const { return checked().autograd.grad_stale; }
void Tensor::mark_grad_stale(StaleReason why) const {
  AutogradMeta& m = checked().autograd;
  m.grad_stale = true;
  m.stale_reason = why;
}

void Tensor::allocate_grad() const {
  CUMULUS_CHECK(requires_grad() && is_leaf(), InvalidArgument,
                "allocate_grad: only leaves that require grad own a gradient buffer");
  if (!impl_->autograd.grad.defined()) ops::detail::allocate_grad_buffer(*impl_);
}

void Tensor::backward() const { run_backward(*this); }

namespace ops::detail {
void allocate_grad_buffer(TensorImpl& leaf) {
  MemoryCategoryScope scope(MemoryCategory::gradients);
  leaf.autograd.grad = Tensor::empty(leaf.shape, leaf.dtype, leaf.storage->device);
  leaf.autograd.grad_stale = true;
  leaf.autograd.stale_reason = StaleReason::no_backward;
}
}  // namespace ops::detail

}  // namespace cumulus
