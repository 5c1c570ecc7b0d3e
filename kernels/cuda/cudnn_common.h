// What the cuDNN launchers (kernels/cuda/cudnn_*.cu) share: the check macros, owners of cuDNN's
// descriptors, checked narrowing to cuDNN's int sizes, packed NCHW descriptors and cuDNN's data
// types. Everything else a launcher needs (the handle, the algorithm cache, workspace) its caller
// in engine/ops hands it (cudnn_kernels.h). Only for builds with cuDNN (CUMULUS_WITH_CUDNN).
#pragma once

#include <cudnn.h>

#include <cstdint>

#include "cumulus/core/error.h"
#include "cumulus/tensor/dtype.h"

namespace cumulus::detail {
[[noreturn]] void throw_cudnn_error(cudnnStatus_t st, const char* expr, const char* file, int line);
void warn_cudnn_error(cudnnStatus_t st, const char* expr, const char* file, int line);
}  // namespace cumulus::detail

// Every cuDNN call goes through this: a failure throws CudaError carrying the expression, file and
// line. Calls that launch work are also counted (detail::count_launch) by the launchers.
#define CUMULUS_CUDNN_CHECK(expr)                                                         \
  do {                                                                                    \
    cudnnStatus_t cumulus_cudnn_st_ = (expr);                                             \
    if (cumulus_cudnn_st_ != CUDNN_STATUS_SUCCESS)                                        \
      ::cumulus::detail::throw_cudnn_error(cumulus_cudnn_st_, #expr, __FILE__, __LINE__); \
  } while (0)

// For destructors (descriptor holders): warn, never throw.
#define CUMULUS_CUDNN_WARN(expr)                                                         \
  do {                                                                                   \
    cudnnStatus_t cumulus_cudnn_st_ = (expr);                                            \
    if (cumulus_cudnn_st_ != CUDNN_STATUS_SUCCESS)                                       \
      ::cumulus::detail::warn_cudnn_error(cumulus_cudnn_st_, #expr, __FILE__, __LINE__); \
  } while (0)

namespace cumulus::kernels::cudnn {

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
using PoolingDescriptor =
    Descriptor<cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor, cudnnDestroyPoolingDescriptor>;

// cuDNN's legacy API takes int sizes: checked narrowing (InvalidArgument past 32 bits).
int checked_int(int64_t v, const char* what);
// A packed NCHW tensor descriptor of `dtype` (f32, bf16 or f16).
TensorDescriptor nchw_descriptor(int64_t n, int64_t c, int64_t h, int64_t w, DType dtype = DType::f32);
// cuDNN's data type for f32, bf16 and f16 (InvalidArgument for the others).
cudnnDataType_t data_type(DType dtype);

}  // namespace cumulus::kernels::cudnn
