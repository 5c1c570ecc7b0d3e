// The optimizer updates' CUDA kernels (kernels/cuda/optim.cu), the very source nvcc compiles, on the
// CPU emulation against the CPU loops, bit for bit: with no parameter ever frozen (no mask), and
// with frozen chunks (Note [Frozen parameters] in kernels/optim_rules.h): a frozen chunk is left
// alone, state included, and counts the missed update once; a chunk behind the optimizer's count
// updates with its own count (Adam's bias corrections, SGD's first update); a skipped step changes
// nothing. On a GPU, tests/test_optim.cpp runs the compiled kernels through the optimizers.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cuda/kernels.h"
#include "kernels/optim_rules.h"
#include "tests/emulated/emulated.h"

namespace cumulus::testing {
namespace {

using kernels::FrozenChunks;

// Five whole chunks and a partial one; chunks 1 and 4 frozen; chunks 2 and 5 behind the optimizer's
// count (chunk 2 by 4: at update 5 it takes its first).
constexpr int64_t kN = 5 * FrozenChunks::kChunk + 17;
const DeviceVector<uint8_t> kMask = {0, 1, 0, 0, 1, 0};
const DeviceVector<int32_t> kMissed = {0, 2, 4, 0, 1, 3};
constexpr int64_t kUpdates = 5;  // the optimizer's count with this update

struct Arrays {
  DeviceVector<float> w = random_values(kN, -1, 1, 1), g = random_values(kN, -1, 1, 2);
  DeviceVector<float> a = random_values(kN, -1, 1, 3), b = random_values(kN, 0, 1, 4);  // momentum, or m and v
  DeviceVector<int32_t> missed = kMissed;
  FrozenChunks frozen(bool with_mask) { return with_mask ? FrozenChunks{kMask.data(), missed.data()} : FrozenChunks{}; }
};

kernels::UpdateScalars update_scalars(int32_t skip) {
  kernels::UpdateScalars scalars{};
  scalars.updates = kUpdates;
  scalars.grad_scale = 0.5f;
  scalars.lr = 0.01f;
  scalars.skip = skip;
  return scalars;
}

void expect_same(const Arrays& got, const Arrays& want, const Arrays& initial, bool with_mask, int32_t skip) {
  // One step: each element's rule has a few products an FMA may fuse, each off by one rounding.
  const double rel = 4 * unit_rounding<float>();
  expect_cpu_parity("optim.cu", got.w, want.w, rel, kContractionAbs, "w");
  expect_cpu_parity("optim.cu", got.a, want.a, rel, kContractionAbs, "state a");
  expect_cpu_parity("optim.cu", got.b, want.b, rel, kContractionAbs, "state b");
  EXPECT_EQ(got.missed, want.missed);
  for (int64_t i = 0; i < kN; ++i) {
    const bool untouched = skip || (with_mask && kMask[i / FrozenChunks::kChunk]);
    if (!untouched) continue;
    ASSERT_EQ(got.w[i], initial.w[i]) << "a frozen or skipped element moved at " << i;
    ASSERT_EQ(got.a[i], initial.a[i]) << i;
    ASSERT_EQ(got.b[i], initial.b[i]) << i;
  }
  DeviceVector<int32_t> missed = kMissed;
  if (with_mask && !skip)
    for (std::size_t c = 0; c < kMask.size(); ++c) missed[c] += kMask[c];
  EXPECT_EQ(got.missed, missed) << "each frozen chunk counts the update it missed, once";
}

TEST(FrozenOptimKernelsEmulated, AdamWMatchesTheCpuLoopWithFrozenChunks) {
  for (bool with_mask : {false, true})
    for (int32_t skip : {0, 1}) {
      SCOPED_TRACE(std::string(with_mask ? "frozen chunks" : "no mask") + (skip ? ", skipped step" : ""));
      const Arrays initial;
      Arrays cpu = initial, emulated = initial;
      DeviceValue<kernels::UpdateScalars> scalars(update_scalars(skip));
      if (!skip)
        kernels::adamw_step_cpu(cpu.w.data(), cpu.g.data(), cpu.a.data(), cpu.b.data(), kN, 0.5f, 0.01f, 0.9f, 0.999f,
                                1e-8f, 0.1f, kUpdates, cpu.frozen(with_mask));
      kernels::adamw_update_cuda(emulated.w.data(), emulated.g.data(), emulated.a.data(), emulated.b.data(), kN,
                                 scalars.get(), 0.9f, 0.999f, 1e-8f, 0.1f, emulated.frozen(with_mask), nullptr);
      expect_same(emulated, cpu, initial, with_mask, skip);
    }
}

TEST(FrozenOptimKernelsEmulated, SgdMatchesTheCpuLoopWithFrozenChunks) {
  for (bool with_mask : {false, true})
    for (int32_t skip : {0, 1}) {
      SCOPED_TRACE(std::string(with_mask ? "frozen chunks" : "no mask") + (skip ? ", skipped step" : ""));
      const Arrays initial;
      Arrays cpu = initial, emulated = initial;
      DeviceValue<kernels::UpdateScalars> scalars(update_scalars(skip));
      if (!skip)
        kernels::sgd_step_cpu(cpu.w.data(), cpu.g.data(), cpu.a.data(), kN, 0.5f, 0.01f, 0.9f, 0.5f, false, 0.1f,
                              kUpdates, cpu.frozen(with_mask));
      kernels::sgd_update_cuda(emulated.w.data(), emulated.g.data(), emulated.a.data(), kN, scalars.get(), 0.9f, 0.5f,
                               false, 0.1f, emulated.frozen(with_mask), nullptr);
      expect_same(emulated, cpu, initial, with_mask, skip);
      if (with_mask && !skip) {
        // Chunk 2 takes its first update (5 - 4): the buffer is the gradient, not a blend.
        const int64_t i = 2 * FrozenChunks::kChunk;
        EXPECT_FLOAT_EQ(emulated.a[i], 0.5f * initial.g[i] + 0.1f * initial.w[i]);
      }
    }
}

}  // namespace
}  // namespace cumulus::testing
