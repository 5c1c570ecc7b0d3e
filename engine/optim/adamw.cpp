#include "cumulus/optim/adamw.h"

#include <cmath>

#include "engine/ops/internal.h"
#include "engine/optim/state_8bit.h"
#include "kernels/optim_rules.h"

namespace cumulus::optim {

AdamW::AdamW(std::shared_ptr<nn::FlatParameters> params, const AdamWOptions& options)
    : Optimizer(std::move(params), options.lr), options_(options) {
  CUMULUS_CHECK(options.beta1 >= 0.0f && options.beta1 < 1.0f && options.beta2 >= 0.0f && options.beta2 < 1.0f,
                InvalidArgument, "AdamW: betas must be in [0, 1), got (", options.beta1, ", ", options.beta2, ")");
  CUMULUS_CHECK(options.eps > 0.0f, InvalidArgument, "AdamW: eps must be > 0, got ", options.eps);
  CUMULUS_CHECK(options.weight_decay >= 0.0f, InvalidArgument, "AdamW: weight_decay must be >= 0, got ",
                options.weight_decay);
  check_state_bits(options.state_bits, "AdamW");
}

void AdamW::set_state_bits(int bits) {
  check_no_state_yet("AdamW::set_state_bits");
  check_state_bits(bits, "AdamW");
  options_.state_bits = bits;
}

std::vector<StateSpec> AdamW::state_specs() const {
  if (options_.state_bits == 32) return {{"exp_avg"}, {"exp_avg_sq"}};
  std::vector<StateSpec> specs = state_8bit_specs("exp_avg");
  for (StateSpec& spec : state_8bit_specs("exp_avg_sq")) specs.push_back(spec);
  return specs;
}

void AdamW::update(const UpdateScalars* scalars, const UpdateSpan& span) {
  const AdamWOptions& o = options_;
  float* w = span.values;
  const float* g = span.gradients;
  const float wd = span.weight_decay_or(o.weight_decay);
  if (o.state_bits == 8) {
    const kernels::QuantizedState m = quantized_span(state_array(0), state_array(1), span.state_offset);
    const kernels::QuantizedState v = quantized_span(state_array(2), state_array(3), span.state_offset);
    CUMULUS_DISPATCH(span.device, ctx,
                     kernels::adamw_step_8bit_cpu(w, g, m, v, span.count, scalars->grad_scale,
                                                  scalars->lr * span.lr_scale, o.beta1, o.beta2, o.eps, wd,
                                                  scalars->updates, span.frozen),
                     kernels::adamw_update_8bit_cuda(w, g, m, v, span.count, scalars, o.beta1, o.beta2, o.eps, wd,
                                                     span.frozen, ctx.stream(), span.lr_scale));
    return;
  }
  float* m = state_array(0).data<float>() + span.state_offset;
  float* v = state_array(1).data<float>() + span.state_offset;
  CUMULUS_DISPATCH(span.device, ctx,
                   kernels::adamw_step_cpu(w, g, m, v, span.count, scalars->grad_scale, scalars->lr * span.lr_scale,
                                           o.beta1, o.beta2, o.eps, wd, scalars->updates, span.frozen),
                   kernels::adamw_update_cuda(w, g, m, v, span.count, scalars, o.beta1, o.beta2, o.eps, wd, span.frozen,
                                              ctx.stream(), span.lr_scale));
}

}  // namespace cumulus::optim
