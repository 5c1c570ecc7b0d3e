#include "cumulus/optim/sgd.h"

#include "engine/ops/internal.h"
#include "engine/optim/state_8bit.h"
#include "kernels/optim_rules.h"

namespace cumulus::optim {

SGD::SGD(std::shared_ptr<nn::FlatParameters> params, const SGDOptions& options)
    : Optimizer(std::move(params), options.lr), options_(options) {
  CUMULUS_CHECK(options.momentum >= 0.0f, InvalidArgument, "SGD: momentum must be >= 0, got ", options.momentum);
  CUMULUS_CHECK(options.weight_decay >= 0.0f, InvalidArgument, "SGD: weight_decay must be >= 0, got ",
                options.weight_decay);
  CUMULUS_CHECK(!options.nesterov || (options.momentum > 0.0f && options.dampening == 0.0f),
                InvalidArgument, "SGD: Nesterov momentum needs momentum > 0 and dampening 0");
  check_state_bits(options.state_bits, "SGD");
}

void SGD::set_state_bits(int bits) {
  check_no_state_yet("SGD::set_state_bits");
  check_state_bits(bits, "SGD");
  CUMULUS_CHECK(bits == 32 || options_.momentum != 0.0f, InvalidArgument,
                "SGD::set_state_bits: without momentum SGD keeps no state to keep in ", bits, " bits");
  options_.state_bits = bits;
}

std::vector<StateSpec> SGD::state_specs() const {
  if (options_.momentum == 0.0f) return {};
  if (options_.state_bits == 8) return state_8bit_specs("momentum_buffer");
  return {{"momentum_buffer"}};
}

void SGD::update(const UpdateScalars* scalars, const UpdateSpan& span) {
  float* w = span.values;
  const float* g = span.gradients;
  const SGDOptions& o = options_;
  const float wd = span.weight_decay_or(o.weight_decay);
  if (o.momentum != 0.0f && o.state_bits == 8) {
    const kernels::QuantizedState buf = quantized_span(state_array(0), state_array(1), span.state_offset);
    CUMULUS_DISPATCH(span.device, ctx,
                     kernels::sgd_step_8bit_cpu(w, g, buf, span.count, scalars->grad_scale,
                                                scalars->lr * span.lr_scale, o.momentum, o.dampening, o.nesterov, wd,
                                                scalars->updates, span.frozen),
                     kernels::sgd_update_8bit_cuda(w, g, buf, span.count, scalars, o.momentum, o.dampening,
                                                   o.nesterov, wd, span.frozen, ctx.stream(), span.lr_scale));
    return;
  }
  float* buf = o.momentum != 0.0f ? state_array(0).data<float>() + span.state_offset : nullptr;
  CUMULUS_DISPATCH(span.device, ctx,
                   kernels::sgd_step_cpu(w, g, buf, span.count, scalars->grad_scale, scalars->lr * span.lr_scale,
                                         o.momentum, o.dampening, o.nesterov, wd, scalars->updates, span.frozen),
                   kernels::sgd_update_cuda(w, g, buf, span.count, scalars, o.momentum, o.dampening, o.nesterov, wd,
                                            span.frozen, ctx.stream(), span.lr_scale));
}

}  // namespace cumulus::optim
