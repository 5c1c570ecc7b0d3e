// conv2d on CUDA through cuDNN's legacy API: cudnnConvolutionForward (+ cudnnAddTensor for an f32
// bias), cudnnConvolutionBackwardData, cudnnConvolutionBackwardFilter, cudnnConvolutionBackwardBias.
// Backward needs x for the filter gradient and the weight for the data gradient (the op saves
// only what the needed gradients read). Every call blends with beta: the filter and bias gradients
// accumulate inside cuDNN (beta 1), or overwrite a stale buffer without reading it (beta 0;
// cuDNN never reads the output when beta is 0), exactly as Linear's GEMM does (Note [Gradient
// sinks]). Algorithms: chosen once per (device, direction, dtype, shape) and kept in the caller's
// cache; workspace from the caller for each call (Note [cuDNN algorithm cache]).
// f32 math: the FMA or default math cuDNN reports for the chosen algorithm, never tensor-op math
// unless asked (Note [cuDNN math types]).
// bf16 / f16 data (x, weight, y and their gradients) run cuDNN's pseudo-16-bit configurations:
// tensor-op math with f32 accumulation (the convolution's compute type is FLOAT). The bias and its
// gradient stay f32 and cudnnAddTensor / cudnnConvolutionBackwardBias want one type for bias and
// data, so for 16-bit data the bias add and the bias gradient are our kernels (f32 arithmetic).
#if CUMULUS_WITH_CUDNN
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cudnn_common.h"
#include "kernels/cuda/cudnn_kernels.h"
#include "kernels/cuda/kernels.h"
#include "kernels/float16.h"

namespace cumulus::kernels {

namespace {

struct ConvDescriptors {
  cudnn::TensorDescriptor x, y;
  cudnn::FilterDescriptor w;
  cudnn::ConvolutionDescriptor conv;
};

// x, y and the filter in `dtype`; the convolution computes in f32 whatever the storage (bf16 / f16:
// PSEUDO_BFLOAT16 / PSEUDO_HALF), on tensor cores for 16-bit data, never TF32 for f32.
ConvDescriptors describe(const Conv2dGeometry& g, DType dtype) {
  ConvDescriptors d{cudnn::nchw_descriptor(g.n, g.c, g.h, g.w, dtype),
                    cudnn::nchw_descriptor(g.n, g.k, g.out_h, g.out_w, dtype), cudnn::FilterDescriptor(),
                    cudnn::ConvolutionDescriptor()};
  CUMULUS_CUDNN_CHECK(cudnnSetFilter4dDescriptor(d.w.get(), cudnn::data_type(dtype), CUDNN_TENSOR_NCHW,
                                                 cudnn::checked_int(g.k, "out_channels"),
                                                 cudnn::checked_int(g.c, "in_channels"),
                                                 cudnn::checked_int(g.r, "kernel height"),
                                                 cudnn::checked_int(g.s, "kernel width")));
  CUMULUS_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
      d.conv.get(), cudnn::checked_int(g.pad_h, "pad"), cudnn::checked_int(g.pad_w, "pad"),
      cudnn::checked_int(g.stride_h, "stride"), cudnn::checked_int(g.stride_w, "stride"), 1, 1,
      CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  CUMULUS_CUDNN_CHECK(
      cudnnSetConvolutionMathType(d.conv.get(), dtype == DType::f32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
  int n = 0, k = 0, oh = 0, ow = 0;
  CUMULUS_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(d.conv.get(), d.x.get(), d.w.get(), &n, &k, &oh, &ow));
  CUMULUS_CHECK(n == g.n && k == g.k && oh == g.out_h && ow == g.out_w, CudaError,
                "conv2d: cuDNN computes an output of [", n, ", ", k, ", ", oh, ", ", ow, "], cumulus expected [",
                g.n, ", ", g.k, ", ", g.out_h, ", ", g.out_w, "]");
  return d;
}

ConvKey key_of(const CudnnConv& conv, ConvDirection direction, DType dtype, const Conv2dGeometry& g) {
  ConvKey key;
  key.device = conv.device;
  key.direction = direction;
  key.dtype = dtype;
  key.sizes = {g.n, g.c, g.h, g.w, g.k, g.r, g.s, g.stride_h, g.stride_w, g.pad_h, g.pad_w};
  key.f32_tensor_ops = conv.f32_tensor_ops;
  return key;
}

// Note [cuDNN math types]
// Each of cuDNN's ranked results names the math type it was ranked for, which need not be the one
// the descriptor was made with; the chosen one is set in the descriptor before its workspace is
// sized and before every call, so cuDNN runs what it ranked. For f32 data cuDNN 9 may report
// CUDNN_FMA_MATH or CUDNN_DEFAULT_MATH for an algorithm: both are taken (taking FMA alone would
// throw "no algorithm" wherever cuDNN reports only default math for f32). Tensor-op math
// (CUDNN_TENSOR_OP_MATH, ..._ALLOW_CONVERSION) is refused for f32 unless the caller asks
// (CudnnConv::f32_tensor_ops), the same promise as the GEMMs' (no TF32). Not measured here (no
// GPU): whether an f32 algorithm cuDNN ranks under default math, which does not forbid tensor-core
// operations, runs TF32 on a GPU that has it. The CNN's CUDA cases print each choice
// (ConvAlgorithms::report) and the op cases hold cuDNN's values to the CPU's.

// The heuristics' ranking, filtered: the first successful, deterministic algorithm within the
// preferred workspace; failing that the first successful one within it; failing that any; each of a
// math type conv_math_accepted takes.
template <typename Perf>
ConvAlgorithm pick_algorithm(const std::vector<Perf>& perf, int returned, DType dtype, const CudnnConv& conv,
                             const char* direction) {
  int refused_math = 0;
  for (int pass = 0; pass < 3; ++pass)
    for (int i = 0; i < returned; ++i) {
      const Perf& p = perf[static_cast<std::size_t>(i)];
      if (p.status != CUDNN_STATUS_SUCCESS) continue;
      if (!conv_math_accepted(dtype, p.mathType, conv.f32_tensor_ops)) {
        refused_math += pass == 0;
        continue;
      }
      if (pass == 0 && p.determinism != CUDNN_DETERMINISTIC) continue;
      if (pass < 2 && p.memory > conv.preferred_max_workspace) continue;
      ConvAlgorithm chosen;
      chosen.algo = static_cast<int>(p.algo);
      chosen.math_type = static_cast<int>(p.mathType);
      return chosen;
    }
  throw CudaError(detail::concat("conv2d: cuDNN offers no ", direction, " algorithm for this shape (", returned,
                                 " ranked, ", refused_math, " of them refused for tensor-op math on f32 data)"));
}

// The chosen algorithm's math type in the call's descriptor: before its workspace is sized and
// before every call that runs it.
void set_math_type(const ConvDescriptors& d, const ConvAlgorithm& a) {
  CUMULUS_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.get(), static_cast<cudnnMathType_t>(a.math_type)));
}

// Our kernels go on the stream the handle is bound to, after the cuDNN calls before them.
cudaStream_t stream_of(cudnnHandle_t handle) {
  cudaStream_t stream = nullptr;
  CUMULUS_CUDNN_CHECK(cudnnGetStream(handle, &stream));
  return stream;
}

// The 16-bit bias add and bias gradient are ours (kernels/cuda/conv.cu), on the handle's stream.
template <typename T>
void add_bias(cudaStream_t stream, const Conv2dGeometry& g, const float* bias, void* y) {
  conv2d_add_bias_cuda(bias, g.n, g.k, g.out_h * g.out_w, static_cast<T*>(y), stream);
}

template <typename T>
void bias_grad(cudaStream_t stream, const Conv2dGeometry& g, const void* dy, float beta, float* dbias) {
  conv2d_bias_grad_cuda(static_cast<const T*>(dy), g.n, g.k, g.out_h * g.out_w, beta, dbias, stream);
}

}  // namespace

// Note [cuDNN algorithm cache]
// Which algorithm a convolution uses (and so how much workspace it needs) is decided once per
// (device, direction, dtype, shape) and kept in the caller's ConvAlgorithms (the engine keeps one
// for the process, cudnn::conv_algorithms()): training repeats the same few shapes every
// micro-batch, so choosing again would be wasted host time. The choice is made by cuDNN's
// heuristics (cudnnGet*Algorithm_v7) rather than by timing runs (cudnnFind*): timing would run the
// backward-filter candidates into some buffer (the persistent gradient buffer is the only one at
// hand, and it must not be overwritten mid-accumulation), allocate every candidate's workspace, and
// make the choice depend on machine noise. Each call asks its caller for the workspace
// (CudnnConv::workspace) and gives it back once the call is queued (stream-ordered reuse on the
// device's one stream). The engine prefers algorithms that fit in its libraries' fixed workspace
// (CudnnConv::preferred_max_workspace: the 8 MiB block cuBLAS and cuBLASLt use, in category
// workspace) and hands out that block: a convolution then allocates nothing per call, so what a
// micro-batch allocates does not depend on which algorithm the heuristics pick for its size, and
// the planner's prediction from a few probed sizes holds at every size (Note [Memory prediction]; on
// an H200 the per-call workspaces put the CNN's predicted peaks up to 70% off, the fixed block made
// them exact from 1 to 4096 samples). An algorithm that needs more, taken only when none fits, gets
// its own block from the caching allocator.

bool ConvKey::operator<(const ConvKey& o) const {
  if (device != o.device) return device < o.device;
  if (direction != o.direction) return direction < o.direction;
  if (dtype != o.dtype) return dtype < o.dtype;
  if (f32_tensor_ops != o.f32_tensor_ops) return f32_tensor_ops < o.f32_tensor_ops;
  return sizes < o.sizes;
}

const char* conv_math_name(int math_type) {
  switch (static_cast<cudnnMathType_t>(math_type)) {
    case CUDNN_DEFAULT_MATH: return "CUDNN_DEFAULT_MATH";
    case CUDNN_TENSOR_OP_MATH: return "CUDNN_TENSOR_OP_MATH";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: return "CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION";
    case CUDNN_FMA_MATH: return "CUDNN_FMA_MATH";
  }
  return "an unknown math type";
}

std::vector<std::string> ConvAlgorithms::report() const {
  static const char* const directions[] = {"forward", "backward-data", "backward-filter"};
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> lines;
  for (const auto& [key, a] : chosen_) {
    const auto& z = key.sizes;
    lines.push_back(detail::concat(
        directions[static_cast<int>(key.direction)], " ", dtype_name(key.dtype), " [n ", z[0], ", c ", z[1], ", h ",
        z[2], ", w ", z[3], ", k ", z[4], ", r ", z[5], ", s ", z[6], ", stride ", z[7], "x", z[8], ", pad ", z[9],
        "x", z[10], "]: algo ", a.algo, ", ", conv_math_name(a.math_type), ", ", a.workspace_bytes, " B"));
  }
  return lines;
}

ConvAlgorithm ConvAlgorithms::get(const ConvKey& key, const std::function<ConvAlgorithm()>& choose) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = chosen_.find(key);
  if (it != chosen_.end()) return it->second;
  const ConvAlgorithm chosen = choose();
  chosen_.emplace(key, chosen);
  return chosen;
}

std::size_t ConvAlgorithms::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return chosen_.size();
}

void conv2d_forward_cuda(const CudnnConv& conv, const Conv2dGeometry& g, DType dtype, const void* x, const void* weight,
                         const float* bias, void* y) {
  const cudnnHandle_t handle = conv.handle;
  const ConvDescriptors d = describe(g, dtype);
  const ConvAlgorithm a =
      conv.algorithms.get(key_of(conv, ConvDirection::forward, dtype, g), [&] {
        int max_count = 0, returned = 0;
        CUMULUS_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(handle, &max_count));
        std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<std::size_t>(max_count));
        CUMULUS_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(handle, d.x.get(), d.w.get(), d.conv.get(),
                                                                   d.y.get(), max_count, &returned, perf.data()));
        ConvAlgorithm c = pick_algorithm(perf, returned, dtype, conv, "forward");
        set_math_type(d, c);
        CUMULUS_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(
            handle, d.x.get(), d.w.get(), d.conv.get(), d.y.get(), static_cast<cudnnConvolutionFwdAlgo_t>(c.algo),
            &c.workspace_bytes));
        return c;
      });
  set_math_type(d, a);
  const std::shared_ptr<void> workspace =
      conv.workspace(a.workspace_bytes);  // back to the caller once the call is queued
  const float one = 1.0f, zero = 0.0f;
  detail::count_launch();
  CUMULUS_CUDNN_CHECK(cudnnConvolutionForward(handle, &one, d.x.get(), x, d.w.get(), weight, d.conv.get(),
                                              static_cast<cudnnConvolutionFwdAlgo_t>(a.algo), workspace.get(),
                                              a.workspace_bytes, &zero, d.y.get(), y));
  if (bias == nullptr) return;
  if (dtype == DType::f32) {
    const cudnn::TensorDescriptor b = cudnn::nchw_descriptor(1, g.k, 1, 1);
    detail::count_launch();
    CUMULUS_CUDNN_CHECK(cudnnAddTensor(handle, &one, b.get(), bias, &one, d.y.get(), y));
  } else if (dtype == DType::bf16) {
    add_bias<BFloat16>(stream_of(handle), g, bias, y);
  } else {  // f16: describe() took no other type
    add_bias<Half>(stream_of(handle), g, bias, y);
  }
}

void conv2d_backward_data_cuda(const CudnnConv& conv, const Conv2dGeometry& g, DType dtype, const void* weight,
                               const void* dy, float beta, void* dx) {
  const cudnnHandle_t handle = conv.handle;
  const ConvDescriptors d = describe(g, dtype);
  const ConvAlgorithm a =
      conv.algorithms.get(key_of(conv, ConvDirection::backward_data, dtype, g), [&] {
        int max_count = 0, returned = 0;
        CUMULUS_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(handle, &max_count));
        std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(static_cast<std::size_t>(max_count));
        CUMULUS_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
            handle, d.w.get(), d.y.get(), d.conv.get(), d.x.get(), max_count, &returned, perf.data()));
        ConvAlgorithm c = pick_algorithm(perf, returned, dtype, conv, "backward-data");
        set_math_type(d, c);
        CUMULUS_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(
            handle, d.w.get(), d.y.get(), d.conv.get(), d.x.get(), static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo),
            &c.workspace_bytes));
        return c;
      });
  set_math_type(d, a);
  const std::shared_ptr<void> workspace =
      conv.workspace(a.workspace_bytes);  // back to the caller once the call is queued
  const float one = 1.0f;
  detail::count_launch();
  CUMULUS_CUDNN_CHECK(cudnnConvolutionBackwardData(handle, &one, d.w.get(), weight, d.y.get(), dy, d.conv.get(),
                                                   static_cast<cudnnConvolutionBwdDataAlgo_t>(a.algo),
                                                   workspace.get(), a.workspace_bytes, &beta, d.x.get(), dx));
}

void conv2d_backward_filter_cuda(const CudnnConv& conv, const Conv2dGeometry& g, DType dtype, const void* x,
                                 const void* dy, float beta, void* dweight) {
  const cudnnHandle_t handle = conv.handle;
  const ConvDescriptors d = describe(g, dtype);
  const ConvAlgorithm a =
      conv.algorithms.get(key_of(conv, ConvDirection::backward_filter, dtype, g), [&] {
        int max_count = 0, returned = 0;
        CUMULUS_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(handle, &max_count));
        std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(static_cast<std::size_t>(max_count));
        CUMULUS_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
            handle, d.x.get(), d.y.get(), d.conv.get(), d.w.get(), max_count, &returned, perf.data()));
        ConvAlgorithm c = pick_algorithm(perf, returned, dtype, conv, "backward-filter");
        set_math_type(d, c);
        CUMULUS_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
            handle, d.x.get(), d.y.get(), d.conv.get(), d.w.get(),
            static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo), &c.workspace_bytes));
        return c;
      });
  set_math_type(d, a);
  const std::shared_ptr<void> workspace =
      conv.workspace(a.workspace_bytes);  // back to the caller once the call is queued
  const float one = 1.0f;
  detail::count_launch();
  // beta = 1: the weight gradient accumulates inside cuDNN, into the buffer (in the filter's type).
  CUMULUS_CUDNN_CHECK(cudnnConvolutionBackwardFilter(handle, &one, d.x.get(), x, d.y.get(), dy, d.conv.get(),
                                                     static_cast<cudnnConvolutionBwdFilterAlgo_t>(a.algo),
                                                     workspace.get(), a.workspace_bytes, &beta, d.w.get(), dweight));
}

void conv2d_backward_bias_cuda(cudnnHandle_t handle, const Conv2dGeometry& g, DType dtype, const void* dy,
                               float beta, float* dbias) {
  switch (dtype) {
    case DType::f32: {
      const cudnn::TensorDescriptor dyd = cudnn::nchw_descriptor(g.n, g.k, g.out_h, g.out_w);
      const cudnn::TensorDescriptor bd = cudnn::nchw_descriptor(1, g.k, 1, 1);
      const float one = 1.0f;
      detail::count_launch();
      CUMULUS_CUDNN_CHECK(cudnnConvolutionBackwardBias(handle, &one, dyd.get(), dy, &beta, bd.get(), dbias));
      return;
    }
    case DType::bf16: return bias_grad<BFloat16>(stream_of(handle), g, dy, beta, dbias);
    case DType::f16: return bias_grad<Half>(stream_of(handle), g, dy, beta, dbias);
    default: break;
  }
  throw InvalidArgument(detail::concat("conv2d: no bias gradient for dtype ", dtype_name(dtype)));
}

}  // namespace cumulus::kernels
#endif  // CUMULUS_WITH_CUDNN
