// clip_grad_norm: the Trainer's step decision (kernels::prepare_step, on a step state of its own
// with the clipping on and nothing else) and the clipped gradient g * clip, which is what the
// Trainer's update multiplies each gradient by when there is no normalization to fold in.
#include "cumulus/nn/clip_grad.h"

#include <cmath>
#include <cstring>

#include "engine/ops/internal.h"
#include "kernels/cpu/pointwise_kernels.h"
#include "kernels/optim_rules.h"
#if CUMULUS_WITH_CUDA
#include "kernels/cuda/pointwise_kernels.h"
#endif

namespace cumulus::nn {

namespace {

kernels::StepConfig clipping_only(float max_norm) {
  kernels::StepConfig config{};
  config.need_norm = 1;
  config.clip_grad_norm = max_norm;
  config.lr_table_size = 1;
  return config;
}

// The decision of a step that only clips: the gradient's norm and clip factor.
kernels::StepState decide(const FlatParameters& parameters, float max_norm) {
  const kernels::StepConfig config = clipping_only(max_norm);
  const float* grad = parameters.gradients().data<float>();
  const int64_t n = parameters.size();
  kernels::StepState state{};
  if (parameters.device().is_cpu()) {
    const float lr_table[1] = {0.0f};
    kernels::UpdateScalars unused{};
    kernels::prepare_step(state, unused, kernels::sum_squares_cpu(grad, n), config, lr_table);
    return state;
  }
#if CUMULUS_WITH_CUDA
  MemoryCategoryScope scope(MemoryCategory::other);
  const Tensor buffers =
      Tensor::zeros(Shape{static_cast<int64_t>(sizeof(kernels::StepBuffers))}, DType::u8, parameters.device());
  const Tensor scalars =
      Tensor::zeros(Shape{static_cast<int64_t>(sizeof(kernels::UpdateScalars))}, DType::u8, parameters.device());
  const Tensor lr_table = Tensor::zeros(Shape{1}, DType::f32, parameters.device());
  auto* buf = static_cast<kernels::StepBuffers*>(buffers.raw_data());
  CUMULUS_DISPATCH(parameters.device(), ctx, (void)0,
                   kernels::grad_norm_and_prepare_step_cuda(grad, n, buf,
                                                            static_cast<kernels::UpdateScalars*>(scalars.raw_data()),
                                                            config, lr_table.data<float>(), ctx.stream()));
  copy_bytes(&state, Device::cpu(), &buf->state, parameters.device(), sizeof state);
#endif
  return state;
}

}  // namespace

float clip_grad_norm(FlatParameters& parameters, float max_norm) {
  CUMULUS_CHECK(max_norm > 0.0f && std::isfinite(max_norm), InvalidArgument,
                "clip_grad_norm: max_norm must be finite and > 0, got ", max_norm);
  CUMULUS_CHECK(!parameters.gradients_sharded(), InvalidArgument,
                "clip_grad_norm: the gradients are sharded across ranks (ZeRO stage 2); clip with the Trainer's "
                "clip_grad_norm option, whose norm is all ranks'");
  NoGradGuard no_grad;
  parameters.zero_stale_gradients();
  const kernels::StepState state = decide(parameters, max_norm);
  if (state.clip != 1.0f) {
    float* grad = parameters.gradients().data<float>();
    const int64_t n = parameters.size();
    using kernels::BinaryOp;
    CUMULUS_DISPATCH(parameters.device(), ctx,
                     kernels::scalar_forward_cpu(BinaryOp::mul, false, state.clip, grad, grad, n),
                     kernels::scalar_forward_cuda(BinaryOp::mul, false, state.clip, grad, grad, n, ctx.stream()));
  }
  return state.grad_norm;
}

}  // namespace cumulus::nn
