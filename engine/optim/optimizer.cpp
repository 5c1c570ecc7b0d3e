#include "cumulus/optim/optimizer.h"

#include <algorithm>
#include <cmath>

#include <cstddef>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cumulus/autograd/grad_mode.h"
#include "engine/ops/internal.h"
#include "engine/tensor/tensor_impl.h"
#include "kernels/optim_rules.h"

namespace cumulus::optim {

namespace {
constexpr const char* kFrozenStateName = "frozen_missed_updates";
}  // namespace

Optimizer::Optimizer(std::shared_ptr<nn::FlatParameters> params, float lr) : params_(std::move(params)) {
  CUMULUS_CHECK(params_ != nullptr, InvalidArgument, "optimizer: no parameters");
  set_lr(lr);
  MemoryCategoryScope scope(MemoryCategory::other);
  step_buffers_ = Tensor::zeros(Shape{static_cast<int64_t>(sizeof(kernels::StepBuffers))}, DType::u8,
                                params_->device());
}

kernels::StepBuffers* Optimizer::step_buffers() const {
  return static_cast<kernels::StepBuffers*>(step_buffers_.raw_data());
}

kernels::StepState Optimizer::read_step_state() const {
  kernels::StepState s;
  copy_bytes(&s, Device::cpu(), &step_buffers()->state, params_->device(), sizeof(s));
  return s;
}

void Optimizer::write_step_state(std::size_t offset, const void* value, std::size_t bytes) {
  CUMULUS_CHECK(offset + bytes <= sizeof(kernels::StepState), InvalidArgument, "write_step_state out of range");
  char* dst = reinterpret_cast<char*>(&step_buffers()->state) + offset;
  copy_bytes(dst, params_->device(), value, Device::cpu(), bytes);
}

Tensor Optimizer::step_state_scalar(std::size_t offset, const Shape& shape) const {
  CUMULUS_CHECK(offset % alignof(float) == 0 && offset + sizeof(float) <= sizeof(kernels::StepState) &&
                    shape.numel() == 1,
                InvalidArgument, "step_state_scalar: offset ", offset, ", shape ", shape.str());
  auto view = std::make_shared<TensorImpl>();
  view->storage = impl_of(step_buffers_)->storage;
  view->offset_bytes = impl_of(step_buffers_)->offset_bytes + offsetof(kernels::StepBuffers, state) + offset;
  view->shape = shape;
  view->dtype = DType::f32;
  return make_tensor(std::move(view));
}

std::vector<ParamGroup> decay_matrices_only(const std::vector<std::pair<std::string, Tensor>>& named_parameters,
                                            float weight_decay) {
  CUMULUS_CHECK(weight_decay >= 0.0f, InvalidArgument, "decay_matrices_only: weight_decay must be >= 0, got ",
                weight_decay);
  ParamGroup decay, no_decay;
  decay.weight_decay = weight_decay;
  no_decay.weight_decay = 0.0f;
  for (const auto& [name, t] : named_parameters) (t.ndim() >= 2 ? decay : no_decay).params.push_back(name);
  return {decay, no_decay};
}

// Slots are laid out at multiples of kAlignElements (the frozen chunks'), so a run of slots starts
// on a chunk and its padding belongs to it (zero values and gradients: no update moves them).
void Optimizer::set_param_groups(const std::vector<ParamGroup>& groups) {
  const auto& slots = params_->slots();
  std::vector<int> group_of(slots.size(), -1);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const ParamGroup& group = groups[g];
    CUMULUS_CHECK(group.lr_scale >= 0.0f && std::isfinite(group.lr_scale), InvalidArgument, "param group ", g,
                  ": lr_scale must be finite and >= 0, got ", group.lr_scale);
    CUMULUS_CHECK(std::isfinite(group.weight_decay), InvalidArgument, "param group ", g,
                  ": weight_decay must be finite, got ", group.weight_decay);
    for (const std::string& name : group.params) {
      std::size_t i = 0;
      while (i < slots.size() && slots[i].name != name) ++i;
      CUMULUS_CHECK(i < slots.size(), InvalidArgument, "param group ", g, ": no parameter '", name,
                    "' among the optimizer's (", slots.size(), " trained parameters)");
      CUMULUS_CHECK(group_of[i] < 0, InvalidArgument, "param group ", g, ": parameter '", name,
                    "' is already in group ", group_of[i]);
      group_of[i] = static_cast<int>(g);
    }
  }
  groups_ = groups;
  segments_.clear();
  if (groups.empty()) return;
  std::vector<std::size_t> order(slots.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return slots[a].offset < slots[b].offset; });
  for (std::size_t k = 0; k < order.size(); ++k) {
    const std::size_t i = order[k];
    Segment s;
    s.offset = k == 0 ? 0 : slots[i].offset;
    CUMULUS_CHECK(s.offset % kernels::FrozenChunks::kChunk == 0, Error, "set_param_groups: parameter '", slots[i].name,
                  "' starts at element ", s.offset, ", not on a chunk");
    if (group_of[i] >= 0) {
      s.lr_scale = groups[static_cast<std::size_t>(group_of[i])].lr_scale;
      s.weight_decay = groups[static_cast<std::size_t>(group_of[i])].weight_decay;
    }
    if (!segments_.empty() && segments_.back().lr_scale == s.lr_scale &&
        segments_.back().weight_decay == s.weight_decay)
      continue;  // the run goes on
    if (!segments_.empty()) segments_.back().count = s.offset - segments_.back().offset;
    segments_.push_back(s);
  }
  if (!segments_.empty()) segments_.back().count = params_->size() - segments_.back().offset;
}

kernels::FrozenChunks Optimizer::offset_frozen(const kernels::FrozenChunks& frozen, int64_t offset) {
  kernels::FrozenChunks f = frozen;
  const int64_t chunk = offset / kernels::FrozenChunks::kChunk;
  if (f.frozen != nullptr) f.frozen += chunk;
  if (f.missed != nullptr) f.missed += chunk;
  return f;
}

int64_t Optimizer::updates() const { return read_step_state().updates; }

void Optimizer::set_updates(int64_t updates) {
  CUMULUS_CHECK(updates >= 0, InvalidArgument, "optimizer: negative update count ", updates);
  write_step_state(offsetof(kernels::StepState, updates), &updates, sizeof(updates));
}

void Optimizer::set_lr(float lr) {
  CUMULUS_CHECK(std::isfinite(lr) && lr >= 0.0f, InvalidArgument,
                "optimizer: learning rate must be finite and >= 0, got ", lr);
  lr_ = lr;
}

void Optimizer::restore_tensor(const std::vector<std::pair<std::string, Tensor>>& state,
                               const std::string& name, Tensor& into) const {
  if (!copy_state_tensor(state, name, DType::f32, params_->values().shape(), into))
    throw InvalidArgument("optimizer state '" + name + "' is missing from the checkpoint");
}

bool Optimizer::copy_state_tensor(const std::vector<std::pair<std::string, Tensor>>& state, const std::string& name,
                                  DType dtype, const Shape& shape, Tensor& into) const {
  for (const auto& [n, t] : state) {
    if (n != name) continue;
    CUMULUS_CHECK(t.dtype() == dtype && t.numel() == shape.numel(), ShapeError, "optimizer state '", name, "' has ",
                  t.numel(), " elements (", dtype_name(t.dtype()), "), expected ", shape.numel(), " ",
                  dtype_name(dtype), " (was the checkpoint written for this model?)");
    if (!into.defined()) {
      MemoryCategoryScope scope(MemoryCategory::optimizer_state);
      into = Tensor::empty(shape, dtype, params_->device());
    }
    copy_bytes(into.raw_data(), into.device(), t.raw_data(), t.device(), into.nbytes());
    return true;
  }
  return false;
}

void Optimizer::step() { update(1.0f, lr_); }

void Optimizer::update(float grad_scale, float lr) {
  CUMULUS_CHECK(std::isfinite(grad_scale), InvalidArgument, "optimizer: gradient scale ", grad_scale);
  NoGradGuard no_grad;
  params_->zero_stale_gradients();
  prepare_frozen();
  kernels::StepBuffers* buf = step_buffers();
  CUMULUS_DISPATCH(params_->device(), ctx, kernels::set_step(buf->state, grad_scale, lr),
                   kernels::set_step_cuda(buf, grad_scale, lr, ctx.stream()));
  apply_prepared_update();
}

// ---- frozen parameters (Note [Frozen parameters] in kernels/optim_rules.h) ----

void Optimizer::prepare_frozen() {
  // Restored counts need the chunked update even when nothing is frozen now.
  params_->refresh_frozen(/*need_mask=*/missed_updates_.defined());
  if (params_->frozen_chunks() == nullptr || missed_updates_.defined()) return;
  MemoryCategoryScope scope(MemoryCategory::optimizer_state);
  missed_updates_ = Tensor::zeros(Shape{params_->num_chunks()}, DType::i32, params_->device());
}

kernels::FrozenChunks Optimizer::frozen_chunks() const {
  kernels::FrozenChunks f;
  if (!missed_updates_.defined()) return f;
  f.frozen = params_->frozen_chunks();
  f.missed = missed_updates_.data<int32_t>();
  return f;
}

std::vector<Optimizer::StateTensorInfo> Optimizer::state_layout() const {
  std::vector<StateTensorInfo> out;
  for (const std::string& name : moment_names()) out.push_back({name, DType::f32, params_->values().shape()});
  out.push_back({kFrozenStateName, DType::i32, Shape{params_->num_chunks()}});
  return out;
}

void Optimizer::append_frozen_state(std::vector<std::pair<std::string, Tensor>>& state) const {
  if (missed_updates_.defined()) state.emplace_back(kFrozenStateName, missed_updates_);
}

void Optimizer::restore_frozen_state(const std::vector<std::pair<std::string, Tensor>>& state) {
  if (copy_state_tensor(state, kFrozenStateName, DType::i32, Shape{params_->num_chunks()}, missed_updates_)) return;
  // A checkpoint from before any freeze: no parameter missed an update.
  if (missed_updates_.defined()) {
    const std::vector<int32_t> zeros(static_cast<std::size_t>(params_->num_chunks()), 0);
    copy_bytes(missed_updates_.raw_data(), missed_updates_.device(), zeros.data(), Device::cpu(),
               missed_updates_.nbytes());
  }
}

int64_t Optimizer::frozen_state_bytes() const {
  return missed_updates_.defined() ? static_cast<int64_t>(missed_updates_.allocated_bytes()) : 0;
}

void Optimizer::apply_prepared_update() {
  NoGradGuard no_grad;
  // On the CPU the state is host memory: the rule reads it directly. On CUDA the kernels read it.
  static const kernels::StepState unused{};
  apply(params_->device().is_cpu() ? step_buffers()->state : unused);
}

}  // namespace cumulus::optim
