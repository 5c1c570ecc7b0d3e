// max_pool2d: y[n, c, i, j] = max over the window of output (i, j) of x[n, c].  x: [N, C, H, W]
//   -> y: [N, C, OH, OW], OH = (H + 2 pad_h - kernel_h) / stride_h + 1 (floor, as PyTorch's default).
// Backward: dx (+)= dy routed to each window's maximum (summed where windows overlap).
// Saves x, never an index tensor: the CPU and our CUDA kernels recompute each window's argmax from
// x, and cuDNN's backward reads x and y, so for cuDNN y is saved too. In the CNN both are alive
// anyway (the ReLU before the pool saves x, the layer after it saves y), so the pool adds nothing to
// the footprint. bf16 and f16 pool in their own type (a maximum needs no rounding); on CUDA f32 and
// f16 pool through cuDNN, bf16 with kernels of our own (Note [bf16 on cuDNN] in
// kernels/cuda/cudnn_kernels.h).
#include "cumulus/autograd/node.h"
#include "cumulus/ops/convolution.h"
#include "cumulus/ops/shape.h"
#include "engine/core/cudnn_context.h"
#include "engine/ops/internal.h"
#include "kernels/cpu/conv_kernels.h"
#if CUMULUS_WITH_CUDNN
#include "kernels/cuda/cudnn_kernels.h"
#endif

namespace cumulus::ops {

namespace {

class MaxPool2dBackward final : public Node {
 public:
  MaxPool2dBackward(Tensor x, Tensor y, const kernels::Pool2dGeometry& g)
      : Node("max_pool2d"), x_(std::move(x)), y_(std::move(y)), g_(g) {}

  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    if (!grads[0].needed()) return;
    const Device device = dy.device();
    const kernels::Pool2dGeometry& g = g_;
    const DType type = x_.dtype();
    GradSink::Target dx = grads[0].begin(x_.shape(), device, type);
    CUMULUS_DISPATCH_FLOAT(type, T,
        CUMULUS_DISPATCH(device, ctx,
            kernels::max_pool2d_backward_cpu(g, x_.data<T>(), dy.data<T>(), dx.beta(), dx.tensor.data<T>()),
            CUMULUS_CUDNN_ONLY(y_.defined()
                                   ? kernels::max_pool2d_backward_cuda(cudnn::handle(device.index()), g, type,
                                                                       x_.raw_data(), y_.raw_data(), dy.raw_data(),
                                                                       dx.beta(), dx.tensor.raw_data())
                                   : kernels::max_pool2d_backward_cuda(g, x_.data<T>(), dy.data<T>(), dx.beta(),
                                                                       dx.tensor.data<T>(), ctx.stream()))));
  }

  void release_saved() override {
    x_ = Tensor();
    y_ = Tensor();
  }

 private:
  Tensor x_, y_;  // y_: for cuDNN only
  kernels::Pool2dGeometry g_;
};

}  // namespace

Tensor max_pool2d(const Tensor& x_in, const MaxPool2dOptions& o) {
  constexpr const char* op = "max_pool2d";
  OpScope op_scope(op);
  const Tensor x = detail::contiguous(x_in);
  detail::check_floating(op, "input", x);
  CUMULUS_CHECK(x.ndim() == 4, ShapeError, op, ": input must be [batch, channels, height, width], got ",
                x.shape().str());
  CUMULUS_CHECK(x.numel() > 0, ShapeError, op, ": empty input ", x.shape().str());
  CUMULUS_CHECK(o.kernel_h > 0 && o.kernel_w > 0 && o.stride_h > 0 && o.stride_w > 0, InvalidArgument, op,
                ": kernel (", o.kernel_h, ", ", o.kernel_w, ") and stride (", o.stride_h, ", ", o.stride_w,
                ") must be positive");
  CUMULUS_CHECK(o.pad_h >= 0 && o.pad_w >= 0 && 2 * o.pad_h <= o.kernel_h && 2 * o.pad_w <= o.kernel_w,
                InvalidArgument, op, ": padding (", o.pad_h, ", ", o.pad_w, ") must be in [0, half the kernel (",
                o.kernel_h, ", ", o.kernel_w, ")]");
  kernels::Pool2dGeometry g;
  g.n = x.size(0), g.c = x.size(1), g.h = x.size(2), g.w = x.size(3);
  g.kernel_h = o.kernel_h, g.kernel_w = o.kernel_w, g.stride_h = o.stride_h, g.stride_w = o.stride_w;
  g.pad_h = o.pad_h, g.pad_w = o.pad_w;
  CUMULUS_CHECK(g.h + 2 * g.pad_h >= g.kernel_h && g.w + 2 * g.pad_w >= g.kernel_w, ShapeError, op, ": kernel ",
                g.kernel_h, "x", g.kernel_w, " is larger than the padded input ", x.shape().str());
  g.out_h = (g.h + 2 * g.pad_h - g.kernel_h) / g.stride_h + 1;
  g.out_w = (g.w + 2 * g.pad_w - g.kernel_w) / g.stride_w + 1;

  const Device device = x.device();
  Tensor y = detail::new_output(Shape{g.n, g.c, g.out_h, g.out_w}, x.dtype(), device);
  bool on_cudnn = false;
  CUMULUS_DISPATCH_FLOAT(x.dtype(), T,
      CUMULUS_DISPATCH(device, ctx, kernels::max_pool2d_forward_cpu(g, x.data<T>(), y.data<T>()),
                       CUMULUS_CUDNN_ONLY(on_cudnn = kernels::cudnn_runs_pooling(x.dtype());
                                          on_cudnn ? kernels::max_pool2d_forward_cuda(cudnn::handle(device.index()),
                                                                                      g, x.dtype(), x.raw_data(),
                                                                                      y.raw_data())
                                                   : kernels::max_pool2d_forward_cuda(g, x.data<T>(), y.data<T>(),
                                                                                      ctx.stream()))));
  if (should_record({&x}))
    attach_node(y, std::make_shared<MaxPool2dBackward>(x.detach(), on_cudnn ? y.detach() : Tensor(), g), {&x});
  return y;
}

Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
  MaxPool2dOptions o;
  o.kernel_h = o.kernel_w = kernel;
  o.stride_h = o.stride_w = stride == 0 ? kernel : stride;
  o.pad_h = o.pad_w = padding;
  return max_pool2d(x, o);
}

}  // namespace cumulus::ops
