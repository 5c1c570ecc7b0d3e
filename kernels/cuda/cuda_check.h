// Check macros for CUDA runtime and cuBLAS calls: each failure throws CudaError carrying the
// expression, file and line (after PyTorch's C10_CUDA_CHECK). Only for CUDA translation units.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "cumulus/core/error.h"

namespace cumulus::detail {
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t st, const char* expr, const char* file, int line);
// For destructors and free paths, which must not throw: print a warning instead.
void warn_cuda_error(cudaError_t err, const char* expr, const char* file, int line);
// Kernel launches and library calls that launch kernels, counted by the launchers (see
// cuda_kernel_launches() in device.h): on a small MLP, launches set the speed.
extern std::atomic<int64_t> cuda_launches;
inline void count_launch() { cuda_launches.fetch_add(1, std::memory_order_relaxed); }
}  // namespace cumulus::detail

#define CUMULUS_CUDA_CHECK(expr)                                                                                   \
  do {                                                                                                             \
    cudaError_t cumulus_err_ = (expr);                                                                             \
    if (cumulus_err_ != cudaSuccess) ::cumulus::detail::throw_cuda_error(cumulus_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#define CUMULUS_CUDA_WARN(expr)                                                                                   \
  do {                                                                                                            \
    cudaError_t cumulus_err_ = (expr);                                                                            \
    if (cumulus_err_ != cudaSuccess) ::cumulus::detail::warn_cuda_error(cumulus_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#define CUMULUS_CUBLAS_CHECK(expr)                                                   \
  do {                                                                               \
    cublasStatus_t cumulus_st_ = (expr);                                             \
    if (cumulus_st_ != CUBLAS_STATUS_SUCCESS)                                        \
      ::cumulus::detail::throw_cublas_error(cumulus_st_, #expr, __FILE__, __LINE__); \
  } while (0)

// After every kernel launch: counts it and catches bad launch configurations at the launch site.
#define CUMULUS_LAUNCH_CHECK()              \
  do {                                      \
    ::cumulus::detail::count_launch();      \
    CUMULUS_CUDA_CHECK(cudaGetLastError()); \
  } while (0)
