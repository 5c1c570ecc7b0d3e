// CUDA launchers of the convolutional ops, through cuDNN (legacy v9 API): the same ops and
// contracts as kernels/cpu/conv_kernels.h (beta 0 never reads the destination), queued on the
// stream `handle` is bound to. What a launcher needs of the engine it is handed by its caller in
// engine/ops: the device's handle (cumulus::cudnn::handle), and for a convolution the algorithm
// cache and a source of workspace (CudnnConv). Pointers are device pointers. Only for builds with
// cuDNN (CUMULUS_WITH_CUDNN).
// `dtype` is the storage type of the activations and their gradients (x, y, dy, dx) and of a
// convolution's weight and weight gradient: f32, or bf16 / f16 for mixed precision (Note [Mixed
// precision] in engine/ops/linear.cpp), always with f32 compute. Biases, batch-norm parameters,
// statistics and their gradients are f32 in every case.
#pragma once

#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cumulus/tensor/dtype.h"
#include "kernels/cpu/conv_kernels.h"
#include "kernels/cuda/kernels.h"

namespace cumulus::kernels {

// Note [bf16 on cuDNN]
// cuDNN 9 marks its legacy batch-norm calls (cudnnBatchNormalizationForwardTraining,
// ...ForwardInference, ...Backward) and its pooling calls deprecated (CUDNN_DEPRECATED in
// cudnn_ops.h), and we found no bf16 configuration documented for them: the header sets the
// descriptor of the batch-norm parameters and statistics to double for double data and to float
// otherwise, written with float and half data in mind (half data with float parameters is the
// documented mixed-precision case, and the one PyTorch hands to cuDNN). The API reference,
// https://docs.nvidia.com/deeplearning/cudnn/latest/api/cudnn-ops-library.html, lists the calls
// under the deprecated legacy API. PyTorch keeps bf16 away from cuDNN's batch norm
// (_select_batch_norm_backend in aten/src/ATen/native/Normalization.cpp: a bf16 input or weight
// takes its own kernels, added in https://github.com/pytorch/pytorch/pull/44994) and pools with
// kernels of its own for every type. So bf16 batch norm (both modes) and bf16 max pooling run on
// kernels of our own (kernels/cuda/batch_norm.cu, kernels/cuda/pool.cu; declared in
// kernels/cuda/kernels.h). f16 batch norm takes ours too: on an H200 cuDNN's f16 training forward
// gave a constant channel's output (exactly its bias) 0.038 away from it, the rounding of a folded
// x * scale + shift (the op case batch_norm2d_training_constant_channel_2x2x3x3_f16; our kernels
// subtract the mean first). f32 batch norm and f32 and f16 pooling stay on cuDNN.
inline bool cudnn_runs_batch_norm(DType dtype) { return dtype == DType::f32; }
inline bool cudnn_runs_pooling(DType dtype) { return dtype != DType::bf16; }

// ---- conv2d (kernels/cuda/cudnn_conv.cu) ----
// f32: the math type cuDNN reports for the algorithm, FMA or default, never tensor-op math (TF32)
// unless the caller asks (CudnnConv::f32_tensor_ops; the engine does not): Note [cuDNN math types]
// in cudnn_conv.cu. bf16 and f16: tensor-core math with f32 accumulation (cuDNN's pseudo-16-bit
// configurations). The algorithm of each (shape, dtype, direction) is chosen once and kept in the
// caller's cache; its workspace comes from the caller for the call (Note [cuDNN algorithm cache]).

enum class ConvDirection : uint8_t { forward, backward_data, backward_filter };

// A chosen algorithm (a cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t value) and the workspace it
// needs.
struct ConvAlgorithm {
  int algo = 0;
  int math_type = 0;  // the cudnnMathType_t the heuristic gave with algo; the descriptor is set to it
  std::size_t workspace_bytes = 0;
};

// Whether an algorithm cuDNN ranked under `math` may run a convolution of `dtype` data: any for
// 16-bit data; for f32, FMA or default math, and tensor-op math only when asked (f32_tensor_ops).
inline bool conv_math_accepted(DType dtype, cudnnMathType_t math, bool f32_tensor_ops) {
  if (dtype != DType::f32 || f32_tensor_ops) return true;
  return math == CUDNN_FMA_MATH || math == CUDNN_DEFAULT_MATH;
}
// "CUDNN_FMA_MATH", ...: for reports.
const char* conv_math_name(int math_type);

// A convolution's identity for the cache: device, direction, storage type and every size (n, c,
// h, w, k, r, s, strides, paddings).
struct ConvKey {
  int device = 0;
  ConvDirection direction = ConvDirection::forward;
  DType dtype = DType::f32;
  std::array<int64_t, 11> sizes{};
  bool f32_tensor_ops = false;
  bool operator<(const ConvKey& o) const;
};

// The algorithms chosen so far, owned by the caller (the engine keeps one for the process:
// cudnn::conv_algorithms() in engine/core/cudnn_context.cpp). Thread-safe.
class ConvAlgorithms {
 public:
  // The choice for `key`; on a miss `choose` runs once (under the lock) and its answer is kept.
  ConvAlgorithm get(const ConvKey& key, const std::function<ConvAlgorithm()>& choose);
  std::size_t size() const;
  // One line per choice: direction, dtype, sizes, algorithm, math type and workspace (for tests and
  // reports: "forward f32 [n 2, c 3, h 9, w 9, k 5, r 3, s 3, stride 1x1, pad 1x1]: algo 1, CUDNN_FMA_MATH, 0 B").
  std::vector<std::string> report() const;

 private:
  mutable std::mutex mutex_;
  std::map<ConvKey, ConvAlgorithm> chosen_;
};

// Device memory of at least `bytes` on the convolution's device, usable on the handle's stream
// while the returned owner lives (`bytes` may be 0).
using WorkspaceSource = std::function<std::shared_ptr<void>(std::size_t bytes)>;

// What a cuDNN convolution takes of its caller.
struct CudnnConv {
  cudnnHandle_t handle;  // the device's, bound to its stream
  int device;            // the device index: part of the cache's key
  ConvAlgorithms& algorithms;
  WorkspaceSource workspace;
  // Algorithms that need at most this much workspace are preferred; more only when none fits.
  // The engine passes its libraries' fixed workspace (Note [cuDNN algorithm cache]); the same for
  // every call of a process, so not part of the cache's key.
  std::size_t preferred_max_workspace = 256u << 20;
  bool f32_tensor_ops = false;  // f32 may take tensor-op (TF32) algorithms; part of the cache's key
};

// y = conv(x, weight) (+ bias; bias may be null).
void conv2d_forward_cuda(const CudnnConv& conv, const Conv2dGeometry& g, DType dtype, const void* x, const void* weight,
                         const float* bias, void* y);
// dx = conv_transpose(dy, weight) + beta * dx
void conv2d_backward_data_cuda(const CudnnConv& conv, const Conv2dGeometry& g, DType dtype, const void* weight,
                               const void* dy, float beta, void* dx);
// dweight = dW(x, dy) + beta * dweight, in `dtype` (cuDNN writes the filter's type): accumulated
// inside cudnnConvolutionBackwardFilter.
void conv2d_backward_filter_cuda(const CudnnConv& conv, const Conv2dGeometry& g, DType dtype, const void* x,
                                 const void* dy, float beta, void* dweight);
// dbias[k] = sum over n, i, j of dy + beta * dbias[k], summed in f32
void conv2d_backward_bias_cuda(cudnnHandle_t handle, const Conv2dGeometry& g, DType dtype, const void* dy,
                               float beta, float* dbias);

// ---- batch_norm2d (kernels/cuda/cudnn_batch_norm.cu) ----
// x: [n, c, hw]; spatial mode (statistics per channel). The contracts of the CPU launchers. f32 and
// f16 (Note [bf16 on cuDNN]).

void batch_norm_forward_training_cuda(cudnnHandle_t handle, DType dtype, const void* x, const float* gamma,
                                      const float* beta, int64_t n, int64_t c, int64_t hw, float eps,
                                      float momentum, float* running_mean, float* running_var, void* y,
                                      float* save_mean, float* save_invstd);
void batch_norm_forward_inference_cuda(cudnnHandle_t handle, DType dtype, const void* x, const float* gamma,
                                       const float* beta, const float* running_mean, const float* running_var,
                                       int64_t n, int64_t c, int64_t hw, float eps, void* y, float* save_mean,
                                       float* save_invstd, cudaStream_t stream);
// Batch statistics, through cudnnBatchNormalizationBackward: dx always written (with beta_dx), the
// parameter gradients with one shared beta (cuDNN's betaParamDiff). The op hands scratch buffers
// for what it does not need.
void batch_norm_backward_training_cuda(cudnnHandle_t handle, DType dtype, const void* x, const void* dy,
                                       const float* gamma, const float* save_mean, const float* save_invstd,
                                       int64_t n, int64_t c, int64_t hw, float eps, float beta_dx, void* dx,
                                       float beta_params, float* dgamma, float* dbeta);
// Evaluation mode's backward, the num_batches_tracked counter and bf16 in both modes are kernels of our own:
// kernels/cuda/kernels.h.

// ---- max_pool2d (kernels/cuda/cudnn_pool.cu) ----
// CUDNN_POOLING_MAX_DETERMINISTIC, NaN propagated. cuDNN's backward reads x and y. f32 and f16; bf16
// pools with kernels of our own (Note [bf16 on cuDNN]).

void max_pool2d_forward_cuda(cudnnHandle_t handle, const Pool2dGeometry& g, DType dtype, const void* x, void* y);
void max_pool2d_backward_cuda(cudnnHandle_t handle, const Pool2dGeometry& g, DType dtype, const void* x,
                              const void* y, const void* dy, float beta, void* dx);

}  // namespace cumulus::kernels
