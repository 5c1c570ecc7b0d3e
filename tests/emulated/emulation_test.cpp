// The emulation itself (tests/emulation/cuda_runtime.h): each kernel here plants one bug a GPU
// would punish (a race, a missing barrier, an uninitialized __shared__ read, a host pointer, a
// block over __launch_bounds__, a misaligned float4, dynamic shared memory misused) and the test
// shows the emulation catches it, beside a correct twin where that makes the point; then capture
// and replay.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "kernels/cuda/kernels.h"
#include "tests/emulated/emulated.h"
// after the emulation (emulated.h): the launch and dynamic_shared a kernels/cuda file uses
#include "kernels/cuda/common.cuh"

// What tests/CMakeLists.txt rewrites `__shared__ T name;` into in kernels/cuda files (this file is
// not rewritten).
#define TEST_SHARED(T, name)   \
  static char name##_site = 0; \
  auto& name = cuda_emulation::shared<T>(&name##_site)

namespace cumulus::testing {
namespace {

namespace cuda_common = kernels::cuda_common;

constexpr int kBlock = 256;

// Thread 0 writes the slot, thread 1 reads it: no barrier between them.
__global__ void unsynchronized_handoff_kernel(float* out) {
  TEST_SHARED(float, slot);
  if (threadIdx.x == 0) slot = 1.0f;
  if (threadIdx.x == 1) out[0] = slot;
}

// Reverses a block's values through shared memory; `synchronized` false drops the barrier between
// the writes and the reads.
template <bool synchronized>
__global__ void block_reverse_kernel(const float* in, float* out) {
  TEST_SHARED(float[kBlock], staged);
  staged[threadIdx.x] = in[threadIdx.x];
  if (synchronized) __syncthreads();
  out[threadIdx.x] = staged[kBlock - 1 - threadIdx.x];
}

// Reads a shared slot nobody wrote.
__global__ void uninitialized_shared_kernel(float* out) {
  TEST_SHARED(float[kBlock], never_written);
  out[blockIdx.x * blockDim.x + threadIdx.x] = never_written[threadIdx.x];
}

__global__ void copy_kernel(const float* in, float* out) { out[threadIdx.x] = in[threadIdx.x]; }

// Declared __launch_bounds__(128) in spirit: the registration tests/CMakeLists.txt generates for a
// kernels/cuda file.
__global__ void bounded_kernel(float* out) { out[threadIdx.x] = 1.0f; }
const cuda_emulation::LaunchBound bounded_kernel_bound("bounded_kernel", 128);

// Four floats at once from `in + offset`: aligned only where offset is a multiple of 4. The
// misaligned load is the planted bug, so UBSan's own alignment check (the sanitizer build) is left
// to the emulation's, which this test is about.
__attribute__((no_sanitize("alignment"))) __global__ void vector_load_kernel(const float* in, int offset, float* out) {
  const float4 v = reinterpret_cast<const float4*>(in + offset)[0];
  out[0] = v.x + v.y + v.z + v.w;
}

// Thread 0 leaves before the barrier the others wait at.
__global__ void early_exit_kernel(float* out) {
  if (threadIdx.x == 0) return;
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}

__global__ void add_kernel(float* x, float amount) { x[threadIdx.x] += amount; }

// Each thread reads its dynamic shared slot before anyone wrote it (seen[]), writes the block's
// index there, and after the barrier reads its neighbour's (mine[]).
__global__ void dynamic_shared_kernel(float* seen, float* mine) {
  float* const slots = cuda_common::dynamic_shared<float>();
  const unsigned t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
  seen[i] = slots[t];
  slots[t] = static_cast<float>(blockIdx.x);
  __syncthreads();
  mine[i] = slots[(t + 1) % blockDim.x];
}

// Static shared memory beside the dynamic: both count against the block's limit.
__global__ void both_shared_kernel(float* out) {
  TEST_SHARED(float[4096], staged);
  staged[threadIdx.x] = cuda_common::dynamic_shared<float>()[0];
  out[threadIdx.x] = staged[threadIdx.x];
}

template <typename Run>
std::string thrown_by(Run run) {
  try {
    run();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(EmulationCatches, ARaceBetweenThreadsOfABlock) {
  std::set<std::string> outcomes;
  for (int seed = 0; seed < 16; ++seed) {
    cuda_emulation::reseed("race " + std::to_string(seed));
    DeviceValue<float> out(0.0f);
    cuda_emulation::launch<unsynchronized_handoff_kernel>(dim3(1), dim3(kBlock), out.get());
    outcomes.insert(std::isnan(*out) ? "unwritten" : std::to_string(*out));
  }
  EXPECT_EQ(outcomes, (std::set<std::string>{"unwritten", std::to_string(1.0f)}))
      << "the read must see the write on some schedules and not on others";
}

TEST(EmulationCatches, AMissingBarrier) {
  const DeviceVector<float> in = random_values(kBlock, -1, 1, 1);
  DeviceVector<float> good(kBlock), bad(kBlock);
  cuda_emulation::launch<block_reverse_kernel<true>>(dim3(1), dim3(kBlock), in.data(), good.data());
  cuda_emulation::launch<block_reverse_kernel<false>>(dim3(1), dim3(kBlock), in.data(), bad.data());
  for (int i = 0; i < kBlock; ++i) ASSERT_EQ(good[i], in[kBlock - 1 - i]) << "with the barrier, at " << i;
  int unwritten = 0;
  for (float v : bad) unwritten += std::isnan(v);
  EXPECT_GT(unwritten, 0) << "without the barrier some reads must come before their writes";
}

TEST(EmulationCatches, AnUninitializedSharedRead) {
  DeviceVector<float> out(2 * kBlock, 0.0f);
  cuda_emulation::launch<uninitialized_shared_kernel>(dim3(2), dim3(kBlock), out.data());
  for (std::size_t i = 0; i < out.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &out[i], sizeof bits);
    ASSERT_EQ(bits, 0xFFFFFFFFu) << "shared memory is poisoned at every block's start, at " << i;
  }
}

TEST(EmulationCatches, AHostPointerPassedToAKernel) {
  const std::vector<float> host(kBlock, 1.0f);
  DeviceVector<float> out(kBlock);
  const std::string error =
      thrown_by([&] { cuda_emulation::launch<copy_kernel>(dim3(1), dim3(kBlock), host.data(), out.data()); });
  EXPECT_NE(error.find("copy_kernel: argument 1"), std::string::npos) << error;
  const DeviceVector<float> in(kBlock, 1.0f);
  EXPECT_NO_THROW(cuda_emulation::launch<copy_kernel>(dim3(1), dim3(kBlock), in.data(), out.data()));
  EXPECT_EQ(out[kBlock - 1], 1.0f);
}

TEST(EmulationCatches, ABlockOverItsLaunchBounds) {
  DeviceVector<float> out(kBlock);
  const std::string error = thrown_by([&] { cuda_emulation::launch<bounded_kernel>(dim3(1), dim3(256), out.data()); });
  EXPECT_NE(error.find("__launch_bounds__(128)"), std::string::npos) << error;
  EXPECT_NO_THROW(cuda_emulation::launch<bounded_kernel>(dim3(1), dim3(128), out.data()));
  // The bounds tests/CMakeLists.txt registers for kernels/cuda/fused_mlp.cu.
  for (const char* kernel : {"linear_forward_kernel", "head_forward_kernel", "head_backward_kernel"})
    EXPECT_EQ(cuda_emulation::launch_bounds().count(kernel), 1u) << kernel;
}

TEST(EmulationCatches, AMisalignedFloat4Load) {
  const DeviceVector<float> in(8, 1.0f);
  DeviceValue<float> out(0.0f);
  const std::string error =
      thrown_by([&] { cuda_emulation::launch<vector_load_kernel>(dim3(1), dim3(32), in.data(), 1, out.get()); });
  EXPECT_NE(error.find("misaligned float4"), std::string::npos) << error;
  cuda_emulation::launch<vector_load_kernel>(dim3(1), dim3(32), in.data(), 4, out.get());
  EXPECT_EQ(*out, 4.0f);
}

TEST(EmulationCatches, ABarrierSomeThreadsNeverReach) {
  DeviceVector<float> out(kBlock);
  const std::string error =
      thrown_by([&] { cuda_emulation::launch<early_exit_kernel>(dim3(1), dim3(kBlock), out.data()); });
  EXPECT_NE(error.find("never reach"), std::string::npos) << error;
}

// Dynamic shared memory (cuda_common::launch_with_shared) is each block's own, poisoned at its
// start like static shared memory; a kernel given none that reads it, and a block asking more than
// an A100 allows (static and dynamic together), fail their launch.
TEST(EmulationCatches, DynamicSharedMemoryMisuse) {
  DeviceVector<float> seen(4 * kBlock, 0.0f), mine(4 * kBlock, 0.0f);
  cuda_common::launch_with_shared<dynamic_shared_kernel>(dim3(4), dim3(kBlock), 100 * 1024, nullptr, seen.data(),
                                                         mine.data());
  for (int i = 0; i < 4 * kBlock; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &seen[i], sizeof bits);
    ASSERT_EQ(bits, 0xFFFFFFFFu) << "poisoned at every block's start, at " << i;
    ASSERT_EQ(mine[i], static_cast<float>(i / kBlock)) << "the block's own, at " << i;
  }
  std::string error = thrown_by(
      [&] { cuda_common::launch<dynamic_shared_kernel>(dim3(1), dim3(kBlock), nullptr, seen.data(), mine.data()); });
  EXPECT_NE(error.find("did not give it"), std::string::npos) << error;
  error = thrown_by([&] {
    cuda_common::launch_with_shared<dynamic_shared_kernel>(dim3(1), dim3(kBlock), 164 * 1024, nullptr, seen.data(),
                                                           mine.data());
  });
  EXPECT_NE(error.find("bytes of dynamic shared memory, over"), std::string::npos) << error;
  error = thrown_by([&] {
    cuda_common::launch_with_shared<both_shared_kernel>(dim3(1), dim3(kBlock), 150 * 1024, nullptr, seen.data());
  });
  EXPECT_NE(error.find("need over"), std::string::npos) << error;
  EXPECT_NO_THROW(
      cuda_common::launch_with_shared<both_shared_kernel>(dim3(1), dim3(kBlock), 140 * 1024, nullptr, seen.data()));
}

// Recorded launches run only at replay, each with the arguments it was given at capture: a value
// passed by value is the capture's on every replay, what lives in device memory moves on.
TEST(EmulationCapture, ReplaysTheRecordedLaunchesWithTheirArguments) {
  DeviceValue<int32_t> counter(41);
  DeviceVector<float> x(32, 0.0f);
  float amount = 0.5f;
  cuda_emulation::begin_capture();
  kernels::increment_i32_cuda(counter.get(), nullptr);  // through cuda_common::launch
  cuda_emulation::launch<add_kernel>(dim3(1), dim3(32), x.data(), amount);
  cuda_emulation::Recording recording = cuda_emulation::end_capture();
  amount = 100.0f;
  EXPECT_EQ(recording.launches(), 2u);
  EXPECT_EQ(*counter, 41) << "nothing runs while capturing";
  EXPECT_EQ(x[0], 0.0f);
  recording.replay();
  recording.replay();
  recording.replay();
  EXPECT_EQ(*counter, 44);
  for (float v : x) ASSERT_EQ(v, 1.5f) << "the captured amount, three times";
  kernels::increment_i32_cuda(counter.get(), nullptr);
  EXPECT_EQ(*counter, 45) << "after end_capture, launches run again";
}

}  // namespace
}  // namespace cumulus::testing
