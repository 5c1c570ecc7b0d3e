// The cuBLAS names kernels/cuda/kernels.h declares, for the CPU emulation (see cuda_runtime.h here).
#pragma once
using cublasHandle_t = struct cublasContext*;
