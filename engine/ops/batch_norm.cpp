// batch_norm2d: per channel c of x [N, C, H, W],
//   y = weight[c] * (x - mean[c]) * invstd[c] + bias[c],  invstd = 1 / sqrt(var + eps)
// with the batch's mean and biased variance (training; the running statistics are updated in
// place with the unbiased variance and num_batches_tracked is incremented) or the running
// statistics (evaluation). CPU: vectorized loops (kernels/cpu/batch_norm.cpp); CUDA: cuDNN for f32,
// kernels of our own for bf16 and f16 (Note [bf16 on cuDNN] in kernels/cuda/cudnn_kernels.h).
// Saves x, the weight and the [C] mean and invstd actually used; x_hat is recomputed in backward
// rather than kept (it would be another tensor the size of x). Backward:
//   dbias (+)= sum dy,  dweight (+)= sum dy * x_hat   (the sinks' betas; accumulated in the
//   kernel, or in cuDNN through its betaParamDiff)
//   dx = weight * invstd * (dy - mean(dy) - x_hat * mean(dy * x_hat))   (training)
//   dx = weight * invstd * dy                                           (evaluation)
// Under gradient accumulation every micro-batch is normalized by its own statistics, as in every
// framework: 16 x 4 then matches four separate micro-batches of 16, not one batch of 64.
// A bf16 or f16 x gives y and dx in its type; the statistics, the parameters and their gradients
// stay f32 (Note [Mixed precision] in engine/ops/linear.cpp).
#include "cumulus/autograd/checkpoint.h"
#include "cumulus/autograd/node.h"
#include "cumulus/ops/normalization.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/ops/shape.h"
#include "engine/core/cudnn_context.h"
#include "engine/ops/internal.h"
#include "kernels/cpu/conv_kernels.h"
#if CUMULUS_WITH_CUDNN
#include "kernels/cuda/cudnn_kernels.h"
#endif

namespace cumulus::ops {

namespace {

float* data_or_null(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }

class BatchNormBackward final : public Node {
 public:
  BatchNormBackward(Tensor x, Tensor weight, Tensor save_mean, Tensor save_invstd, bool training, float eps)
      : Node("batch_norm2d"),
        x_(std::move(x)),
        weight_(std::move(weight)),
        save_mean_(std::move(save_mean)),
        save_invstd_(std::move(save_invstd)),
        training_(training),
        eps_(eps) {}

  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    const Device device = dy.device();
    const DType type = x_.dtype();
    const int64_t n = x_.size(0), c = x_.size(1), hw = x_.size(2) * x_.size(3);
    const Shape param_shape{c};
    const float* gp = weight_.data<float>();
    const float* mp = save_mean_.data<float>();
    const float* ip = save_invstd_.data<float>();

#if CUMULUS_WITH_CUDNN
    if (device.is_cuda() && training_ && kernels::cudnn_runs_batch_norm(type)) {
      cudnn_training_backward(dy, grads);
      return;
    }
#endif
    GradSink::Target dx{Tensor(), GradientMode::overwrite}, dgamma{Tensor(), GradientMode::overwrite},
        dbeta{Tensor(), GradientMode::overwrite};
    if (grads[0].needed()) dx = grads[0].begin(x_.shape(), device, type);
    if (grads[1].needed()) dgamma = grads[1].begin(param_shape, device);
    if (grads[2].needed()) dbeta = grads[2].begin(param_shape, device);
    float* dgp = data_or_null(dgamma.tensor);
    float* dbp = data_or_null(dbeta.tensor);
    void* dxp = dx.tensor.defined() ? dx.tensor.raw_data() : nullptr;
    CUMULUS_DISPATCH_FLOAT(
        type, T,
        CUMULUS_DISPATCH(
            device, ctx,
            kernels::batch_norm_backward_cpu(x_.data<T>(), dy.data<T>(), gp, mp, ip, n, c, hw, training_, dx.beta(),
                                             static_cast<T*>(dxp), dgamma.beta(), dgp, dbeta.beta(), dbp),
            CUMULUS_CUDNN_ONLY(training_  // bf16, f16 (Note [bf16 on cuDNN])
                                   ? kernels::batch_norm_backward_training_cuda(
                                         x_.data<T>(), dy.data<T>(), gp, mp, ip, n, c, hw, dx.beta(),
                                         static_cast<T*>(dxp), dgamma.beta(), dgp, dbeta.beta(), dbp, ctx.stream())
                                   : kernels::batch_norm_backward_inference_cuda(
                                         type, x_.raw_data(), dy.raw_data(), gp, mp, ip, n, c, hw, dx.beta(), dxp,
                                         dgamma.beta(), dgp, dbeta.beta(), dbp, ctx.stream()))));
  }

  void release_saved() override {
    x_ = Tensor();
    weight_ = Tensor();
    save_mean_ = Tensor();
    save_invstd_ = Tensor();
  }

 private:
#if CUMULUS_WITH_CUDNN
  // cudnnBatchNormalizationBackward writes dx, dweight and dbias in one call, the two parameter
  // gradients with one shared beta. Outputs nobody needs go to scratch (category
  // backward_temporaries, freed on return); when the two parameter sinks want different betas (one
  // buffer stale, the other not: only if something marked them separately) both are computed into
  // scratch and added with their own betas.
  void cudnn_training_backward(const Tensor& dy, std::vector<GradSink>& grads) {
    const Device device = dy.device();
    const int64_t n = x_.size(0), c = x_.size(1), hw = x_.size(2) * x_.size(3);
    const Shape param_shape{c};
    GradSink::Target dx{Tensor(), GradientMode::overwrite}, dgamma{Tensor(), GradientMode::overwrite},
        dbeta{Tensor(), GradientMode::overwrite};
    if (grads[0].needed()) dx = grads[0].begin(x_.shape(), device, x_.dtype());
    else dx.tensor = Tensor::empty(x_.shape(), x_.dtype(), device);
    if (grads[1].needed()) dgamma = grads[1].begin(param_shape, device);
    if (grads[2].needed()) dbeta = grads[2].begin(param_shape, device);

    const bool both = grads[1].needed() && grads[2].needed();
    const bool split = both && dgamma.beta() != dbeta.beta();
    float beta_params = 0.0f;
    Tensor g_out = dgamma.tensor, b_out = dbeta.tensor;
    if (split || !g_out.defined()) g_out = Tensor::empty(param_shape, DType::f32, device);
    if (split || !b_out.defined()) b_out = Tensor::empty(param_shape, DType::f32, device);
    if (!split) {
      // The one parameter sink that is needed decides the beta (the scratch one is discarded).
      if (grads[1].needed()) beta_params = dgamma.beta();
      else if (grads[2].needed()) beta_params = dbeta.beta();
    }
    const float* gp = weight_.data<float>();
    const float* mp = save_mean_.data<float>();
    const float* ip = save_invstd_.data<float>();
    float* dgp = g_out.data<float>();
    float* dbp = b_out.data<float>();
    CUMULUS_DISPATCH(device, ctx, (void)0,
                     kernels::batch_norm_backward_training_cuda(
                         cudnn::handle(device.index()), x_.dtype(), x_.raw_data(), dy.raw_data(), gp, mp, ip, n, c, hw,
                         eps_, dx.beta(), dx.tensor.raw_data(), beta_params, dgp, dbp));
    if (split) {
      detail::accumulate_into(dgamma.tensor, g_out, dgamma.beta());
      detail::accumulate_into(dbeta.tensor, b_out, dbeta.beta());
    }
  }
#endif

  Tensor x_, weight_, save_mean_, save_invstd_;
  bool training_;
  [[maybe_unused]] float eps_;  // read by the CUDA backward only
};

void check_channel_vector(const char* what, const Tensor& t, const Tensor& x) {
  detail::check_dtype("batch_norm2d", what, t, DType::f32);
  CUMULUS_CHECK(t.ndim() == 1 && t.size(0) == x.size(1), ShapeError, "batch_norm2d: ", what, " ", t.shape().str(),
                " does not match the input's ", x.size(1), " channels");
  detail::check_same_device("batch_norm2d", what, t, x);
}

// The arguments' checks, each naming what is wrong: a 4-D floating input, per-channel f32
// parameters and statistics on its device, dense running statistics that need no gradient.
void check_batch_norm_args(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                           const Tensor& running_var, const Tensor& num_batches_tracked,
                           const BatchNormOptions& options) {
  constexpr const char* op = "batch_norm2d";
  detail::check_floating(op, "input", x);
  CUMULUS_CHECK(x.ndim() == 4, ShapeError, op, ": input must be [batch, channels, height, width], got ",
                x.shape().str());
  CUMULUS_CHECK(x.numel() > 0, ShapeError, op, ": empty input ", x.shape().str());
  check_channel_vector("weight", weight, x);
  check_channel_vector("bias", bias, x);
  CUMULUS_CHECK(running_mean.defined() == running_var.defined(), InvalidArgument, op,
                ": running_mean and running_var must both be given or both be undefined");
  const bool has_running = running_mean.defined();
  if (has_running) {
    check_channel_vector("running_mean", running_mean, x);
    check_channel_vector("running_var", running_var, x);
    CUMULUS_CHECK(running_mean.is_contiguous() && running_var.is_contiguous(), InvalidArgument, op,
                  ": running_mean and running_var are updated in place, so they must be dense, not strided views");
    CUMULUS_CHECK(!running_mean.requires_grad() && !running_var.requires_grad(), InvalidArgument, op,
                  ": running statistics are buffers and must not require grad");
  }
  if (num_batches_tracked.defined()) {
    detail::check_dtype(op, "num_batches_tracked", num_batches_tracked, DType::i32);
    CUMULUS_CHECK(num_batches_tracked.numel() == 1, ShapeError, op, ": num_batches_tracked must be a scalar, got ",
                  num_batches_tracked.shape().str());
    detail::check_same_device(op, "num_batches_tracked", num_batches_tracked, x);
  }
  CUMULUS_CHECK(options.eps >= 0.0f, InvalidArgument, op, ": eps ", options.eps, " must not be negative");
  CUMULUS_CHECK(options.momentum >= 0.0f && options.momentum <= 1.0f, InvalidArgument, op, ": momentum ",
                options.momentum, " must be in [0, 1]");
  const int64_t n = x.size(0), hw = x.size(2) * x.size(3);
  if (options.training) {
    CUMULUS_CHECK(n * hw > 1, ShapeError, op, ": training needs more than one value per channel, got input ",
                  x.shape().str());
  } else {
    CUMULUS_CHECK(has_running, InvalidArgument, op, ": evaluation mode needs running_mean and running_var");
  }
}

// One forward's operands: the running statistics null where they stay alone, the saved ones [C].
struct BatchNormForward {
  const Tensor& x;
  Tensor& y;
  const float *gp, *bp;
  float *rm, *rv, *smp, *sip;
  int64_t n, c, hw;
  float eps, momentum;
};

// On CUDA, bf16 and f16 take kernels of our own in both modes (Note [bf16 on cuDNN]).
void forward_training(const BatchNormForward& f) {
  const Device device = f.x.device();
  const DType type = f.x.dtype();
  CUMULUS_DISPATCH_FLOAT(
      type, T,
      CUMULUS_DISPATCH(
          device, ctx,
          kernels::batch_norm_forward_training_cpu(f.x.data<T>(), f.gp, f.bp, f.n, f.c, f.hw, f.eps, f.momentum, f.rm,
                                                   f.rv, f.y.data<T>(), f.smp, f.sip),
          CUMULUS_CUDNN_ONLY(kernels::cudnn_runs_batch_norm(type)
                                 ? kernels::batch_norm_forward_training_cuda(
                                       cudnn::handle(device.index()), type, f.x.raw_data(), f.gp, f.bp, f.n, f.c, f.hw,
                                       f.eps, f.momentum, f.rm, f.rv, f.y.raw_data(), f.smp, f.sip)
                                 : kernels::batch_norm_forward_training_cuda(
                                       f.x.data<T>(), f.gp, f.bp, f.n, f.c, f.hw, f.eps, f.momentum, f.rm, f.rv,
                                       f.y.data<T>(), f.smp, f.sip, ctx.stream()))));
}

void forward_inference(const BatchNormForward& f) {
  const Device device = f.x.device();
  const DType type = f.x.dtype();
  CUMULUS_DISPATCH_FLOAT(
      type, T,
      CUMULUS_DISPATCH(
          device, ctx,
          kernels::batch_norm_forward_inference_cpu(f.x.data<T>(), f.gp, f.bp, f.rm, f.rv, f.n, f.c, f.hw, f.eps,
                                                    f.y.data<T>(), f.smp, f.sip),
          CUMULUS_CUDNN_ONLY(
              kernels::cudnn_runs_batch_norm(type)
                  ? kernels::batch_norm_forward_inference_cuda(cudnn::handle(device.index()), type, f.x.raw_data(),
                                                               f.gp, f.bp, f.rm, f.rv, f.n, f.c, f.hw, f.eps,
                                                               f.y.raw_data(), f.smp, f.sip, ctx.stream())
                  : kernels::batch_norm_forward_inference_cuda(f.x.data<T>(), f.gp, f.bp, f.rm, f.rv, f.n, f.c, f.hw,
                                                               f.eps, f.y.data<T>(), f.smp, f.sip, ctx.stream()))));
}

}  // namespace

Tensor batch_norm2d(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, const Tensor& running_mean,
                    const Tensor& running_var, const Tensor& num_batches_tracked, const BatchNormOptions& options) {
  constexpr const char* op = "batch_norm2d";
  OpScope op_scope(op);
  const Tensor x = detail::contiguous(x_in);
  const Tensor weight = detail::contiguous(weight_in);
  const Tensor bias = detail::contiguous(bias_in);
  check_batch_norm_args(x, weight, bias, running_mean, running_var, num_batches_tracked, options);
  const bool has_running = running_mean.defined();
  const int64_t n = x.size(0), c = x.size(1), hw = x.size(2) * x.size(3);

  const Device device = x.device();
  Tensor y = detail::new_output(x.shape(), x.dtype(), device);
  // The statistics used, for backward ([C] each; freed on return when nothing is recorded).
  Tensor save_mean = detail::new_output(Shape{c}, DType::f32, device);
  Tensor save_invstd = detail::new_output(Shape{c}, DType::f32, device);
  // A recomputed training forward (Note [Recompute] in engine/autograd/checkpoint.cpp) normalizes
  // with the batch's statistics as the first run did, but the first run already updated the
  // running statistics and the counter: null pointers leave them alone (cuDNN likewise).
  const bool update_running = options.training && !recomputing();
  float* rm = has_running && (update_running || !options.training) ? running_mean.data<float>() : nullptr;
  float* rv = has_running && (update_running || !options.training) ? running_var.data<float>() : nullptr;
  const BatchNormForward f{
      x, y,  weight.data<float>(), bias.data<float>(), rm, rv, save_mean.data<float>(), save_invstd.data<float>(), n,
      c, hw, options.eps,          options.momentum};
  if (options.training) {
    forward_training(f);
    if (num_batches_tracked.defined() && update_running) {
      int32_t* counter = num_batches_tracked.data<int32_t>();
      CUMULUS_DISPATCH(device, ctx, counter[0] += 1,
                       CUMULUS_CUDNN_ONLY(kernels::increment_i32_cuda(counter, ctx.stream())));
    }
  } else {
    forward_inference(f);
  }

  if (should_record({&x, &weight, &bias})) {
    auto node = std::make_shared<BatchNormBackward>(x.detach(), weight.detach(), std::move(save_mean),
                                                    std::move(save_invstd), options.training, options.eps);
    attach_node(y, std::move(node), {&x, &weight, &bias});
  }
  return y;
}

}  // namespace cumulus::ops
