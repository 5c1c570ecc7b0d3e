// Per-device CUDA state (see cuda_context.h) and the error helpers of cuda_check.h.
#if CUMULUS_WITH_CUDA
#include "cumulus/core/cuda_context.h"

#include <cstdio>
#include <mutex>

#include "cumulus/core/cuda_check.h"
#include "cumulus/core/device.h"
#include "cumulus/memory/allocator.h"

namespace cumulus {

namespace detail {
std::atomic<int64_t> cuda_launches{0};

void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  throw CudaError(concat("CUDA error ", cudaGetErrorName(err), " (", cudaGetErrorString(err),
                         ") from ", expr, " at ", file, ":", line));
}
void throw_cublas_error(cublasStatus_t st, const char* expr, const char* file, int line) {
  throw CudaError(concat("cuBLAS error ", cublasGetStatusName(st), " (", cublasGetStatusString(st),
                         ") from ", expr, " at ", file, ":", line));
}
void warn_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  std::fprintf(stderr, "cumulus: warning: CUDA error %s from %s at %s:%d\n", cudaGetErrorName(err),
               expr, file, line);
}
}  // namespace detail

namespace cuda {

DeviceGuard::DeviceGuard(int index) {
  CUMULUS_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != index) CUMULUS_CUDA_CHECK(cudaSetDevice(index));
}

DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) CUMULUS_CUDA_WARN(cudaSetDevice(previous_));
}

namespace {

// cuBLAS's own default workspace on Hopper is 32 MiB; 8 MiB covers the GEMM shapes of our models
// and keeps the figure visible in the memory report (category workspace).
constexpr std::size_t kCublasWorkspaceBytes = 8u << 20;
constexpr int kMaxDevices = 64;

struct Context {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  Allocation cublas_workspace;
};

// Contexts live until process exit (never destroyed: the driver may be gone by then).
Context& context(int index) {
  static std::mutex mutex;
  static Context* contexts[kMaxDevices] = {};
  check_device_available(Device::cuda(index));
  std::lock_guard<std::mutex> lock(mutex);
  Context*& ctx = contexts[index];
  if (ctx == nullptr) {
    auto* c = new Context;
    DeviceGuard guard(index);
    CUMULUS_CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    ctx = c;
  }
  return *ctx;
}

}  // namespace

cudaStream_t stream(int device_index) { return context(device_index).stream; }

cublasHandle_t cublas(int device_index) {
  Context& ctx = context(device_index);
  if (ctx.cublas == nullptr) {
    DeviceGuard guard(device_index);
    cublasHandle_t h = nullptr;
    CUMULUS_CUBLAS_CHECK(cublasCreate(&h));
    CUMULUS_CUBLAS_CHECK(cublasSetStream(h, ctx.stream));
    ctx.cublas_workspace =
        allocator_for(Device::cuda(device_index)).allocate(kCublasWorkspaceBytes, MemoryCategory::workspace);
    CUMULUS_CUBLAS_CHECK(cublasSetWorkspace(h, ctx.cublas_workspace.get(), kCublasWorkspaceBytes));
    ctx.cublas = h;
  }
  return ctx.cublas;
}

}  // namespace cuda
}  // namespace cumulus
#endif  // CUMULUS_WITH_CUDA
