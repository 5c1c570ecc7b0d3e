#include "cumulus/core/timer.h"

#include <chrono>

#include "cumulus/core/error.h"

#if CUMULUS_WITH_CUDA
#include "engine/core/cuda_context.h"
#include "kernels/cuda/cuda_check.h"
#endif

namespace cumulus {

struct TimePoint::State {
  Device device;
  std::chrono::steady_clock::time_point host;
#if CUMULUS_WITH_CUDA
  cudaEvent_t event = nullptr;
  ~State() {
    if (event == nullptr) return;
    // A point kept to the process's end (a communicator's, which lives until exit) may outlive the
    // CUDA runtime: the driver frees its events then, nothing to warn about.
    const cudaError_t err = cudaEventDestroy(event);
    if (err != cudaSuccess && err != cudaErrorCudartUnloading)
      detail::warn_cuda_error(err, "cudaEventDestroy(event)", __FILE__, __LINE__);
  }
#endif
};

TimePoint TimePoint::now(const Device& device) {
#if CUMULUS_WITH_CUDA
  if (device.is_cuda()) return now_on(device, cuda::stream(device.index()));
#endif
  return now_on(device, nullptr);
}

TimePoint TimePoint::now_on(const Device& device, [[maybe_unused]] CUstream_st* stream) {
  TimePoint p;
  p.state_ = std::make_shared<State>();
  p.state_->device = device;
  if (device.is_cpu()) {
    p.state_->host = std::chrono::steady_clock::now();
  } else {
#if CUMULUS_WITH_CUDA
    cuda::DeviceGuard guard(device.index());
    CUMULUS_CUDA_CHECK(cudaEventCreate(&p.state_->event));  // with timing, unlike ordering-only events
    CUMULUS_CUDA_CHECK(cudaEventRecord(p.state_->event, stream));
#endif
  }
  return p;
}

bool TimePoint::reached() const {
  CUMULUS_CHECK(valid(), InvalidArgument, "TimePoint: unset time point");
#if CUMULUS_WITH_CUDA
  if (state_->event == nullptr) return true;
  const cudaError_t st = cudaEventQuery(state_->event);
  if (st == cudaErrorNotReady) return false;
  CUMULUS_CUDA_CHECK(st);
#endif
  return true;
}

double total_ms(const TimeSpans& spans) {
  double ms = 0.0;
  for (const auto& [start, end] : spans) ms += end.ms_since(start);
  return ms;
}

double TimePoint::ms_since(const TimePoint& earlier) const {
  CUMULUS_CHECK(valid() && earlier.valid(), InvalidArgument, "TimePoint: unset time point");
  CUMULUS_CHECK(state_->device == earlier.state_->device, DeviceError, "TimePoint: points on ",
                state_->device.str(), " and ", earlier.state_->device.str());
  if (state_->device.is_cpu())
    return std::chrono::duration<double, std::milli>(state_->host - earlier.state_->host).count();
#if CUMULUS_WITH_CUDA
  cuda::wait_event(state_->event);
  float ms = 0.0f;
  CUMULUS_CUDA_CHECK(cudaEventElapsedTime(&ms, earlier.state_->event, state_->event));
  return ms;
#else
  return 0.0;
#endif
}

}  // namespace cumulus
