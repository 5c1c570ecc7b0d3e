#include "cumulus/nn/flat_parameters.h"

#include "cumulus/autograd/grad_mode.h"
#include "engine/ops/internal.h"

namespace cumulus::nn {

namespace {
int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

// Points `t` (every handle sharing its impl) at `numel` elements of `flat` from `offset`.
void repoint(const Tensor& t, const Tensor& flat, int64_t offset) {
  TensorImpl& impl = *t.impl();
  impl.storage = flat.impl()->storage;
  impl.offset_bytes = flat.impl()->offset_bytes + static_cast<std::size_t>(offset) * sizeof(float);
}
}  // namespace

FlatParameters::FlatParameters(const Module& model) : FlatParameters(model.named_parameters()) {}

FlatParameters::FlatParameters(const std::vector<std::pair<std::string, Tensor>>& named) {
  CUMULUS_CHECK(!named.empty(), InvalidArgument, "FlatParameters: no parameters");
  const Device device = named.front().second.device();
  int64_t total = 0;
  for (const auto& [name, p] : named) {
    CUMULUS_CHECK(p.defined() && p.is_leaf() && p.requires_grad() && p.dtype() == DType::f32,
                  InvalidArgument, "FlatParameters: '", name, "' must be an f32 leaf that requires grad");
    CUMULUS_CHECK(p.device() == device, DeviceError, "FlatParameters: '", name, "' is on ",
                  p.device().str(), ", the first parameter on ", device.str());
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
    const StaleReason why = s.param.impl()->autograd.stale_reason;
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
  for (const Slot& s : slots_) {
    if (!s.param.grad_stale()) continue;
    // A slot no backward reached since the last step: its gradient is zero. Write the zeros (beta
    // 0 over a zero source is not needed: fill) and leave it stale so the next backward overwrites.
    const Tensor g = s.param.grad_buffer();
    float* p = g.data<float>();
    const int64_t n = s.numel;
    CUMULUS_DISPATCH(g.device(), kernels::fill_cpu(p, 0.0f, n), kernels::fill_cuda(p, 0.0f, n, ctx.stream()));
  }
}

void FlatParameters::mark_gradients_stale(StaleReason why) const {
  for (const Slot& s : slots_) s.param.mark_grad_stale(why);
}

double FlatParameters::gradient_sum_of_squares() const {
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
    CUMULUS_DISPATCH(device(), (void)0, kernels::sum_squares_cuda(g, n, partials + 1, partials, ctx.stream()));
    result = scratch.narrow_rows(0, 1).item();
#endif
  }
  return result;
}

}  // namespace cumulus::nn
