// layer_norm over the last dimension, as PyTorch's: each row of x [rows, cols] normalized by its
// mean and biased variance (eps inside the square root), then scaled by weight and shifted by bias
// (f32, optional). Forward saves x and each row's mean and rstd = 1 / sqrt(var + eps) (f32, rows
// values each: small beside x), so backward recomputes x_hat instead of keeping it:
//   dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)),  g = dy * weight
//   dweight (+)= sum_rows dy * x_hat,  dbias (+)= sum_rows dy
// The parameter gradients are written straight into their sinks with the sinks' beta; on CUDA as
// column sums in a fixed order (no atomics), so they are the same bits on every run.
#include "cumulus/autograd/node.h"
#include "cumulus/ops/normalization.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/ops/shape.h"
#include "engine/ops/internal.h"
#include "kernels/cpu/structural_kernels.h"
#if CUMULUS_WITH_CUDA
#include "kernels/cuda/structural_kernels.h"
#endif

namespace cumulus::ops {

namespace {

const float* data_or_null(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }

#if CUMULUS_WITH_CUDA
// dx, then the parameter gradients (each skipped when null): the column sums over a grid of row
// chunks, their partials (f64, as i64 storage) in category workspace, freed on return.
template <typename T>
void backward_cuda(const T* x, const T* dy, const float* weight, const float* mean, const float* rstd, int64_t rows,
                   int64_t cols, float beta, T* dx, float beta_dw, float* dweight, float beta_db, float* dbias,
                   const Device& device, cudaStream_t stream) {
  if (dx != nullptr) kernels::layer_norm_backward_dx_cuda(x, dy, weight, mean, rstd, rows, cols, beta, dx, stream);
  if (dweight == nullptr && dbias == nullptr) return;
  Tensor partials;
  if (const int64_t n = kernels::layer_norm_param_grads_partials(rows, cols); n > 0) {
    MemoryCategoryScope scope(MemoryCategory::workspace);
    partials = Tensor::empty(Shape{n}, DType::i64, device);
  }
  auto* pp = partials.defined() ? static_cast<double*>(partials.raw_data()) : nullptr;
  kernels::layer_norm_param_grads_cuda(x, dy, mean, rstd, rows, cols, beta_dw, dweight, beta_db, dbias, pp, stream);
}
#endif

class LayerNormBackward final : public Node {
 public:
  LayerNormBackward(Tensor x, Tensor weight, Tensor mean, Tensor rstd)
      : Node("layer_norm"),
        x_(std::move(x)),
        weight_(std::move(weight)),
        mean_(std::move(mean)),
        rstd_(std::move(rstd)) {}

  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    const Device device = dy.device();
    const int64_t cols = x_.size(-1), rows = cols > 0 ? x_.numel() / cols : 0;
    GradSink::Target dx{Tensor(), GradientMode::overwrite}, dw = dx, db = dx;
    if (grads[0].needed()) dx = grads[0].begin(x_.shape(), device, x_.dtype());
    if (grads.size() > 1 && grads[1].needed()) dw = grads[1].begin(Shape{cols}, device);
    if (grads.size() > 2 && grads[2].needed()) db = grads[2].begin(Shape{cols}, device);
    const float *mp = mean_.data<float>(), *rp = rstd_.data<float>(), *wp = data_or_null(weight_);
    float* dwp = dw.tensor.defined() ? dw.tensor.data<float>() : nullptr;
    float* dbp = db.tensor.defined() ? db.tensor.data<float>() : nullptr;
    const float beta = dx.beta(), beta_w = dw.beta(), beta_b = db.beta();
    CUMULUS_DISPATCH_FLOAT(
        x_.dtype(), T, const T* xp = x_.data<T>(); const T* dyp = dy.data<T>();
        T* dxp = dx.tensor.defined() ? dx.tensor.data<T>() : nullptr; CUMULUS_DISPATCH(
            device, ctx,
            kernels::layer_norm_backward_cpu(xp, dyp, wp, mp, rp, rows, cols, beta, dxp, beta_w, dwp, beta_b, dbp),
            backward_cuda(xp, dyp, wp, mp, rp, rows, cols, beta, dxp, beta_w, dwp, beta_b, dbp, device, ctx.stream())));
  }
  void release_saved() override {
    x_ = Tensor();
    weight_ = Tensor();
    mean_ = Tensor();
    rstd_ = Tensor();
  }

 private:
  Tensor x_, weight_, mean_, rstd_;
};

void check_parameter(const char* what, const Tensor& p, const Tensor& x, int64_t normalized_size) {
  if (!p.defined()) return;
  detail::check_dtype("layer_norm", what, p, DType::f32);
  CUMULUS_CHECK(p.ndim() == 1 && p.size(0) == normalized_size, ShapeError, "layer_norm: ", what, " must be [",
                normalized_size, "], got ", p.shape().str());
  detail::check_same_device("layer_norm", what, p, x);
}

}  // namespace

Tensor layer_norm(const Tensor& x_in, int64_t normalized_size, const Tensor& weight_in, const Tensor& bias_in,
                  float eps) {
  constexpr const char* op = "layer_norm";
  OpScope op_scope(op);
  const Tensor x = detail::contiguous(x_in);
  const Tensor weight = weight_in.defined() ? detail::contiguous(weight_in) : weight_in;
  const Tensor bias = bias_in.defined() ? detail::contiguous(bias_in) : bias_in;
  detail::check_floating(op, "input", x);
  CUMULUS_CHECK(x.ndim() >= 1 && x.size(-1) == normalized_size && normalized_size > 0, ShapeError, op,
                ": normalized_size ", normalized_size, " must be the input's last dimension (> 0), input ",
                x.shape().str());
  CUMULUS_CHECK(eps >= 0.0f, InvalidArgument, op, ": eps must be >= 0, got ", eps);
  check_parameter("weight", weight, x, normalized_size);
  check_parameter("bias", bias, x, normalized_size);
  const Device device = x.device();
  const int64_t cols = normalized_size, rows = x.numel() / cols;
  Tensor y = detail::new_output(x.shape(), x.dtype(), device);
  Tensor mean = detail::new_output(Shape{rows}, DType::f32, device);
  Tensor rstd = detail::new_output(Shape{rows}, DType::f32, device);
  const float *wp = data_or_null(weight), *bp = data_or_null(bias);
  float *mp = mean.data<float>(), *rp = rstd.data<float>();
  CUMULUS_DISPATCH_FLOAT(x.dtype(), T, const T* xp = x.data<T>(); T* yp = y.data<T>(); CUMULUS_DISPATCH(
                             device, ctx, kernels::layer_norm_forward_cpu(xp, wp, bp, rows, cols, eps, yp, mp, rp),
                             kernels::layer_norm_forward_cuda(xp, wp, bp, rows, cols, eps, yp, mp, rp, ctx.stream())));
  if (should_record({&x, &weight, &bias})) {
    Tensor saved_w = weight.defined() ? weight.detach() : Tensor();
    attach_node(y, std::make_shared<LayerNormBackward>(x.detach(), saved_w, mean, rstd), {&x, &weight, &bias});
  }
  return y;
}

// Several normalized dimensions are one row of their product's width: x, weight and bias are
// viewed (reshape, no copy) as the one-dimension form, and the output viewed back.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias, float eps) {
  constexpr const char* op = "layer_norm";
  const int nn = normalized_shape.ndim(), lead = x.defined() ? x.ndim() - nn : -1;
  bool match = nn >= 1 && lead >= 0;
  for (int d = 0; match && d < nn; ++d) match = x.size(lead + d) == normalized_shape[d];
  CUMULUS_CHECK(match, ShapeError, op, ": normalized_shape ", normalized_shape.str(),
                " must be the input's last dimensions, input ", x.defined() ? x.shape().str() : "undefined");
  if (nn == 1) return layer_norm(x, normalized_shape[0], weight, bias, eps);
  for (const Tensor* p : {&weight, &bias})
    CUMULUS_CHECK(!p->defined() || p->shape() == normalized_shape, ShapeError, op, ": ",
                  p == &weight ? "weight" : "bias", " must be ", normalized_shape.str(), ", got ", p->shape().str());
  const int64_t cols = normalized_shape.numel();
  Shape rows_shape;
  for (int d = 0; d < lead; ++d) rows_shape.push_back(x.size(d));
  rows_shape.push_back(cols);
  const Tensor w = weight.defined() ? reshape(weight, Shape{cols}) : weight;
  const Tensor b = bias.defined() ? reshape(bias, Shape{cols}) : bias;
  return reshape(layer_norm(reshape(x, rows_shape), cols, w, b, eps), x.shape());
}

}  // namespace cumulus::ops
