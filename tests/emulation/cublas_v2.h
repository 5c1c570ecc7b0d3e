// The cuBLAS names kernels/cuda/kernels.h declares, for the CPU emulation (see cuda_runtime.h here).
#pragma once
using cublasHandle_t = struct cublasContext*;
enum cublasStatus_t : int;  // only named by a declaration (kernels::lt_heuristic_found)
