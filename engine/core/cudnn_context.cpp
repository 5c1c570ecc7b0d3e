// Per-device cuDNN state (see cudnn_context.h).
#include "engine/core/cudnn_context.h"

#if CUMULUS_WITH_CUDNN
#include <mutex>

#include "cumulus/core/device.h"
#include "engine/core/cuda_context.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cudnn_common.h"
#include "kernels/cuda/cudnn_kernels.h"
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

kernels::ConvAlgorithms& conv_algorithms() {
  static auto* algorithms = new kernels::ConvAlgorithms;  // never destroyed, like the handles
  return *algorithms;
}

std::size_t conv_algorithm_cache_size() { return conv_algorithms().size(); }

std::vector<std::string> conv_algorithm_report() { return conv_algorithms().report(); }

#if CUMULUS_WITH_CUDNN_FRONTEND
kernels::SdpaGraphs& attention_graphs() {
  static auto* graphs = new kernels::SdpaGraphs;  // never destroyed, like the handles
  return *graphs;
}
#endif

}  // namespace cudnn

#endif  // CUMULUS_WITH_CUDNN

}  // namespace cumulus
