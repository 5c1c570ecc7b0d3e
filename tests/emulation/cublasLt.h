// The cuBLAS and cuBLASLt names kernels/cuda/gemm.cu uses, for the CPU emulation (see cuda_runtime.h
// here): enough of both libraries that gemm.cu's host-side rules (plans, the heuristic's answers,
// algorithms the matmul rejects: Note [Rejected algorithm] there) run on the CPU. The GEMMs are
// naive f32 loops on host pointers (column-major, as the libraries); 16-bit storage answers
// CUBLAS_STATUS_NOT_SUPPORTED. cublas_lt_emulation::control() lets a test choose how many
// algorithms the heuristic offers and which of them the matmul rejects, and counts the matmuls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "cublas_v2.h"
#include "cuda_runtime.h"

enum cublasStatus_t : int {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
  CUBLAS_STATUS_LICENSE_ERROR = 16,
};
enum cublasOperation_t : int { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cudaDataType_t : int { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 };
enum cublasComputeType_t : int { CUBLAS_COMPUTE_32F = 68 };
enum cublasGemmAlgo_t : int { CUBLAS_GEMM_DEFAULT = -1 };
enum cublasLtEpilogue_t : int {
  CUBLASLT_EPILOGUE_DEFAULT = 1,
  CUBLASLT_EPILOGUE_BIAS = 4,
  CUBLASLT_EPILOGUE_BGRADB = 512
};
enum cublasLtMatmulDescAttributes_t : int {
  CUBLASLT_MATMUL_DESC_TRANSA = 3,
  CUBLASLT_MATMUL_DESC_TRANSB = 4,
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
  CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
};
enum cublasLtMatmulPreferenceAttributes_t : int {
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
};

using cublasLtHandle_t = struct cublasLtContext*;
struct cublasLtMatmulAlgo_t {
  uint64_t data[8];  // data[0]: the algorithm's index in the heuristic's answer
};
struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo;
  std::size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
};

namespace cublas_lt_emulation {

struct MatmulDesc {
  int trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
};
struct Layout {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
struct Preference {};

// What a test sets: the heuristic's number of algorithms, the matmul's answer per algorithm index
// (success by default), and the matmuls called so far.
struct Control {
  int algorithms = 2;
  std::function<cublasStatus_t(int algorithm)> matmul_status;
  int matmul_calls = 0;
};
inline Control& control() {
  static Control c;
  return c;
}

// Element (r, c) of a column-major matrix, read through op.
inline float at(const float* m, int64_t ld, bool trans, uint64_t r, uint64_t c) {
  return trans ? m[c + r * ld] : m[r + c * ld];
}

}  // namespace cublas_lt_emulation

using cublasLtMatmulDesc_t = cublas_lt_emulation::MatmulDesc*;
using cublasLtMatrixLayout_t = cublas_lt_emulation::Layout*;
using cublasLtMatmulPreference_t = cublas_lt_emulation::Preference*;

inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t, cudaDataType_t) {
  *d = new cublas_lt_emulation::MatmulDesc();
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                                     const void* value, std::size_t) {
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: d->trans_a = *static_cast<const int32_t*>(value); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: d->trans_b = *static_cast<const int32_t*>(value); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: d->epilogue = *static_cast<const uint32_t*>(value); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: d->bias = *static_cast<const void* const*>(value); break;
  }
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType_t type, uint64_t rows,
                                                 uint64_t cols, int64_t ld) {
  *l = new cublas_lt_emulation::Layout{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  *p = new cublas_lt_emulation::Preference();
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t,
                                                           cublasLtMatmulPreferenceAttributes_t, const void*,
                                                           std::size_t) {
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                                     cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                                     cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int requested,
                                                     cublasLtMatmulHeuristicResult_t* results, int* returned) {
  *returned = 0;
  for (int i = 0; i < requested && i < cublas_lt_emulation::control().algorithms; ++i) {
    results[i] = cublasLtMatmulHeuristicResult_t{};
    results[i].algo.data[0] = static_cast<uint64_t>(i);
    results[i].state = CUBLAS_STATUS_SUCCESS;
    ++*returned;
  }
  return *returned > 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}

// D = alpha op(A) op(B) + beta C (+ the epilogue's bias per row of D, or the bias gradient of B:
// per column of D, the sum over k of op(B)); f32 only, C and D the same matrix.
inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void* alpha, const void* a,
                                     cublasLtMatrixLayout_t la, const void* b, cublasLtMatrixLayout_t lb,
                                     const void* beta, const void*, cublasLtMatrixLayout_t, void* d,
                                     cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t* algo, void*, std::size_t,
                                     cudaStream_t) {
  using cublas_lt_emulation::at;
  auto& control = cublas_lt_emulation::control();
  ++control.matmul_calls;
  if (control.matmul_status) {
    const cublasStatus_t st = control.matmul_status(static_cast<int>(algo->data[0]));
    if (st != CUBLAS_STATUS_SUCCESS) return st;
  }
  if (la->type != CUDA_R_32F || ld->type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool ta = desc->trans_a == CUBLAS_OP_T, tb = desc->trans_b == CUBLAS_OP_T;
  const uint64_t m = ld->rows, n = ld->cols, k = ta ? la->rows : la->cols;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  const auto* fa = static_cast<const float*>(a);
  const auto* fb = static_cast<const float*>(b);
  auto* fd = static_cast<float*>(d);
  const auto* bias = static_cast<const float*>(desc->bias);
  for (uint64_t c = 0; c < n; ++c) {
    for (uint64_t r = 0; r < m; ++r) {
      float s = 0.0f;
      for (uint64_t q = 0; q < k; ++q) s += at(fa, la->ld, ta, r, q) * at(fb, lb->ld, tb, q, c);
      float& out = fd[r + c * ld->ld];
      out = al * s + (be == 0.0f ? 0.0f : be * out);
      if (desc->epilogue == CUBLASLT_EPILOGUE_BIAS) out += bias[r];
    }
    if (desc->epilogue == CUBLASLT_EPILOGUE_BGRADB) {
      float g = 0.0f;
      for (uint64_t q = 0; q < k; ++q) g += at(fb, lb->ld, tb, q, c);
      const_cast<float*>(bias)[c] = g;
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

// The plain cuBLAS GEMMs gemm.cu also defines; the emulated tests call only cuBLASLt's.
inline cublasStatus_t cublasSgemm(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const float*,
                                  const float*, int, const float*, int, const float*, float*, int) {
  return CUBLAS_STATUS_NOT_SUPPORTED;
}
inline cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                   const void*, cudaDataType_t, int, const void*, cudaDataType_t, int, const void*,
                                   void*, cudaDataType_t, int, cublasComputeType_t, cublasGemmAlgo_t) {
  return CUBLAS_STATUS_NOT_SUPPORTED;
}
