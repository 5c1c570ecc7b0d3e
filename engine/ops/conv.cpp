// conv2d: y = cross_correlation(x, W) + b.  x: [N, C, H, W], W: [K, C, R, S], b: [K]
//   -> y: [N, K, OH, OW].  CPU: im2col + one GEMM per chunk of samples (kernels/cpu/conv.cpp);
// CUDA: cuDNN.
// Backward, each part only when its input needs a gradient:
//   dx (+)= conv_transpose(dy, W)   needs W  (saved only if x needs a gradient)
//   dW (+)= dW(x, dy)               needs x  (saved only if W needs a gradient)
//   db (+)= sum over N, OH, OW of dy
// dW and db go straight into the sinks' buffers with the sinks' beta: for parameters that is the
// persistent gradient buffer, so accumulation happens inside the GEMM (CPU: the sink's beta for
// the first chunk's GEMM, 1 for the others) or inside cudnnConvolutionBackwardFilter (its beta),
// exactly as linear does (Note [Gradient sinks]). The CPU scratch (the columns of a chunk of
// samples) comes from the allocator in category workspace and lives for one call.
// A bf16 or f16 x computes as Linear does (Note [Mixed precision] in engine/ops/linear.cpp): y, dx
// in x's type, a 16-bit copy of W (parameter_copies), f32 bias and f32 accumulation. cuDNN writes
// the weight gradient in the filter's type, so on CUDA a 16-bit dW is made per micro-batch and
// added into the f32 buffer (accumulation across micro-batches stays f32); on the CPU it goes
// straight into the buffer.
#include "cumulus/autograd/node.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/ops/convolution.h"
#include "cumulus/ops/shape.h"
#include "engine/core/cudnn_context.h"
#include "engine/ops/internal.h"
#include "kernels/cpu/conv_kernels.h"
#if CUMULUS_WITH_CUDNN
#include "engine/core/cuda_context.h"
#include "kernels/cuda/cudnn_kernels.h"
#endif

namespace cumulus::ops {

namespace {

#if CUMULUS_WITH_CUDNN
// What the cuDNN launchers take of the engine: the device's handle, the process's algorithm cache
// and workspace: the libraries' fixed block where it is enough, else a block from the caching
// allocator in category workspace, given back when the launcher drops it (Note [cuDNN algorithm
// cache] in kernels/cuda/cudnn_conv.cu).
kernels::CudnnConv cudnn_conv(const Device& device) {
  cuda::Context& ctx = cuda::context(device.index());
  auto workspace = [device, &ctx](std::size_t bytes) -> std::shared_ptr<void> {
    if (bytes <= cuda::Context::kWorkspaceBytes) return std::shared_ptr<void>(ctx.workspace(), [](void*) {});
    auto block = std::make_shared<Allocation>(allocator_for(device).allocate(bytes, MemoryCategory::workspace));
    return std::shared_ptr<void>(block, block->get());
  };
  return kernels::CudnnConv{cudnn::handle(device.index()), device.index(), cudnn::conv_algorithms(), workspace,
                            cuda::Context::kWorkspaceBytes};
}
#endif

// The CPU launchers' scratch, category workspace (freed when the call returns).
Tensor cpu_workspace(const kernels::Conv2dGeometry& g) {
  const int64_t floats = kernels::conv2d_workspace_floats_cpu(g);
  MemoryCategoryScope scope(MemoryCategory::workspace);
  return Tensor::empty(Shape{floats}, DType::f32, Device::cpu());
}

float* data_or_null(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }

class Conv2dBackward final : public Node {
 public:
  // w: the weight, or for a 16-bit x its 16-bit copy.
  Conv2dBackward(Tensor x, Tensor w, bool has_bias, const kernels::Conv2dGeometry& g)
      : Node("conv2d"), x_(std::move(x)), w_(std::move(w)), has_bias_(has_bias), g_(g) {}

  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    if (dy.dtype() != DType::f32) return backward_16(dy, grads);
    const Device device = dy.device();
    const kernels::Conv2dGeometry& g = g_;
    const float* dyp = dy.data<float>();
    if (grads[0].needed()) {
      GradSink::Target dx = grads[0].begin(Shape{g.n, g.c, g.h, g.w}, device);
      const float* wp = w_.data<float>();
      float* dxp = dx.tensor.data<float>();
      CUMULUS_DISPATCH(
          device, ctx,
          {
            const Tensor ws = cpu_workspace(g);
            kernels::conv2d_backward_data_cpu(g, wp, dyp, dx.beta(), dxp, data_or_null(ws));
          },
          CUMULUS_CUDNN_ONLY(
              kernels::conv2d_backward_data_cuda(cudnn_conv(device), g, DType::f32, wp, dyp, dx.beta(), dxp)));
    }
    if (grads[1].needed()) {
      GradSink::Target dw = grads[1].begin(Shape{g.k, g.c, g.r, g.s}, device);
      const float* xp = x_.data<float>();
      float* dwp = dw.tensor.data<float>();
      CUMULUS_DISPATCH(
          device, ctx,
          {
            const Tensor ws = cpu_workspace(g);
            kernels::conv2d_backward_filter_cpu(g, xp, dyp, dw.beta(), dwp, data_or_null(ws));
          },
          CUMULUS_CUDNN_ONLY(
              kernels::conv2d_backward_filter_cuda(cudnn_conv(device), g, DType::f32, xp, dyp, dw.beta(), dwp)));
    }
    if (has_bias_ && grads[2].needed()) {
      GradSink::Target db = grads[2].begin(Shape{g.k}, device);
      float* dbp = db.tensor.data<float>();
      CUMULUS_DISPATCH(device, ctx, kernels::conv2d_backward_bias_cpu(g, dyp, db.beta(), dbp),
                       CUMULUS_CUDNN_ONLY(kernels::conv2d_backward_bias_cuda(cudnn::handle(device.index()), g,
                                                                             DType::f32, dyp, db.beta(), dbp)));
    }
  }

  void release_saved() override {
    x_ = Tensor();
    w_ = Tensor();
  }

 private:
  // dy, x and w_ in one 16-bit type; the parameter gradients f32.
  void backward_16(const Tensor& dy, std::vector<GradSink>& grads) {
    const Device device = dy.device();
    const DType type = dy.dtype();
    const kernels::Conv2dGeometry& g = g_;
    if (device.is_cpu()) {
      const Tensor dyf = detail::converted(dy, DType::f32, MemoryCategory::workspace);
      const Tensor ws = cpu_workspace(g);
      if (grads[0].needed()) {
        GradSink::Target dx = grads[0].begin(Shape{g.n, g.c, g.h, g.w}, device, type);
        const Tensor dxf = detail::f32_stand_in(dx.tensor, dx.beta());
        const Tensor wf = detail::converted(w_, DType::f32, MemoryCategory::workspace);
        kernels::conv2d_backward_data_cpu(g, wf.data<float>(), dyf.data<float>(), dx.beta(), dxf.data<float>(),
                                          data_or_null(ws));
        detail::store_stand_in(dxf, dx.tensor);
      }
      if (grads[1].needed()) {
        GradSink::Target dw = grads[1].begin(Shape{g.k, g.c, g.r, g.s}, device);
        const Tensor xf = detail::converted(x_, DType::f32, MemoryCategory::workspace);
        kernels::conv2d_backward_filter_cpu(g, xf.data<float>(), dyf.data<float>(), dw.beta(), dw.tensor.data<float>(),
                                            data_or_null(ws));
      }
      if (has_bias_ && grads[2].needed()) {
        GradSink::Target db = grads[2].begin(Shape{g.k}, device);
        kernels::conv2d_backward_bias_cpu(g, dyf.data<float>(), db.beta(), db.tensor.data<float>());
      }
      return;
    }
#if CUMULUS_WITH_CUDNN
    const kernels::CudnnConv conv = cudnn_conv(device);
    if (grads[0].needed()) {
      GradSink::Target dx = grads[0].begin(Shape{g.n, g.c, g.h, g.w}, device, type);
      kernels::conv2d_backward_data_cuda(conv, g, type, w_.raw_data(), dy.raw_data(), dx.beta(), dx.tensor.raw_data());
    }
    if (grads[1].needed()) {
      GradSink::Target dw = grads[1].begin(Shape{g.k, g.c, g.r, g.s}, device);
      const Tensor dw16 = Tensor::empty(dw.tensor.shape(), type, device);
      kernels::conv2d_backward_filter_cuda(conv, g, type, x_.raw_data(), dy.raw_data(), 0.0f, dw16.raw_data());
      detail::accumulate_into(dw.tensor, dw16.to(DType::f32), dw.beta());
    }
    if (has_bias_ && grads[2].needed()) {
      GradSink::Target db = grads[2].begin(Shape{g.k}, device);
      kernels::conv2d_backward_bias_cuda(conv.handle, g, type, dy.raw_data(), db.beta(), db.tensor.data<float>());
    }
#endif
  }

  Tensor x_, w_;
  bool has_bias_;
  kernels::Conv2dGeometry g_;
};

// conv2d with a 16-bit x (Note [Mixed precision] in engine/ops/linear.cpp), arguments checked.
Tensor conv2d_16(const Tensor& x, const Tensor& weight, const Tensor& bias, const kernels::Conv2dGeometry& g,
                 bool record) {
  const Device device = x.device();
  const Tensor w16 = detail::converted(weight, x.dtype(), MemoryCategory::parameter_copies);
  Tensor y = detail::new_output(Shape{g.n, g.k, g.out_h, g.out_w}, x.dtype(), device);
  const float* bp = bias.defined() ? bias.data<float>() : nullptr;
  if (device.is_cpu()) {
    const Tensor xf = detail::converted(x, DType::f32, MemoryCategory::workspace);
    const Tensor wf = detail::converted(w16, DType::f32, MemoryCategory::workspace);
    const Tensor yf = detail::f32_scratch(y.shape(), device);
    const Tensor ws = cpu_workspace(g);
    kernels::conv2d_forward_cpu(g, xf.data<float>(), wf.data<float>(), bp, yf.data<float>(), data_or_null(ws));
    detail::convert_into(yf, y);
  } else {
    CUMULUS_DISPATCH(device, ctx, (void)bp,
                     CUMULUS_CUDNN_ONLY(kernels::conv2d_forward_cuda(cudnn_conv(device), g, x.dtype(), x.raw_data(),
                                                                     w16.raw_data(), bp, y.raw_data())));
  }
  if (record) {
    auto node = std::make_shared<Conv2dBackward>(weight.requires_grad() ? x.detach() : Tensor(),
                                                 x.requires_grad() ? w16 : Tensor(), bias.defined(), g);
    attach_node(y, std::move(node), {&x, &weight, &bias});
  }
  return y;
}

// The input's, weight's and bias's checks, each failure naming the argument; the geometry they give.
kernels::Conv2dGeometry checked_geometry(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                         const Conv2dOptions& options) {
  constexpr const char* op = "conv2d";
  detail::check_floating(op, "input", x);
  detail::check_dtype(op, "weight", weight, DType::f32);
  CUMULUS_CHECK(x.ndim() == 4, ShapeError, op, ": input must be [batch, channels, height, width], got ",
                x.shape().str());
  CUMULUS_CHECK(weight.ndim() == 4, ShapeError, op,
                ": weight must be [out_channels, in_channels, kernel_h, kernel_w], got ", weight.shape().str());
  CUMULUS_CHECK(x.size(1) == weight.size(1), ShapeError, op, ": input has ", x.size(1), " channels but the weight ",
                weight.shape().str(), " expects ", weight.size(1));
  CUMULUS_CHECK(x.size(0) > 0, ShapeError, op, ": empty batch ", x.shape().str());
  CUMULUS_CHECK(weight.size(0) > 0 && weight.size(1) > 0 && weight.size(2) > 0 && weight.size(3) > 0, ShapeError, op,
                ": empty weight ", weight.shape().str());
  CUMULUS_CHECK(options.stride_h > 0 && options.stride_w > 0, InvalidArgument, op, ": stride (", options.stride_h, ", ",
                options.stride_w, ") must be positive");
  CUMULUS_CHECK(options.pad_h >= 0 && options.pad_w >= 0, InvalidArgument, op, ": padding (", options.pad_h, ", ",
                options.pad_w, ") must not be negative");
  detail::check_same_device(op, "weight", weight, x);
  if (bias.defined()) {
    detail::check_dtype(op, "bias", bias, DType::f32);
    CUMULUS_CHECK(bias.ndim() == 1 && bias.size(0) == weight.size(0), ShapeError, op, ": bias ", bias.shape().str(),
                  " does not match ", weight.size(0), " output channels");
    detail::check_same_device(op, "bias", bias, x);
  }

  kernels::Conv2dGeometry g;
  g.n = x.size(0), g.c = x.size(1), g.h = x.size(2), g.w = x.size(3);
  g.k = weight.size(0), g.r = weight.size(2), g.s = weight.size(3);
  g.stride_h = options.stride_h, g.stride_w = options.stride_w, g.pad_h = options.pad_h, g.pad_w = options.pad_w;
  CUMULUS_CHECK(g.h + 2 * g.pad_h >= g.r && g.w + 2 * g.pad_w >= g.s, ShapeError, op, ": kernel ", g.r, "x", g.s,
                " is larger than the padded input ", g.h + 2 * g.pad_h, "x", g.w + 2 * g.pad_w);
  g.out_h = (g.h + 2 * g.pad_h - g.r) / g.stride_h + 1;
  g.out_w = (g.w + 2 * g.pad_w - g.s) / g.stride_w + 1;
  return g;
}

}  // namespace

Tensor conv2d(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, const Conv2dOptions& options) {
  constexpr const char* op = "conv2d";
  OpScope op_scope(op);
  const Tensor x = detail::contiguous(x_in);
  const Tensor weight = detail::contiguous(weight_in);
  const Tensor bias = detail::contiguous(bias_in);
  const kernels::Conv2dGeometry g = checked_geometry(x, weight, bias, options);
  const bool has_bias = bias.defined();

  const Device device = x.device();
  const bool record = should_record({&x, &weight, &bias});
  if (x.dtype() != DType::f32) return conv2d_16(x, weight, bias, g, record);
  Tensor y = detail::new_output(Shape{g.n, g.k, g.out_h, g.out_w}, DType::f32, device);
  const float* xp = x.data<float>();
  const float* wp = weight.data<float>();
  const float* bp = has_bias ? bias.data<float>() : nullptr;
  float* yp = y.data<float>();
  CUMULUS_DISPATCH(
      device, ctx,
      {
        const Tensor ws = cpu_workspace(g);
        kernels::conv2d_forward_cpu(g, xp, wp, bp, yp, data_or_null(ws));
      },
      CUMULUS_CUDNN_ONLY(kernels::conv2d_forward_cuda(cudnn_conv(device), g, DType::f32, xp, wp, bp, yp)));

  if (record) {
    // Save only what the needed gradients read (detached: the saved handles hold no graph).
    auto node = std::make_shared<Conv2dBackward>(weight.requires_grad() ? x.detach() : Tensor(),
                                                 x.requires_grad() ? weight.detach() : Tensor(), has_bias, g);
    attach_node(y, std::move(node), {&x, &weight, &bias});
  }
  return y;
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride, int64_t padding) {
  Conv2dOptions o;
  o.stride_h = o.stride_w = stride;
  o.pad_h = o.pad_w = padding;
  return conv2d(x, weight, bias, o);
}

}  // namespace cumulus::ops
