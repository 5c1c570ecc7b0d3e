#include "cumulus/optim/adamw.h"

#include <cmath>

#include "engine/ops/internal.h"
#include "kernels/optim_rules.h"

namespace cumulus::optim {

AdamW::AdamW(std::shared_ptr<nn::FlatParameters> params, const AdamWOptions& options)
    : Optimizer(std::move(params), options.lr), options_(options) {
  CUMULUS_CHECK(options.beta1 >= 0.0f && options.beta1 < 1.0f && options.beta2 >= 0.0f && options.beta2 < 1.0f,
                InvalidArgument, "AdamW: betas must be in [0, 1), got (", options.beta1, ", ", options.beta2, ")");
  CUMULUS_CHECK(options.eps > 0.0f, InvalidArgument, "AdamW: eps must be > 0, got ", options.eps);
  CUMULUS_CHECK(options.weight_decay >= 0.0f, InvalidArgument, "AdamW: weight_decay must be >= 0, got ",
                options.weight_decay);
}

int64_t AdamW::state_bytes() const {
  return (m_.defined() ? static_cast<int64_t>(m_.allocated_bytes() + v_.allocated_bytes()) : 0) + frozen_state_bytes();
}

std::vector<int64_t> AdamW::state_to_allocate() const {
  if (m_.defined()) return {};
  const auto bytes = static_cast<int64_t>(params_->values().nbytes());  // m and v, shaped as the values
  return {bytes, bytes};
}

std::vector<std::pair<std::string, Tensor>> AdamW::state() const {
  if (!m_.defined()) return {};
  std::vector<std::pair<std::string, Tensor>> out{{"exp_avg", m_}, {"exp_avg_sq", v_}};
  append_frozen_state(out);
  return out;
}

std::vector<std::string> AdamW::moment_names() const { return {"exp_avg", "exp_avg_sq"}; }

void AdamW::load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t updates) {
  CUMULUS_CHECK(updates >= 0, InvalidArgument, "AdamW::load_state: negative update count");
  if (updates > 0) {
    restore_tensor(state, "exp_avg", m_);
    restore_tensor(state, "exp_avg_sq", v_);
    restore_frozen_state(state);
  }
  set_updates(updates);
}

void AdamW::apply(const kernels::StepState& host) {
  const nn::FlatParameters& p = *params_;
  if (!m_.defined()) {
    MemoryCategoryScope scope(MemoryCategory::optimizer_state);
    m_ = Tensor::zeros(p.values().shape(), DType::f32, p.device());
    v_ = Tensor::zeros(p.values().shape(), DType::f32, p.device());
  }
  const AdamWOptions& o = options_;
  float* w = p.values().data<float>();
  const float* g = p.gradients().data<float>();
  float* m = m_.data<float>();
  float* v = v_.data<float>();
  const int64_t n = p.size();
  const kernels::FrozenChunks frozen = frozen_chunks();
  // One pass over everything, or one per run of parameters sharing a group's setting.
  const std::vector<Segment> all{Segment{0, n, 1.0f, -1.0f}};
  for (const Segment& seg : segments().empty() ? all : segments()) {
    const int64_t off = seg.offset;
    const float wd = seg.weight_decay >= 0.0f ? seg.weight_decay : o.weight_decay;
    const kernels::FrozenChunks f = off == 0 ? frozen : offset_frozen(frozen, off);
    if (p.device().is_cpu()) {
      if (host.skip) return;
      kernels::adamw_step_cpu(w + off, g + off, m + off, v + off, seg.count, host.grad_scale, host.lr * seg.lr_scale,
                              o.beta1, o.beta2, o.eps, wd, host.updates, f);
      continue;
    }
    CUMULUS_DISPATCH(p.device(), ctx, (void)0,
                     kernels::adamw_update_cuda(w + off, g + off, m + off, v + off, seg.count, step_buffers(), o.beta1,
                                                o.beta2, o.eps, wd, f, ctx.stream(), seg.lr_scale));
  }
}

}  // namespace cumulus::optim
