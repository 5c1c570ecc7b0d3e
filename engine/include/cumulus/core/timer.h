// Timing of device work. On CPU a point is the host clock; on CUDA it is an event recorded on the
// device's stream, so elapsed times measure the device's work, not the launch calls, and taking a
// point never synchronizes (reading an elapsed time waits for the later event only).
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "cumulus/core/device.h"

struct CUstream_st;  // what cudaStream_t points to, so this header needs no CUDA

namespace cumulus {

class TimePoint {
 public:
  TimePoint() = default;
  static TimePoint now(const Device& device);
  // CUDA: a point on another stream of the device than its execution context's, e.g. a
  // communication stream, so that a span measures that stream's work (CPU: the host clock).
  static TimePoint now_on(const Device& device, CUstream_st* stream);
  bool valid() const { return state_ != nullptr; }
  // Whether the device has passed this point (on the CPU, always); never waits.
  bool reached() const;
  // Milliseconds from `earlier` to this point; both on the same device.
  double ms_since(const TimePoint& earlier) const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

// (start, end) pairs, e.g. a step's reductions; read later, so that taking them never waits.
using TimeSpans = std::vector<std::pair<TimePoint, TimePoint>>;
// Their milliseconds summed; waits for each span's end.
double total_ms(const TimeSpans& spans);

}  // namespace cumulus
