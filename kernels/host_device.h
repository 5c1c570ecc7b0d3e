// CUMULUS_HOST_DEVICE: a function compiled for both the host and, under nvcc, the device, so the
// CPU loops and the CUDA kernels share literally the same arithmetic (kernels/optim_rules.h,
// kernels/float16.h).
#pragma once

#ifdef __CUDACC__
#define CUMULUS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define CUMULUS_HOST_DEVICE inline
#endif
