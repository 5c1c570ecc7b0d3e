// The host-side rules of the cuBLASLt GEMM (kernels/cuda/gemm.cu), which need no GPU: how the
// heuristic's answer is read (Note [No fused algorithm]) and which epilogue arguments are refused
// before anything reaches cuBLASLt (Note [Epilogue bias type]). The GEMMs themselves run in the
// CUDA cases of test_ops, test_precision, test_nn and test_fused_mlp. This file includes a private
// header (kernels/), as test_fused_kernels_emulated does: tests/CMakeLists.txt adds the root.
#include <gtest/gtest.h>

#include <string>

#include "cumulus/cumulus.h"

#if CUMULUS_WITH_CUDA
#include "kernels/cuda/kernels.h"

namespace cumulus::testing {
namespace {

using kernels::GemmEpilogue;
using kernels::GemmEpilogueArgs;
using kernels::GemmTypes;

// cublasLtMatmulAlgoGetHeuristic documents CUBLAS_STATUS_NOT_SUPPORTED and CUBLAS_STATUS_INVALID_VALUE
// among its answers; every status but success, a successful query without results, and a result
// whose own state is not success all mean "no fused algorithm": the caller runs the unfused kernels.
TEST(CublasLtHeuristic, AnyAnswerButASuccessfulResultMeansNoFusedAlgorithm) {
  EXPECT_TRUE(kernels::lt_heuristic_found(CUBLAS_STATUS_SUCCESS, 1, CUBLAS_STATUS_SUCCESS));
  for (cublasStatus_t st : {CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_STATUS_INVALID_VALUE, CUBLAS_STATUS_NOT_INITIALIZED,
                            CUBLAS_STATUS_ALLOC_FAILED, CUBLAS_STATUS_ARCH_MISMATCH, CUBLAS_STATUS_MAPPING_ERROR,
                            CUBLAS_STATUS_EXECUTION_FAILED, CUBLAS_STATUS_INTERNAL_ERROR, CUBLAS_STATUS_LICENSE_ERROR})
    EXPECT_FALSE(kernels::lt_heuristic_found(st, 1, CUBLAS_STATUS_SUCCESS)) << cublasGetStatusName(st);
  EXPECT_FALSE(kernels::lt_heuristic_found(CUBLAS_STATUS_SUCCESS, 0, CUBLAS_STATUS_SUCCESS)) << "no result";
  EXPECT_FALSE(kernels::lt_heuristic_found(CUBLAS_STATUS_SUCCESS, 1, CUBLAS_STATUS_NOT_SUPPORTED))
      << "a result that is not usable itself";
}

// The message of what `fn` throws as InvalidArgument, or a note that it threw nothing or something else.
template <typename Fn>
std::string invalid_argument(Fn&& fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not an InvalidArgument: ") + e.what();
  }
  return "no error";
}

// The bias epilogue needs its bias, and a bias gradient an f32 c (cuBLASLt writes it in c's type):
// both refused before any cuBLASLt call (no handle is needed to see it), never handed over.
TEST(CublasLtArguments, RefusesAMissingBiasAndA16BitBiasGradient) {
  float operand[8] = {};
  kernels::GemmLtPlans plans;
  const auto call = [&](const GemmEpilogueArgs& e, DType cd) {
    return invalid_argument([&] {
      kernels::gemm_lt_cuda(plans, nullptr, nullptr, 0, false, true, 2, 2, 2, 1.0f, static_cast<const void*>(operand),
                            2, static_cast<const void*>(operand), 2, 0.0f, static_cast<void*>(operand), 2,
                            GemmTypes{cd, cd}, e, nullptr);
    });
  };
  GemmEpilogueArgs no_bias;
  no_bias.kind = GemmEpilogue::bias;
  EXPECT_NE(call(no_bias, DType::bf16).find("needs a bias"), std::string::npos);
  GemmEpilogueArgs bias_grad;
  bias_grad.kind = GemmEpilogue::bias_grad;
  bias_grad.bias_grad = operand;
  for (DType cd : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(cd));
    EXPECT_NE(call(bias_grad, cd).find("bias gradient needs an f32 c"), std::string::npos) << call(bias_grad, cd);
  }
}

// An empty product is never planned: false (the caller's unfused kernels handle it), counted as
// declined for the launch-count tests; the bias epilogue passes the checks with a c of any type
// (its bias in c's type: Note [Epilogue bias type]).
TEST(CublasLtArguments, AnEmptyProductIsDeclinedWithoutCallingCublasLt) {
  float operand[8] = {};
  GemmEpilogueArgs e;
  e.kind = GemmEpilogue::bias;
  e.bias = operand;
  kernels::GemmLtPlans plans;
  for (DType cd : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(cd));
    const kernels::GemmLtOutcomes before = kernels::gemm_lt_outcomes(GemmEpilogue::bias);
    const CudaEpilogueCalls public_before = cuda_epilogue_calls(CudaEpilogue::bias);
    EXPECT_FALSE(kernels::gemm_lt_cuda(plans, nullptr, nullptr, 0, false, true, 0, 2, 2, 1.0f,
                                       static_cast<const void*>(operand), 2, static_cast<const void*>(operand), 2,
                                       0.0f, static_cast<void*>(operand), 2, GemmTypes{cd, cd}, e, nullptr));
    const kernels::GemmLtOutcomes after = kernels::gemm_lt_outcomes(GemmEpilogue::bias);
    EXPECT_EQ(after.declined, before.declined + 1);
    EXPECT_EQ(after.fused, before.fused);
    EXPECT_EQ(cuda_epilogue_calls(CudaEpilogue::bias).declined, public_before.declined + 1)
        << "cuda_epilogue_calls reads the same tally";
  }
}

}  // namespace
}  // namespace cumulus::testing

#else

TEST(CublasLt, NeedsACudaBuild) { GTEST_SKIP() << "built without CUDA"; }

#endif
