// The cuBLASLt GEMM's plans (kernels/cuda/gemm.cu) against the emulated cuBLASLt
// (tests/emulation/cublasLt.h), whose matmul a test can make reject chosen algorithms: a rejected
// algorithm gives way to the heuristic's next one in the same call and is not tried again; when
// every one is rejected the call declines (false, nothing written: the caller runs the unfused
// kernels) and later calls decline without calling the matmul; any other failure throws
// (Note [Rejected algorithm]). What cuBLASLt really rejects, and its results, only a GPU shows.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cuda/kernels.h"
#include "tests/emulated/emulated.h"

namespace cumulus::testing {
namespace {

using kernels::GemmEpilogue;
using kernels::GemmEpilogueArgs;

// c [3, 4] = a [3, 5] b [5, 4] + bias, row-major, over a c holding NaN.
class GemmLtEmulated : public ::testing::Test {
 protected:
  static constexpr int64_t m = 3, n = 4, k = 5;
  void SetUp() override { cublas_lt_emulation::control() = cublas_lt_emulation::Control(); }
  void TearDown() override { cublas_lt_emulation::control() = cublas_lt_emulation::Control(); }

  void reject(std::function<cublasStatus_t(int)> status) { cublas_lt_emulation::control().matmul_status = status; }
  int matmul_calls() const { return cublas_lt_emulation::control().matmul_calls; }

  bool gemm() {
    c.assign(m * n, kNaN);
    GemmEpilogueArgs e;
    e.kind = GemmEpilogue::bias;
    e.bias = bias.data();
    return kernels::gemm_lt_cuda(plans, nullptr, nullptr, 0, false, false, m, n, k, 1.0f, a.data(), k, b.data(), n,
                                 0.0f, c.data(), n, e, nullptr);
  }
  // The sums in the test's order; the emulated matmul contracts into FMAs (as nvcc would), so the
  // comparison is within expect_close's 1e-5, not bit for bit.
  std::vector<float> expected() const {
    std::vector<float> want(m * n);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        float s = 0.0f;
        for (int64_t q = 0; q < k; ++q) s += a[i * k + q] * b[q * n + j];
        want[i * n + j] = s + bias[j];
      }
    return want;
  }

  kernels::GemmLtPlans plans;
  const DeviceVector<float> a = random_values(m * k, -1, 1, 1), b = random_values(k * n, -1, 1, 2),
                            bias = random_values(n, -1, 1, 3);
  DeviceVector<float> c;
};

TEST_F(GemmLtEmulated, ARejectedAlgorithmGivesWayToTheNextAndIsNotRetried) {
  cublas_lt_emulation::control().algorithms = 3;
  reject([](int algorithm) { return algorithm == 0 ? CUBLAS_STATUS_NOT_SUPPORTED : CUBLAS_STATUS_SUCCESS; });
  ASSERT_TRUE(gemm());
  EXPECT_EQ(matmul_calls(), 2) << "the rejected algorithm, then the next";
  expect_close(c, as_double(expected()), "c with the bias");
  ASSERT_TRUE(gemm());
  EXPECT_EQ(matmul_calls(), 3) << "the rejected algorithm is not tried again";
  expect_close(c, as_double(expected()), "c on the second call");
}

TEST_F(GemmLtEmulated, EveryAlgorithmRejectedDeclinesForGood) {
  reject([](int) { return CUBLAS_STATUS_INVALID_VALUE; });
  const kernels::GemmLtOutcomes before = kernels::gemm_lt_outcomes(GemmEpilogue::bias);
  EXPECT_FALSE(gemm());
  EXPECT_EQ(matmul_calls(), 2) << "both of the heuristic's algorithms tried";
  for (float v : c) EXPECT_TRUE(std::isnan(v)) << "nothing written";
  EXPECT_FALSE(gemm());
  EXPECT_EQ(matmul_calls(), 2) << "the plan remembers: no matmul on the second call";
  const kernels::GemmLtOutcomes after = kernels::gemm_lt_outcomes(GemmEpilogue::bias);
  EXPECT_EQ(after.declined - before.declined, 2);
  EXPECT_EQ(after.fused, before.fused);
}

TEST_F(GemmLtEmulated, AnyOtherMatmulFailureThrows) {
  reject([](int) { return CUBLAS_STATUS_EXECUTION_FAILED; });
  EXPECT_THROW(gemm(), CudaError);
  EXPECT_EQ(matmul_calls(), 1);
}

TEST(GemmLtRules, OnlyNotSupportedAndInvalidValueAreRejections) {
  EXPECT_TRUE(kernels::lt_matmul_rejected(CUBLAS_STATUS_NOT_SUPPORTED));
  EXPECT_TRUE(kernels::lt_matmul_rejected(CUBLAS_STATUS_INVALID_VALUE));
  for (cublasStatus_t st : {CUBLAS_STATUS_SUCCESS, CUBLAS_STATUS_EXECUTION_FAILED, CUBLAS_STATUS_INTERNAL_ERROR,
                            CUBLAS_STATUS_ALLOC_FAILED, CUBLAS_STATUS_ARCH_MISMATCH})
    EXPECT_FALSE(kernels::lt_matmul_rejected(st)) << static_cast<int>(st);
}

}  // namespace
}  // namespace cumulus::testing
