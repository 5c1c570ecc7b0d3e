// cuDNN: one handle per device, bound to that device's stream (cuda_context.h), created lazily and
// alive until process exit, and the process's cache of convolution algorithm choices (one per
// shape and direction, Note [cuDNN algorithm cache] in kernels/cuda/cudnn_conv.cu), both handed
// to the launchers by the ops. The check macro and the descriptors the launchers use are theirs
// (kernels/cuda/cudnn_common.h).
//
// Safe to include in every build. Without cuDNN (CUMULUS_WITH_CUDNN unset: a CPU-only build, or a
// CUDA build where cuDNN was not found) only cudnn_compiled() and CUMULUS_CUDNN_ONLY exist, and the
// convolutional ops throw DeviceError on CUDA tensors.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cumulus/core/error.h"
#include "cumulus/tensor/dtype.h"

namespace cumulus {
// Whether this build has the cuDNN ops (conv2d, batch_norm2d, max_pool2d on CUDA).
bool cudnn_compiled();
}  // namespace cumulus

// CUMULUS_CUDNN_ONLY(stmt): stmt in builds with cuDNN; otherwise a DeviceError that says so. For
// the CUDA branch of CUMULUS_DISPATCH in the ops that need cuDNN.
#if CUMULUS_WITH_CUDNN
#define CUMULUS_CUDNN_ONLY(stmt) stmt
#else
#define CUMULUS_CUDNN_ONLY(stmt)                                                                    \
  throw ::cumulus::DeviceError(                                                                     \
      "this op needs cuDNN on CUDA tensors, and cumulus was built without it (cuDNN was not found " \
      "when configuring; install cuDNN and re-run cmake, or run the op on the CPU)")
#endif

#if CUMULUS_WITH_CUDNN
#include <cudnn.h>

#include <cstddef>
#include <string>
#include <vector>

namespace cumulus::kernels {
class ConvAlgorithms;  // kernels/cuda/cudnn_kernels.h
}  // namespace cumulus::kernels
#if CUMULUS_WITH_CUDNN_FRONTEND
#include "kernels/cuda/cudnn_attention.h"
#endif

namespace cumulus::cudnn {

// The device's handle, bound to cumulus::cuda::stream(device_index).
cudnnHandle_t handle(int device_index);

// The convolution algorithms chosen so far, for every device, kept for the life of the process
// (Note [cuDNN algorithm cache] in kernels/cuda/cudnn_conv.cu); the ops hand it to the launchers.
kernels::ConvAlgorithms& conv_algorithms();
// Entries in it (for tests: a second call with the same shape adds none).
std::size_t conv_algorithm_cache_size();
// One line per choice in it: direction, dtype, sizes, algorithm, math type, workspace (for tests).
std::vector<std::string> conv_algorithm_report();

#if CUMULUS_WITH_CUDNN_FRONTEND
// cuDNN's attention graphs built so far, for every device, kept for the life of the process (Note
// [cuDNN attention] in kernels/cuda/cudnn_attention.cpp); the attention op hands it to the launchers.
kernels::SdpaGraphs& attention_graphs();
#endif

}  // namespace cumulus::cudnn
#endif  // CUMULUS_WITH_CUDNN
