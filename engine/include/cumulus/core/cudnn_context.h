// cuDNN: one handle per device, bound to that device's stream (cuda_context.h), created lazily and
// alive until process exit; the check macro for cuDNN calls; the cache of convolution algorithm
// choices (one per shape and direction, see Note [cuDNN algorithm cache] in
// engine/core/cudnn_context.cpp).
//
// Safe to include in every build. Without cuDNN (CUMULUS_WITH_CUDNN unset: a CPU-only build, or a
// CUDA build where cuDNN was not found) only cudnn_compiled() and CUMULUS_CUDNN_ONLY exist, and the
// convolutional ops throw DeviceError on CUDA tensors.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cumulus/core/error.h"
#include "cumulus/tensor/dtype.h"

namespace cumulus {
// Whether this build has the cuDNN ops (conv2d, batch_norm2d, max_pool2d on CUDA).
bool cudnn_compiled();
}  // namespace cumulus

// CUMULUS_CUDNN_ONLY(stmt): stmt in builds with cuDNN; otherwise a DeviceError that says so. For
// the CUDA branch of CUMULUS_DISPATCH in the ops that need cuDNN.
#if CUMULUS_WITH_CUDNN
#define CUMULUS_CUDNN_ONLY(stmt) stmt
#else
#define CUMULUS_CUDNN_ONLY(stmt)                                                                   \
  throw ::cumulus::DeviceError(                                                                    \
      "this op needs cuDNN on CUDA tensors, and cumulus was built without it (cuDNN was not found " \
      "when configuring; install cuDNN and re-run cmake, or run the op on the CPU)")
#endif

#if CUMULUS_WITH_CUDNN
#include <cudnn.h>

#include <array>
#include <functional>

namespace cumulus::detail {
[[noreturn]] void throw_cudnn_error(cudnnStatus_t st, const char* expr, const char* file, int line);
void warn_cudnn_error(cudnnStatus_t st, const char* expr, const char* file, int line);
}  // namespace cumulus::detail

// Every cuDNN call goes through this: a failure throws CudaError carrying the expression, file and
// line. Calls that launch work are also counted (detail::count_launch) by the launchers.
#define CUMULUS_CUDNN_CHECK(expr)                                                      \
  do {                                                                                 \
    cudnnStatus_t cumulus_cudnn_st_ = (expr);                                          \
    if (cumulus_cudnn_st_ != CUDNN_STATUS_SUCCESS)                                     \
      ::cumulus::detail::throw_cudnn_error(cumulus_cudnn_st_, #expr, __FILE__, __LINE__); \
  } while (0)

// For destructors (descriptor holders): warn, never throw.
#define CUMULUS_CUDNN_WARN(expr)                                                       \
  do {                                                                                 \
    cudnnStatus_t cumulus_cudnn_st_ = (expr);                                          \
    if (cumulus_cudnn_st_ != CUDNN_STATUS_SUCCESS)                                     \
      ::cumulus::detail::warn_cudnn_error(cumulus_cudnn_st_, #expr, __FILE__, __LINE__); \
  } while (0)

namespace cumulus::cudnn {

// The device's handle, bound to cumulus::cuda::stream(device_index).
cudnnHandle_t handle(int device_index);

enum class ConvDirection : uint8_t { forward, backward_data, backward_filter };

// What the cache stores: the algorithm (a cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t value) and
// the workspace it needs.
struct ConvAlgorithm {
  int algo = 0;
  std::size_t workspace_bytes = 0;
};

// A convolution's identity for the cache: device, direction, storage type and every size (n, c,
// h, w, k, r, s, strides, paddings).
struct ConvKey {
  int device = 0;
  ConvDirection direction = ConvDirection::forward;
  DType dtype = DType::f32;
  std::array<int64_t, 11> sizes{};
  bool operator<(const ConvKey& o) const;
};

// The cached choice for `key`; on a miss `choose` runs once (under the cache's lock) and its
// answer is kept for the life of the process.
ConvAlgorithm cached_conv_algorithm(const ConvKey& key, const std::function<ConvAlgorithm()>& choose);
// Entries in the cache (for tests: a second call with the same shape adds none).
std::size_t conv_algorithm_cache_size();

// Move-only owners of cuDNN descriptors (created in the constructor, destroyed with a warning on
// failure, never a throw).
template <typename T, cudnnStatus_t (*Create)(T*), cudnnStatus_t (*Destroy)(T)>
class Descriptor {
 public:
  Descriptor() { CUMULUS_CUDNN_CHECK(Create(&desc_)); }
  ~Descriptor() {
    if (desc_ != nullptr) CUMULUS_CUDNN_WARN(Destroy(desc_));
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  Descriptor(Descriptor&& o) noexcept : desc_(o.desc_) { o.desc_ = nullptr; }
  Descriptor& operator=(Descriptor&&) = delete;
  T get() const { return desc_; }

 private:
  T desc_ = nullptr;
};

using TensorDescriptor = Descriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDescriptor = Descriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvolutionDescriptor =
    Descriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor, cudnnDestroyConvolutionDescriptor>;
using PoolingDescriptor = Descriptor<cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor, cudnnDestroyPoolingDescriptor>;

// cuDNN's legacy API takes int sizes: checked narrowing (InvalidArgument past 32 bits).
int checked_int(int64_t v, const char* what);
// A packed NCHW tensor descriptor of `dtype` (f32, bf16 or f16).
TensorDescriptor nchw_descriptor(int64_t n, int64_t c, int64_t h, int64_t w, DType dtype = DType::f32);
// cuDNN's data type for f32, bf16 and f16 (InvalidArgument for the others).
cudnnDataType_t data_type(DType dtype);

}  // namespace cumulus::cudnn
#endif  // CUMULUS_WITH_CUDNN
