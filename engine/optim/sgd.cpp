#include "cumulus/optim/sgd.h"

#include "engine/ops/internal.h"
#include "kernels/optim_rules.h"

namespace cumulus::optim {

SGD::SGD(std::shared_ptr<nn::FlatParameters> params, const SGDOptions& options)
    : Optimizer(std::move(params), options.lr), options_(options) {
  CUMULUS_CHECK(options.momentum >= 0.0f, InvalidArgument, "SGD: momentum must be >= 0, got ", options.momentum);
  CUMULUS_CHECK(options.weight_decay >= 0.0f, InvalidArgument, "SGD: weight_decay must be >= 0, got ",
                options.weight_decay);
  CUMULUS_CHECK(!options.nesterov || (options.momentum > 0.0f && options.dampening == 0.0f),
                InvalidArgument, "SGD: Nesterov momentum needs momentum > 0 and dampening 0");
}

int64_t SGD::state_bytes() const {
  return (momentum_.defined() ? static_cast<int64_t>(momentum_.allocated_bytes()) : 0) + frozen_state_bytes();
}

std::vector<int64_t> SGD::state_to_allocate() const {
  if (options_.momentum == 0.0f || momentum_.defined()) return {};
  return {static_cast<int64_t>(params_->values().nbytes())};  // apply() allocates it with the values' shape
}

std::vector<std::pair<std::string, Tensor>> SGD::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  if (momentum_.defined()) out.emplace_back("momentum_buffer", momentum_);
  append_frozen_state(out);
  return out;
}

std::vector<std::string> SGD::moment_names() const {
  if (options_.momentum == 0.0f) return {};
  return {"momentum_buffer"};
}

void SGD::load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t updates) {
  CUMULUS_CHECK(updates >= 0, InvalidArgument, "SGD::load_state: negative update count");
  if (options_.momentum != 0.0f && updates > 0) restore_tensor(state, "momentum_buffer", momentum_);
  if (updates > 0) restore_frozen_state(state);
  set_updates(updates);
}

void SGD::apply(const kernels::StepState& host) {
  const nn::FlatParameters& p = *params_;
  if (options_.momentum != 0.0f && !momentum_.defined()) {
    MemoryCategoryScope scope(MemoryCategory::optimizer_state);
    momentum_ = Tensor::empty(p.values().shape(), DType::f32, p.device());  // set to g by the first update
  }
  float* w = p.values().data<float>();
  const float* g = p.gradients().data<float>();
  float* buf = momentum_.defined() ? momentum_.data<float>() : nullptr;
  const int64_t n = p.size();
  const SGDOptions& o = options_;
  const kernels::FrozenChunks frozen = frozen_chunks();
  // One pass over everything, or one per run of parameters sharing a group's setting.
  const std::vector<Segment> all{Segment{0, n, 1.0f, -1.0f}};
  for (const Segment& seg : segments().empty() ? all : segments()) {
    const int64_t off = seg.offset;
    const float wd = seg.weight_decay >= 0.0f ? seg.weight_decay : o.weight_decay;
    const kernels::FrozenChunks f = off == 0 ? frozen : offset_frozen(frozen, off);
    float* b = buf ? buf + off : nullptr;
    if (p.device().is_cpu()) {
      if (host.skip) return;
      kernels::sgd_step_cpu(w + off, g + off, b, seg.count, host.grad_scale, host.lr * seg.lr_scale, o.momentum,
                            o.dampening, o.nesterov, wd, host.updates, f);
      continue;
    }
    CUMULUS_DISPATCH(p.device(), ctx, (void)0,
                     kernels::sgd_update_cuda(w + off, g + off, b, seg.count, step_buffers(), o.momentum, o.dampening,
                                              o.nesterov, wd, f, ctx.stream(), seg.lr_scale));
  }
}

}  // namespace cumulus::optim
