// Per-device CUDA state: the one stream every op of that device is queued on, and the cuBLAS
// handle bound to it (with its workspace taken from our allocator, category workspace, so the
// memory tracker sees it). Created lazily on first use, alive until process exit.
// Only for CUDA builds.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace cumulus::cuda {

// Makes `index` the current CUDA device for the scope, restoring the previous one after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

cudaStream_t stream(int device_index);
cublasHandle_t cublas(int device_index);

}  // namespace cumulus::cuda
