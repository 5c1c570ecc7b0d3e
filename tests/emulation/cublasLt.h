// The cuBLASLt names kernels/cuda/kernels.h declares, for the CPU emulation (see cuda_runtime.h here).
#pragma once
using cublasLtHandle_t = struct cublasLtContext*;
