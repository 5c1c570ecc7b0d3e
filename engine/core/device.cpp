#include "cumulus/core/device.h"

#include <cstdlib>
#include <fstream>

#include "cumulus/core/error.h"

#if CUMULUS_WITH_CUDA
#include "engine/core/cuda_context.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kernels.h"
#endif

namespace cumulus {

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5) {
    char* end = nullptr;
    long idx = std::strtol(text.c_str() + 5, &end, 10);
    if (*end == '\0' && idx >= 0 && idx < 1024) return cuda(static_cast<int>(idx));
  }
  throw InvalidArgument("unknown device '" + text + "' (expected cpu, cuda or cuda:N)");
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index_);
}

std::string Device::describe() const {
  if (is_cpu()) return "cpu";
#if CUMULUS_WITH_CUDA
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index_) == cudaSuccess) return str() + " (" + prop.name + ")";
  (void)cudaGetLastError();
#endif
  return str();
}

std::string Device::hardware_name() const {
  if (is_cpu()) {
    std::ifstream in("/proc/cpuinfo");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("model name", 0) != 0) continue;
      const std::size_t colon = line.find(':');
      if (colon == std::string::npos) break;
      const std::size_t start = line.find_first_not_of(" \t", colon + 1);
      if (start != std::string::npos) return line.substr(start);
      break;
    }
    return "cpu";
  }
#if CUMULUS_WITH_CUDA
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index_) == cudaSuccess) return prop.name;
  (void)cudaGetLastError();
#endif
  return str();
}

bool cuda_compiled() {
#if CUMULUS_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#if CUMULUS_WITH_CUDA
  static const int count = [] {
    int n = 0;
    // No driver or no GPU is not an error here: it means CUDA is unavailable.
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();
      n = 0;
    }
    return n;
  }();
  return count;
#else
  return 0;
#endif
}

void check_device_available(const Device& device) {
  if (device.is_cpu()) return;
  CUMULUS_CHECK(cuda_compiled(), DeviceError, "device ", device.str(),
                " requested but cumulus was built without CUDA (configure with -DCUMULUS_CUDA=ON)");
  const int n = cuda_device_count();
  CUMULUS_CHECK(device.index() < n, DeviceError, "device ", device.str(), " requested but ",
                n == 0 ? std::string("no CUDA GPU is available")
                       : std::to_string(n) + " CUDA device(s) are present");
}

int64_t host_synchronizations() {
#if CUMULUS_WITH_CUDA
  return cuda::host_synchronizations();
#else
  return 0;
#endif
}

int64_t cuda_kernel_launches() {
#if CUMULUS_WITH_CUDA
  return detail::cuda_launches.load(std::memory_order_relaxed);
#else
  return 0;
#endif
}

CudaEpilogueCalls cuda_epilogue_calls(CudaEpilogue epilogue) {
#if CUMULUS_WITH_CUDA
  const kernels::GemmLtOutcomes o = kernels::gemm_lt_outcomes(
      epilogue == CudaEpilogue::bias ? kernels::GemmEpilogue::bias : kernels::GemmEpilogue::bias_grad);
  return {o.fused, o.declined};
#else
  (void)epilogue;
  return {};
#endif
}

void synchronize(const Device& device) {
  if (device.is_cpu()) return;
#if CUMULUS_WITH_CUDA
  cuda::synchronize_stream(cuda::stream(device.index()));
#endif
}

}  // namespace cumulus
