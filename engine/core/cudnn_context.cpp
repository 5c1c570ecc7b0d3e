// Per-device cuDNN state (see cudnn_context.h).
//
// Note [cuDNN algorithm cache]
// Which algorithm a convolution uses (and so how much workspace it needs) is decided once per
// (device, direction, shape) and kept for the process: training repeats the same few shapes every
// micro-batch, so choosing again would be wasted host time. The choice is made by cuDNN's
// heuristics (cudnnGet*Algorithm_v7) rather than by timing runs (cudnnFind*): timing would run the
// backward-filter candidates into some buffer (the persistent gradient buffer is the only one at
// hand, and it must not be overwritten mid-accumulation), allocate every candidate's workspace, and
// make the choice depend on machine noise. The workspace itself is not cached: each call takes it
// from the caching allocator in category workspace and returns it at once (stream-ordered reuse on
// the device's one stream), so the memory tracker sees it and it costs nothing between calls.
#include "cumulus/core/cudnn_context.h"

#if CUMULUS_WITH_CUDNN
#include <climits>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>

#include "cumulus/core/cuda_check.h"
#include "cumulus/core/cuda_context.h"
#include "cumulus/core/device.h"
#endif

namespace cumulus {

bool cudnn_compiled() {
#if CUMULUS_WITH_CUDNN
  return true;
#else
  return false;
#endif
}

#if CUMULUS_WITH_CUDNN

namespace detail {
void throw_cudnn_error(cudnnStatus_t st, const char* expr, const char* file, int line) {
  throw CudaError(concat("cuDNN error ", cudnnGetErrorString(st), " (status ", static_cast<int>(st),
                         ") from ", expr, " at ", file, ":", line));
}
void warn_cudnn_error(cudnnStatus_t st, const char* expr, const char* file, int line) {
  std::fprintf(stderr, "cumulus: warning: cuDNN error %s from %s at %s:%d\n", cudnnGetErrorString(st), expr,
               file, line);
}
}  // namespace detail

namespace cudnn {

namespace {
constexpr int kMaxDevices = 64;
}  // namespace

// Handles live until process exit (never destroyed: the driver may be gone by then).
cudnnHandle_t handle(int device_index) {
  static std::mutex mutex;
  static cudnnHandle_t handles[kMaxDevices] = {};
  check_device_available(Device::cuda(device_index));
  CUMULUS_CHECK(device_index >= 0 && device_index < kMaxDevices, DeviceError, "cuDNN: device index ",
                device_index, " out of range");
  std::lock_guard<std::mutex> lock(mutex);
  cudnnHandle_t& h = handles[device_index];
  if (h == nullptr) {
    const cudaStream_t s = cuda::stream(device_index);
    cuda::DeviceGuard guard(device_index);
    cudnnHandle_t created = nullptr;
    CUMULUS_CUDNN_CHECK(cudnnCreate(&created));
    CUMULUS_CUDNN_CHECK(cudnnSetStream(created, s));
    h = created;
  }
  return h;
}

bool ConvKey::operator<(const ConvKey& o) const {
  if (device != o.device) return device < o.device;
  if (direction != o.direction) return direction < o.direction;
  if (dtype != o.dtype) return dtype < o.dtype;
  return sizes < o.sizes;
}

namespace {
std::mutex cache_mutex;
std::map<ConvKey, ConvAlgorithm>& cache() {
  static auto* c = new std::map<ConvKey, ConvAlgorithm>;  // never destroyed, like the handles
  return *c;
}
}  // namespace

ConvAlgorithm cached_conv_algorithm(const ConvKey& key, const std::function<ConvAlgorithm()>& choose) {
  std::lock_guard<std::mutex> lock(cache_mutex);
  auto it = cache().find(key);
  if (it != cache().end()) return it->second;
  const ConvAlgorithm chosen = choose();
  cache().emplace(key, chosen);
  return chosen;
}

std::size_t conv_algorithm_cache_size() {
  std::lock_guard<std::mutex> lock(cache_mutex);
  return cache().size();
}

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
  CUMULUS_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d.get(), CUDNN_TENSOR_NCHW, data_type(dtype),
                                                 checked_int(n, "batch"), checked_int(c, "channels"),
                                                 checked_int(h, "height"), checked_int(w, "width")));
  return d;
}

}  // namespace cudnn

#endif  // CUMULUS_WITH_CUDNN

}  // namespace cumulus
