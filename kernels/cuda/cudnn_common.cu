// The cuDNN launchers' shared helpers (cudnn_common.h).
#if CUMULUS_WITH_CUDNN
#include "kernels/cuda/cudnn_common.h"

#include <climits>
#include <cstdio>
#include <string>

namespace cumulus {

namespace detail {
void throw_cudnn_error(cudnnStatus_t st, const char* expr, const char* file, int line) {
  throw CudaError(concat("cuDNN error ", cudnnGetErrorString(st), " (status ", static_cast<int>(st), ") from ", expr,
                         " at ", file, ":", line));
}
void warn_cudnn_error(cudnnStatus_t st, const char* expr, const char* file, int line) {
  std::fprintf(stderr, "cumulus: warning: cuDNN error %s from %s at %s:%d\n", cudnnGetErrorString(st), expr, file,
               line);
}
}  // namespace detail

namespace kernels::cudnn {

int checked_int(int64_t v, const char* what) {
  CUMULUS_CHECK(v >= 0 && v <= INT_MAX, InvalidArgument, "cuDNN: ", what, " = ", v,
                " does not fit the 32-bit sizes of cuDNN's API");
  return static_cast<int>(v);
}

cudnnDataType_t data_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    case DType::f16: return CUDNN_DATA_HALF;
    default: break;
  }
  throw InvalidArgument(std::string("cuDNN: no floating data type for ") + dtype_name(dtype));
}

TensorDescriptor nchw_descriptor(int64_t n, int64_t c, int64_t h, int64_t w, DType dtype) {
  TensorDescriptor d;
  CUMULUS_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d.get(), CUDNN_TENSOR_NCHW, data_type(dtype), checked_int(n, "batch"),
                                                 checked_int(c, "channels"), checked_int(h, "height"),
                                                 checked_int(w, "width")));
  return d;
}

}  // namespace kernels::cudnn
}  // namespace cumulus
#endif  // CUMULUS_WITH_CUDNN
