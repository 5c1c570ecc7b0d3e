#include "cumulus/nn/flat_parameters.h"

#include <utility>

#include "cumulus/autograd/grad_mode.h"
#include "cumulus/memory/allocator.h"
#include "engine/ops/internal.h"
#include "engine/tensor/tensor_impl.h"
#include "kernels/optim_rules.h"

namespace cumulus::nn {

namespace {
int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

// Points `t` (every handle sharing its impl) at `numel` elements of `flat` from `offset`.
void repoint(const Tensor& t, const Tensor& flat, int64_t offset) {
  TensorImpl& impl = *impl_of(t);
  impl.storage = impl_of(flat)->storage;
  impl.offset_bytes = impl_of(flat)->offset_bytes + static_cast<std::size_t>(offset) * sizeof(float);
}

// The parameters that train: a frozen one gets no slot (Note [Frozen parameters]).
std::vector<std::pair<std::string, Tensor>> trainable_parameters(const Module& model) {
  std::vector<std::pair<std::string, Tensor>> all = model.named_parameters(), out;
  for (auto& named : all)
    if (!named.second.defined() || named.second.requires_grad()) out.push_back(std::move(named));
  CUMULUS_CHECK(!out.empty() || all.empty(), InvalidArgument,
                "FlatParameters: every parameter of the model is frozen (requires_grad false): nothing to train");
  return out;
}

}  // namespace

static_assert(FlatParameters::kAlignElements == kernels::FrozenChunks::kChunk,
              "the frozen mask's chunks are the slots' alignment (Note [Frozen parameters])");

FlatParameters::FlatParameters(const Module& model) : FlatParameters(trainable_parameters(model)) {}

FlatParameters::FlatParameters(const std::vector<std::pair<std::string, Tensor>>& named) {
  CUMULUS_CHECK(!named.empty(), InvalidArgument, "FlatParameters: no parameters");
  const Device device = named.front().second.device();
  int64_t total = 0;
  for (const auto& [name, p] : named) {
    CUMULUS_CHECK(p.defined() && p.is_leaf() && p.requires_grad() && p.dtype() == DType::f32, InvalidArgument,
                  "FlatParameters: '", name,
                  "' must be an f32 leaf that requires grad (leave frozen parameters out of the list)");
    CUMULUS_CHECK(p.device() == device, DeviceError, "FlatParameters: '", name, "' is on ",
                  p.device().str(), ", the first parameter on ", device.str());
    // A shared tensor given twice would get two slots and two updates per step.
    for (const Slot& s : slots_)
      CUMULUS_CHECK(impl_of(s.param) != impl_of(p), InvalidArgument, "FlatParameters: '", name, "' is the tensor '",
                    s.name, "' again (list a shared parameter once, as Module::named_parameters() does)");
    slots_.push_back({name, p, total, p.numel()});
    total += align_up(p.numel(), kAlignElements);
  }
  {
    MemoryCategoryScope scope(MemoryCategory::parameters);
    values_ = Tensor::zeros(Shape{total}, DType::f32, device);
  }
  {
    MemoryCategoryScope scope(MemoryCategory::gradients);
    grads_ = Tensor::zeros(Shape{total}, DType::f32, device);  // padding stays zero for ever
  }
  for (Slot& s : slots_) {
    const std::size_t bytes = static_cast<std::size_t>(s.numel) * sizeof(float);
    char* dst = static_cast<char*>(values_.raw_data()) + s.offset * sizeof(float);
    copy_bytes(dst, device, s.param.raw_data(), device, bytes);
    const bool stale = s.param.grad_stale();
    const StaleReason why = impl_of(s.param)->autograd.stale_reason;
    const Tensor old_grad = s.param.grad_buffer();
    if (old_grad.defined() && !stale) {
      char* gdst = static_cast<char*>(grads_.raw_data()) + s.offset * sizeof(float);
      copy_bytes(gdst, device, old_grad.raw_data(), device, bytes);
    }
    repoint(s.param, values_, s.offset);
    if (!old_grad.defined()) s.param.allocate_grad();
    repoint(s.param.grad_buffer(), grads_, s.offset);
    if (stale) s.param.mark_grad_stale(why);
  }
}

void FlatParameters::shard_gradients(int64_t offset, int64_t count) {
  if (sharded_ && offset == grads_offset_ && count == grads_.numel()) return;
  CUMULUS_CHECK(!sharded_, InvalidArgument, "FlatParameters::shard_gradients: the gradients are sharded already, as [",
                grads_offset_, ", ", grads_offset_ + grads_.numel(), ")");
  CUMULUS_CHECK(offset >= 0 && count >= 0 && offset + count <= size(), InvalidArgument,
                "FlatParameters::shard_gradients: elements [", offset, ", ", offset + count, ") outside the ", size(),
                " parameters");
  for (const Slot& s : slots_) {
    TensorImpl& leaf = *impl_of(s.param);
    leaf.autograd.grad = Tensor();
    s.param.mark_grad_stale(StaleReason::sharded);
  }
  // Freed and its segment given back before the shard is made: the peak never holds both, and the
  // shard does not sit in the flat gradient's cached segment, which would stay reserved whole.
  grads_ = Tensor();
  allocator_for(device()).empty_cache();
  MemoryCategoryScope scope(MemoryCategory::gradients);
  grads_ = Tensor::zeros(Shape{count}, DType::f32, device());
  grads_offset_ = offset;
  sharded_ = true;
}

void FlatParameters::unshard_gradients() {
  if (!sharded_) return;
  {
    MemoryCategoryScope scope(MemoryCategory::gradients);
    grads_ = Tensor();
    grads_ = Tensor::zeros(Shape{size()}, DType::f32, device());
  }
  grads_offset_ = 0;
  sharded_ = false;
  for (const Slot& s : slots_) {
    impl_of(s.param)->autograd.grad = grads_.narrow_rows(s.offset, s.numel).reshape(s.param.shape());
    s.param.mark_grad_stale(StaleReason::zero_grad);
  }
}

int64_t FlatParameters::num_parameters() const {
  int64_t n = 0;
  for (const Slot& s : slots_) n += s.numel;
  return n;
}

bool FlatParameters::any_gradient() const {
  for (const Slot& s : slots_)
    if (!s.param.grad_stale()) return true;
  return false;
}

void FlatParameters::zero_stale_gradients() const {
  // A slot no backward reached since the last step (a frozen one, say) has a zero gradient. Write
  // the zeros and leave it stale, so the next backward overwrites it. Consecutive stale slots are
  // one fill (the padding between them is zero anyway).
  if (sharded_) return;
  float* g = grads_.data<float>();
  for (std::size_t i = 0; i < slots_.size();) {
    if (!slots_[i].param.grad_stale()) {
      ++i;
      continue;
    }
    std::size_t end = i + 1;
    while (end < slots_.size() && slots_[end].param.grad_stale()) ++end;
    float* p = g + slots_[i].offset;
    const int64_t n = slots_[end - 1].offset + slots_[end - 1].numel - slots_[i].offset;
    CUMULUS_DISPATCH(device(), ctx, kernels::fill_cpu(p, 0.0f, n), kernels::fill_cuda(p, 0.0f, n, ctx.stream()));
    i = end;
  }
}

void FlatParameters::mark_gradients_stale(StaleReason why) const {
  for (const Slot& s : slots_) s.param.mark_grad_stale(sharded_ ? StaleReason::sharded : why);
}

void FlatParameters::refresh_frozen(bool need_mask) {
  if (slot_frozen_.empty()) slot_frozen_.assign(slots_.size(), false);
  std::vector<std::size_t> changed;
  for (std::size_t i = 0; i < slots_.size(); ++i)
    if (slot_frozen_[i] != !slots_[i].param.requires_grad()) changed.push_back(i);
  if (changed.empty() && (frozen_mask_.defined() || !need_mask)) return;
  if (!frozen_mask_.defined()) {
    MemoryCategoryScope scope(MemoryCategory::other);
    frozen_mask_ = Tensor::zeros(Shape{num_chunks()}, DType::u8, device());
  }
  // Rewrite the changed slots' chunks only (queued in stream order on CUDA, no synchronization).
  for (std::size_t i : changed) {
    const bool frozen = !slots_[i].param.requires_grad();
    const int64_t first = slots_[i].offset / kAlignElements;
    const int64_t count = align_up(slots_[i].numel, kAlignElements) / kAlignElements;
    const std::vector<uint8_t> bytes(static_cast<std::size_t>(count), frozen ? 1 : 0);
    copy_bytes(frozen_mask_.data<uint8_t>() + first, device(), bytes.data(), Device::cpu(), bytes.size());
    slot_frozen_[i] = frozen;
  }
}

const uint8_t* FlatParameters::frozen_chunks() const {
  return frozen_mask_.defined() ? frozen_mask_.data<uint8_t>() : nullptr;
}

double FlatParameters::gradient_sum_of_squares() const {
  CUMULUS_CHECK(!sharded_, InvalidArgument,
                "FlatParameters::gradient_sum_of_squares: the gradients are sharded across ranks (ZeRO stage 2): "
                "this rank holds part of them; the Trainer takes the norm over all ranks");
  zero_stale_gradients();
  const float* g = grads_.data<float>();
  const int64_t n = grads_.numel();
  double result = 0.0;
  if (device().is_cpu()) {
    result = kernels::sum_squares_cpu(g, n);
  } else {
#if CUMULUS_WITH_CUDA
    NoGradGuard no_grad;
    MemoryCategoryScope scope(MemoryCategory::other);
    Tensor scratch = Tensor::empty(Shape{kernels::sum_squares_partials() + 1}, DType::f32, device());
    float* partials = scratch.data<float>();
    CUMULUS_DISPATCH(device(), ctx, (void)0, kernels::sum_squares_cuda(g, n, partials + 1, partials, ctx.stream()));
    result = scratch.narrow_rows(0, 1).item();
#endif
  }
  return result;
}

}  // namespace cumulus::nn
