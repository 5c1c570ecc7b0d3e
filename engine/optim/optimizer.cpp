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
#include "engine/tensor/host_reads.h"
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
  scalars_ = Tensor::zeros(Shape{static_cast<int64_t>(sizeof(UpdateScalars))}, DType::u8, params_->device());
}

Optimizer::~Optimizer() = default;

UpdateScalars* Optimizer::update_scalars() const { return static_cast<UpdateScalars*>(scalars_.raw_data()); }

UpdateScalars Optimizer::read_update_scalars() const {
  UpdateScalars s;
  copy_bytes(&s, Device::cpu(), update_scalars(), params_->device(), sizeof(s));
  return s;
}

void Optimizer::write_update_scalars(const UpdateScalars& scalars) {
  copy_bytes(update_scalars(), params_->device(), &scalars, Device::cpu(), sizeof(scalars));
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

std::vector<UpdateSpan> Optimizer::spans(const UpdateArrays& arrays) const {
  FrozenChunks frozen;
  if (missed_updates_.defined()) {
    frozen.frozen = arrays.frozen;
    frozen.missed = missed_updates_.data<int32_t>();
  }
  // Each segment's part inside the kept shard (all of it without one).
  const int64_t begin = shard_offset(), end = begin + shard_count();
  auto span_of = [&](const Segment& seg) {
    UpdateSpan span;
    span.offset = std::max(seg.offset, begin);
    span.state_offset = span.offset - begin;
    span.count = std::min(seg.offset + seg.count, end) - span.offset;
    span.values = arrays.values + (span.offset - arrays.values_first);
    span.gradients = arrays.gradients + (span.offset - arrays.gradients_first);
    span.device = arrays.device;
    span.lr_scale = seg.lr_scale;
    span.weight_decay = seg.weight_decay;
    span.frozen = frozen;
    const int64_t chunk = span.offset / FrozenChunks::kChunk;
    if (span.frozen.frozen != nullptr) span.frozen.frozen += chunk;
    if (span.frozen.missed != nullptr) span.frozen.missed += chunk;
    return span;
  };
  const std::vector<Segment> whole = {Segment{0, params_->size(), 1.0f, -1.0f}};
  std::vector<UpdateSpan> out;
  for (const Segment& seg : segments_.empty() ? whole : segments_) {
    const UpdateSpan span = span_of(seg);
    if (span.count > 0) out.push_back(span);
  }
  return out;
}

void Optimizer::keep_shard(int64_t offset, int64_t count) {
  const int64_t size = params_->size(), chunk = FrozenChunks::kChunk;
  CUMULUS_CHECK(state_.empty(), InvalidArgument,
                "Optimizer::keep_shard: the state exists already (keep a shard before the first update)");
  CUMULUS_CHECK(offset >= 0 && count >= 0 && offset + count <= size && offset % chunk == 0 &&
                    ((offset + count) % chunk == 0 || offset + count == size),
                InvalidArgument, "Optimizer::keep_shard: elements [", offset, ", ", offset + count,
                ") are not whole chunks of ", chunk, " within the ", size, " parameters");
  shard_offset_ = offset;
  shard_count_ = count;
}

const char* state_placement_name(StatePlacement placement) {
  return placement == StatePlacement::host ? "host" : "device";
}

void Optimizer::check_no_state_yet(const char* caller) const {
  CUMULUS_CHECK(state_.empty() && !missed_updates_.defined(), InvalidArgument, caller,
                ": the state exists already (change it before the first update)");
}

void Optimizer::place_state(StatePlacement placement) {
  check_no_state_yet("Optimizer::place_state");
  placement_ = placement;
}

void Optimizer::set_state_bits(int bits) {
  CUMULUS_CHECK(bits == 32, InvalidArgument, "Optimizer::set_state_bits: this optimizer keeps its state in 32 bits "
                "only, not ", bits);
}

int64_t Optimizer::updates() const { return read_update_scalars().updates; }

void Optimizer::set_lr(float lr) {
  CUMULUS_CHECK(std::isfinite(lr) && lr >= 0.0f, InvalidArgument,
                "optimizer: learning rate must be finite and >= 0, got ", lr);
  lr_ = lr;
}

// ---- state --------------------------------------------------------------------------------------

const Tensor& Optimizer::state_tensor(const std::string& name) const {
  static const Tensor undefined;
  const std::vector<StateSpec> specs = state_specs();
  for (std::size_t i = 0; i < specs.size() && i < state_.size(); ++i)
    if (specs[i].name == name) return state_[i];
  if (name == kFrozenStateName) return missed_updates_;
  return undefined;
}

int64_t Optimizer::numel_of(const StateSpec& spec, bool whole) const {
  CUMULUS_CHECK(spec.block >= 1 && FrozenChunks::kChunk % spec.block == 0, InvalidArgument, "optimizer state '",
                spec.name, "': block ", spec.block, " does not divide a chunk of ", FrozenChunks::kChunk, " elements");
  return ((whole ? params_->size() : shard_count()) + spec.block - 1) / spec.block;
}

Tensor Optimizer::new_state_tensor(const Shape& shape, DType dtype, bool zero) const {
  if (placement_ == StatePlacement::device) {
    MemoryCategoryScope scope(MemoryCategory::optimizer_state);
    return zero ? Tensor::zeros(shape, dtype, params_->device()) : Tensor::empty(shape, dtype, params_->device());
  }
  Tensor t = empty_from(host_state_allocator(), shape, dtype, MemoryCategory::optimizer_state);
  if (zero && t.nbytes() > 0) std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

// The state arrays (load_state may have made them) and the host copies of a state on the host.
void Optimizer::allocate_state() {
  if (state_.empty())
    for (const StateSpec& spec : state_specs())
      state_.push_back(new_state_tensor(Shape{numel_of(spec)}, spec.dtype, true));
  if (placement_ == StatePlacement::device || host_) return;
  host_ = std::make_unique<HostCopies>();
  host_->values = new_state_tensor(Shape{shard_count()}, DType::f32, false);
  host_->gradients = new_state_tensor(Shape{shard_count()}, DType::f32, false);
}

int64_t Optimizer::state_bytes() const {
  int64_t bytes = missed_updates_.defined() ? static_cast<int64_t>(missed_updates_.allocated_bytes()) : 0;
  for (const Tensor& t : state_) bytes += static_cast<int64_t>(t.allocated_bytes());
  if (host_) bytes += static_cast<int64_t>(host_->values.allocated_bytes() + host_->gradients.allocated_bytes());
  return bytes;
}

std::vector<int64_t> Optimizer::state_to_allocate() const {
  if (!state_.empty() || placement_ == StatePlacement::host) return {};
  std::vector<int64_t> bytes;
  for (const StateSpec& spec : state_specs())
    bytes.push_back(numel_of(spec) * static_cast<int64_t>(dtype_size(spec.dtype)));
  return bytes;
}

bool Optimizer::next_update_allocates() const {
  return (state_.empty() && !state_specs().empty()) || (placement_ == StatePlacement::host && !host_);
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  const std::vector<StateSpec> specs = state_specs();
  for (std::size_t i = 0; i < state_.size(); ++i) out.emplace_back(specs[i].name, state_[i]);
  if (missed_updates_.defined()) out.emplace_back(kFrozenStateName, missed_updates_);
  return out;
}

std::vector<Optimizer::StateTensorInfo> Optimizer::state_layout() const {
  std::vector<StateTensorInfo> out;
  for (const StateSpec& spec : state_specs()) out.push_back({spec.name, spec.dtype, Shape{numel_of(spec, true)}});
  out.push_back({kFrozenStateName, DType::i32, Shape{params_->num_chunks()}});
  return out;
}

void Optimizer::load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t updates) {
  CUMULUS_CHECK(updates >= 0, InvalidArgument, "Optimizer::load_state: negative update count ", updates);
  if (updates > 0) {
    const std::vector<StateSpec> specs = state_specs();
    std::vector<Tensor> restored(specs.size());
    for (std::size_t i = 0; i < specs.size(); ++i) {
      if (i < state_.size()) restored[i] = state_[i];  // copied into the buffers held
      if (!copy_state_tensor(state, specs[i].name, specs[i].dtype, numel_of(specs[i], true),
                             shard_offset_ / specs[i].block, Shape{numel_of(specs[i])}, restored[i]))
        throw InvalidArgument("optimizer state '" + specs[i].name + "' is missing from the checkpoint");
    }
    state_ = std::move(restored);
    restore_frozen_state(state);
  }
  UpdateScalars scalars = read_update_scalars();
  scalars.updates = updates;
  write_update_scalars(scalars);
}

void Optimizer::discard_state() {
  state_.clear();
  host_.reset();
  missed_updates_ = Tensor();
  UpdateScalars scalars = read_update_scalars();
  scalars.updates = 0;
  write_update_scalars(scalars);
}

bool Optimizer::copy_state_tensor(const std::vector<std::pair<std::string, Tensor>>& state, const std::string& name,
                                  DType dtype, int64_t whole, int64_t first, const Shape& shape, Tensor& into) const {
  for (const auto& [n, t] : state) {
    if (n != name) continue;
    CUMULUS_CHECK(t.dtype() == dtype && t.numel() == whole, ShapeError, "optimizer state '", name, "' has ", t.numel(),
                  " elements (", dtype_name(t.dtype()), "), expected ", whole, " ", dtype_name(dtype),
                  " (was the checkpoint written for this model?)");
    if (!into.defined()) into = new_state_tensor(shape, dtype, false);
    const char* from = static_cast<const char*>(t.raw_data()) + first * static_cast<int64_t>(dtype_size(dtype));
    copy_bytes(into.raw_data(), into.device(), from, t.device(), into.nbytes());
    return true;
  }
  return false;
}

void Optimizer::restore_frozen_state(const std::vector<std::pair<std::string, Tensor>>& state) {
  const int64_t chunks = params_->num_chunks();
  if (copy_state_tensor(state, kFrozenStateName, DType::i32, chunks, 0, Shape{chunks}, missed_updates_)) return;
  // A checkpoint from before any freeze: no parameter missed an update.
  if (missed_updates_.defined()) {
    const std::vector<int32_t> zeros(static_cast<std::size_t>(params_->num_chunks()), 0);
    copy_bytes(missed_updates_.raw_data(), missed_updates_.device(), zeros.data(), Device::cpu(),
               missed_updates_.nbytes());
  }
}

// ---- updates ------------------------------------------------------------------------------------

void Optimizer::step() { step(1.0f, lr_); }

void Optimizer::step(float grad_scale, float lr) {
  CUMULUS_CHECK(std::isfinite(grad_scale), InvalidArgument, "optimizer: gradient scale ", grad_scale);
  NoGradGuard no_grad;
  prepare_update();
  CUMULUS_DISPATCH(params_->device(), ctx, kernels::set_step(*update_scalars(), grad_scale, lr),
                   kernels::set_step_cuda(update_scalars(), grad_scale, lr, ctx.stream()));
  apply_update();
}

// Frozen parameters: Note [Frozen parameters] in kernels/optim_rules.h. Restored counts need the
// chunked update even when nothing is frozen now.
void Optimizer::prepare_update() {
  NoGradGuard no_grad;
  params_->zero_stale_gradients();
  params_->refresh_frozen(/*need_mask=*/missed_updates_.defined());
  if (params_->frozen_chunks() == nullptr || missed_updates_.defined()) return;
  missed_updates_ = new_state_tensor(Shape{params_->num_chunks()}, DType::i32, true);
}

void Optimizer::apply_update() {
  NoGradGuard no_grad;
  allocate_state();
  check_gradients_held();
  if (placement_ == StatePlacement::host) return update_through_host();
  const UpdateScalars* scalars = update_scalars();
  // On the CPU the scalars are host memory: a skipped step calls nothing. On CUDA the kernels read them.
  if (params_->device().is_cpu() && scalars->skip) return;
  nn::FlatParameters& p = *params_;
  for (const UpdateSpan& span : spans({p.values().data<float>(), 0, p.gradients().data<float>(), p.gradients_offset(),
                                       p.frozen_chunks(), p.device()}))
    update(scalars, span);
}

void Optimizer::check_gradients_held() const {
  const nn::FlatParameters& p = *params_;
  const int64_t held_end = p.gradients_offset() + p.gradients().numel();
  CUMULUS_CHECK(p.gradients_offset() <= shard_offset() && shard_offset() + shard_count() <= held_end,
                InvalidArgument, "optimizer: it updates elements [", shard_offset(), ", ", shard_offset() + shard_count(),
                ") but the parameters hold gradients for [", p.gradients_offset(), ", ", held_end,
                ") only (sharded gradients: keep the same shard)");
}

// Note [Optimizer state on the host]
// ZeRO-Offload's idea (Ren et al., 2021): the optimizer state, 8 of AdamW's 16 bytes per parameter
// in f32, lives in the host-state pool, and the update runs there. Each update reads the kept
// shard's gradients and values, the update scalars and the frozen mask into that pool with one wait,
// runs the CPU kernels on those copies and queues the values back; no state crosses the bus.
// Copying the values down, rather than keeping a host master copy, keeps the device's values the
// only truth: a user who loads weights between steps is never overwritten by a stale copy, for 4
// more bytes per parameter on the bus. On a GPU the pool is pinned, so the upload is asynchronous;
// its source is not touched again before the next update's wait, which follows it in stream order.
// Nothing overlaps the update with the next micro-batch's forward, which reads the values it
// writes. A CPU device runs the same path (its copies are memcpy), so the state sits outside the
// budgeted pool there too and every line of it is tested without a GPU; the CPU kernels on the
// same inputs make it the device placement's update bit for bit.
void Optimizer::update_through_host() {
  nn::FlatParameters& p = *params_;
  HostCopies& h = *host_;
  const int64_t first = shard_offset();
  const std::size_t bytes = static_cast<std::size_t>(shard_count()) * sizeof(float);
  const uint8_t* mask = p.frozen_chunks();
  h.frozen.resize(mask != nullptr ? static_cast<std::size_t>(p.num_chunks()) : 0);
  std::vector<HostRead> reads = {{&h.scalars, update_scalars(), sizeof(UpdateScalars)},
                                 {h.values.raw_data(), p.values().data<float>() + first, bytes},
                                 {h.gradients.raw_data(), p.gradients().data<float>() + (first - p.gradients_offset()),
                                  bytes}};
  if (mask != nullptr) reads.push_back({h.frozen.data(), mask, h.frozen.size()});
  read_to_host(p.device(), reads);
  if (h.scalars.skip) return;
  const UpdateArrays host{h.values.data<float>(), first, h.gradients.data<float>(), first,
                          mask != nullptr ? h.frozen.data() : nullptr, Device::cpu()};
  for (const UpdateSpan& span : spans(host)) update(&h.scalars, span);
  copy_bytes(p.values().data<float>() + first, p.device(), h.values.raw_data(), Device::cpu(), bytes);
}

}  // namespace cumulus::optim
