#include "cumulus/core/precision.h"

#include "cumulus/core/error.h"

#if CUMULUS_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace cumulus {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
  }
  return "unknown";
}

Precision parse_precision(const std::string& text) {
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16})
    if (text == precision_name(p)) return p;
  throw InvalidArgument("unknown precision '" + text + "' (fp32, bf16 or fp16)");
}

DType compute_dtype(Precision p) {
  switch (p) {
    case Precision::fp32: return DType::f32;
    case Precision::bf16: return DType::bf16;
    case Precision::fp16: return DType::f16;
  }
  return DType::f32;
}

std::string precision_unsupported_reason(Precision p, const Device& device) {
  if (p == Precision::fp32 || device.is_cpu()) return {};
#if CUMULUS_WITH_CUDA
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device.index()) != cudaSuccess) {
    (void)cudaGetLastError();
    return "the properties of " + device.str() + " cannot be read";
  }
  const int needed = p == Precision::bf16 ? 80 : 70, has = prop.major * 10 + prop.minor;
  if (has >= needed) return {};
  return device.describe() + " has compute capability " + std::to_string(prop.major) + "." +
         std::to_string(prop.minor) + "; " + precision_name(p) + " GEMMs on tensor cores need " +
         std::to_string(needed / 10) + "." + std::to_string(needed % 10) + " or newer";
#else
  return "cumulus was built without CUDA";
#endif
}

}  // namespace cumulus
