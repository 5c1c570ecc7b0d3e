// Timing of device work. On CPU a point is the host clock; on CUDA it is an event recorded on the
// device's stream, so elapsed times measure the device's work, not the launch calls, and taking a
// point never synchronizes (reading an elapsed time waits for the later event only).
#pragma once

#include <memory>

#include "cumulus/core/device.h"

namespace cumulus {

class TimePoint {
 public:
  TimePoint() = default;
  static TimePoint now(const Device& device);
  bool valid() const { return state_ != nullptr; }
  // Milliseconds from `earlier` to this point; both on the same device.
  double ms_since(const TimePoint& earlier) const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace cumulus
