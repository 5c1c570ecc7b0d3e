// Several small reads of device memory with one wait for the device, where copy_bytes waits after
// each: the Trainer's counters read its step state and the optimizer's scalars together. Internal
// to the engine.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <vector>

#include "cumulus/core/device.h"

namespace cumulus {

struct HostRead {
  void* dst;        // host memory
  const void* src;  // memory on `device`
  std::size_t bytes;
};

// Each read queued in order after the device's queued work, then one wait (none on the CPU).
void read_to_host(const Device& device, std::initializer_list<HostRead> reads);
void read_to_host(const Device& device, const std::vector<HostRead>& reads);

}  // namespace cumulus
