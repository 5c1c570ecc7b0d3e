// max_pool2d on CUDA through cuDNN: cudnnPoolingForward / cudnnPoolingBackward with
// CUDNN_POOLING_MAX_DETERMINISTIC and NaN propagation (as PyTorch). cuDNN's backward finds each
// window's maximum again from x and y, so the op saves both (in the CNN both are alive anyway: the
// ReLU before the pool saves x, the next layer saves y). dx is blended with beta (Note [Gradient
// sinks]). x, y, dy and dx are all in `dtype` (f32 or f16; the scaling factors stay float). bf16 pools
// with kernels of our own (kernels/cuda/pool.cu; Note [bf16 on cuDNN] in kernels/cuda/cudnn_kernels.h).
#if CUMULUS_WITH_CUDNN
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cudnn_common.h"
#include "kernels/cuda/cudnn_kernels.h"

namespace cumulus::kernels {

namespace {

struct PoolDescriptors {
  cudnn::TensorDescriptor x, y;
  cudnn::PoolingDescriptor pool;
};

PoolDescriptors describe(const Pool2dGeometry& g, DType dtype) {
  CUMULUS_CHECK(cudnn_runs_pooling(dtype), InvalidArgument, "max_pool2d: cuDNN's pooling is not documented for ",
                dtype_name(dtype), " (Note [bf16 on cuDNN]); use the kernels of our own");
  PoolDescriptors d{cudnn::nchw_descriptor(g.n, g.c, g.h, g.w, dtype),
                    cudnn::nchw_descriptor(g.n, g.c, g.out_h, g.out_w, dtype), cudnn::PoolingDescriptor()};
  CUMULUS_CUDNN_CHECK(cudnnSetPooling2dDescriptor(
      d.pool.get(), CUDNN_POOLING_MAX_DETERMINISTIC, CUDNN_PROPAGATE_NAN, cudnn::checked_int(g.kernel_h, "kernel"),
      cudnn::checked_int(g.kernel_w, "kernel"), cudnn::checked_int(g.pad_h, "pad"), cudnn::checked_int(g.pad_w, "pad"),
      cudnn::checked_int(g.stride_h, "stride"), cudnn::checked_int(g.stride_w, "stride")));
  int n = 0, c = 0, oh = 0, ow = 0;
  CUMULUS_CUDNN_CHECK(cudnnGetPooling2dForwardOutputDim(d.pool.get(), d.x.get(), &n, &c, &oh, &ow));
  CUMULUS_CHECK(n == g.n && c == g.c && oh == g.out_h && ow == g.out_w, CudaError,
                "max_pool2d: cuDNN computes an output of [", n, ", ", c, ", ", oh, ", ", ow, "], cumulus expected [",
                g.n, ", ", g.c, ", ", g.out_h, ", ", g.out_w, "]");
  return d;
}

}  // namespace

void max_pool2d_forward_cuda(cudnnHandle_t handle, const Pool2dGeometry& g, DType dtype, const void* x, void* y) {
  const PoolDescriptors d = describe(g, dtype);
  const float one = 1.0f, zero = 0.0f;
  detail::count_launch();
  CUMULUS_CUDNN_CHECK(cudnnPoolingForward(handle, d.pool.get(), &one, d.x.get(), x, &zero, d.y.get(), y));
}

void max_pool2d_backward_cuda(cudnnHandle_t handle, const Pool2dGeometry& g, DType dtype, const void* x,
                              const void* y, const void* dy, float beta, void* dx) {
  const PoolDescriptors d = describe(g, dtype);
  const float one = 1.0f;
  detail::count_launch();
  CUMULUS_CUDNN_CHECK(cudnnPoolingBackward(handle, d.pool.get(), &one, d.y.get(), y, d.y.get(), dy, d.x.get(), x,
                                           &beta, d.x.get(), dx));
}

}  // namespace cumulus::kernels
#endif  // CUMULUS_WITH_CUDNN
