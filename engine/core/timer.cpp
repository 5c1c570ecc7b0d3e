#include "cumulus/core/timer.h"

#include <chrono>

#include "cumulus/core/error.h"

#if CUMULUS_WITH_CUDA
#include "cumulus/core/cuda_check.h"
#include "cumulus/core/cuda_context.h"
#endif

namespace cumulus {

struct TimePoint::State {
  Device device;
  std::chrono::steady_clock::time_point host;
#if CUMULUS_WITH_CUDA
  cudaEvent_t event = nullptr;
  ~State() {
    if (event) CUMULUS_CUDA_WARN(cudaEventDestroy(event));
  }
#endif
};

TimePoint TimePoint::now(const Device& device) {
  TimePoint p;
  p.state_ = std::make_shared<State>();
  p.state_->device = device;
  if (device.is_cpu()) {
    p.state_->host = std::chrono::steady_clock::now();
  } else {
#if CUMULUS_WITH_CUDA
    cuda::DeviceGuard guard(device.index());
    CUMULUS_CUDA_CHECK(cudaEventCreate(&p.state_->event));
    CUMULUS_CUDA_CHECK(cudaEventRecord(p.state_->event, cuda::stream(device.index())));
#endif
  }
  return p;
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
