// The emulated kernel suite's main (tests/CMakeLists.txt runs it as one process): every test, each
// on a schedule of its own drawn from CUMULUS_EMULATION_SEED (so a failing test reproduces alone,
// with the seed and filter printed), then, when no filter narrowed the run, a check that every
// __global__ function under kernels/cuda was launched by some test (kernel_names.h is generated
// from the sources), so a new kernel without an emulated test fails CI.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include <cuda_runtime.h>  // the emulation's (tests/emulation)
#include "kernel_names.h"

namespace {

std::string full_name(const testing::TestInfo& test) { return std::string(test.test_suite_name()) + "." + test.name(); }

class ScheduleSeeds : public testing::EmptyTestEventListener {
  void OnTestStart(const testing::TestInfo& test) override { cuda_emulation::reseed(full_name(test)); }
  void OnTestEnd(const testing::TestInfo& test) override {
    if (test.result()->Failed())
      std::fprintf(stderr, "to rerun on the same schedule: CUMULUS_EMULATION_SEED=%llu --gtest_filter=%s\n",
                   static_cast<unsigned long long>(cuda_emulation::seed()), full_name(test).c_str());
  }
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  testing::UnitTest::GetInstance()->listeners().Append(new ScheduleSeeds);
  std::fprintf(stderr, "emulated suite: schedule seed %llu (CUMULUS_EMULATION_SEED)\n",
               static_cast<unsigned long long>(cuda_emulation::seed()));
  const int result = RUN_ALL_TESTS();
  if (testing::GTEST_FLAG(filter) != "*" || testing::GTEST_FLAG(list_tests)) return result;
  const auto launched = cuda_emulation::launched_kernels();
  int missing = 0;
  for (const auto& kernel : kCudaKernels)
    if (launched.count(kernel[1]) == 0) {
      std::fprintf(stderr, "kernels/cuda/%s: %s was never launched by the emulated suite\n", kernel[0], kernel[1]);
      ++missing;
    }
  std::fprintf(stderr, "emulated suite: %zu kernels under kernels/cuda, %d never launched\n",
               sizeof(kCudaKernels) / sizeof(kCudaKernels[0]), missing);
  return missing > 0 ? 1 : result;
}
