// The two backends under the caching layer, and the per-device allocator registry.
#include <cstdlib>
#include <memory>
#include <mutex>

#include "cumulus/core/error.h"
#include "cumulus/memory/allocator.h"

#if CUMULUS_WITH_CUDA
#include "engine/core/cuda_context.h"
#include "kernels/cuda/cuda_check.h"
#endif

namespace cumulus {

namespace {

// Host memory aligned to 64 B (a cache line, and enough for any SIMD load OpenBLAS makes).
class HostBackend final : public MemoryBackend {
 public:
  void* raw_alloc(std::size_t bytes) override { return std::aligned_alloc(64, bytes); }
  void raw_free(void* ptr) noexcept override { std::free(ptr); }
};

#if CUMULUS_WITH_CUDA
// Page-locked host memory: a copy between it and a GPU runs asynchronously, at the bus's full speed.
class PinnedHostBackend final : public MemoryBackend {
 public:
  void* raw_alloc(std::size_t bytes) override {
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    CUMULUS_CUDA_CHECK(err);
    return p;
  }
  void raw_free(void* ptr) noexcept override { CUMULUS_CUDA_WARN(cudaFreeHost(ptr)); }
};

class CudaBackend final : public MemoryBackend {
 public:
  explicit CudaBackend(int index) : index_(index) {}
  void* raw_alloc(std::size_t bytes) override {
    cuda::DeviceGuard guard(index_);
    void* p = nullptr;
    // During a graph capture the new segment belongs to the graph pool, not to the graph, so it
    // may be taken outside the capture's rules (Note [CUDA graphs]).
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    CUMULUS_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    cudaError_t err = cudaMalloc(&p, bytes);
    CUMULUS_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear the sticky-free error so later calls do not see it
      return nullptr;
    }
    CUMULUS_CUDA_CHECK(err);
    return p;
  }
  void raw_free(void* ptr) noexcept override {
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(index_);
    CUMULUS_CUDA_WARN(cudaFree(ptr));
    cudaSetDevice(previous);
  }

 private:
  int index_;
};
#endif

constexpr int kMaxCudaDevices = 64;

}  // namespace

CachingAllocator& allocator_for(const Device& device) {
  // Allocators live until the process exits and are never destroyed: tensors with static
  // storage duration may free into them during exit, after the CUDA context is gone.
  static std::mutex mutex;
  static CachingAllocator* cpu = nullptr;
  static CachingAllocator* cuda[kMaxCudaDevices] = {};
  std::lock_guard<std::mutex> lock(mutex);
  if (device.is_cpu()) {
    if (cpu == nullptr) cpu = new CachingAllocator(device, std::make_unique<HostBackend>());
    return *cpu;
  }
  check_device_available(device);
  CUMULUS_CHECK(device.index() < kMaxCudaDevices, DeviceError, "device index too large: ", device.str());
#if CUMULUS_WITH_CUDA
  auto& slot = cuda[device.index()];
  if (slot == nullptr)
    slot = new CachingAllocator(device, std::make_unique<CudaBackend>(device.index()));
  return *slot;
#else
  (void)cuda;
  throw DeviceError("cumulus was built without CUDA");
#endif
}

CachingAllocator& host_state_allocator() {
  static std::once_flag once;
  static CachingAllocator* pool = nullptr;  // never destroyed, as allocator_for's
  std::call_once(once, [] {
#if CUMULUS_WITH_CUDA
    if (cuda_available()) {
      pool = new CachingAllocator(Device::cpu(), std::make_unique<PinnedHostBackend>());
      return;
    }
#endif
    pool = new CachingAllocator(Device::cpu(), std::make_unique<HostBackend>());
  });
  return *pool;
}

}  // namespace cumulus
