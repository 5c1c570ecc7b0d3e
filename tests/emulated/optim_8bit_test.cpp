// The 8-bit optimizer updates' CUDA kernels (kernels/cuda/optim.cu) on the CPU emulation against the
// CPU loops (Note [8-bit optimizer state] in kernels/quantized_state.h): the weights, every code and
// every block's scale the same bits, over two updates from random codes and scales, with frozen
// chunks (left alone, codes and scales included, the miss counted once), chunks behind the
// optimizer's count, a partial last block, and a skipped step that changes nothing. optim.cu is
// compiled without contraction (Note [CUDA bit parity]), so nothing short of equality is accepted.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cuda/kernels.h"
#include "kernels/optim_rules.h"
#include "kernels/quantized_state.h"
#include "tests/emulated/emulated.h"

namespace cumulus::testing {
namespace {

using kernels::FrozenChunks;
using kernels::QuantizedState;

// Nine whole blocks and a partial one (three CUDA blocks of 256 threads, the last partly idle);
// blocks 1 and 4 frozen, 2 and 5 behind the optimizer's count (block 2 takes its first update).
constexpr int64_t kN = 9 * FrozenChunks::kChunk + 17;
constexpr int64_t kBlocks = (kN + FrozenChunks::kChunk - 1) / FrozenChunks::kChunk;
const DeviceVector<uint8_t> kMask = {0, 1, 0, 0, 1, 0, 0, 0, 0, 0};
const DeviceVector<int32_t> kMissed = {0, 2, 4, 0, 1, 3, 0, 0, 0, 0};
constexpr int64_t kUpdates = 5;

DeviceVector<uint8_t> random_codes(uint64_t seed) {
  const DeviceVector<float> r = random_values(kN, 0, 255.99f, seed);
  return DeviceVector<uint8_t>(r.begin(), r.end());
}

struct Arrays {
  DeviceVector<float> w = random_values(kN, -1, 1, 1), g = random_values(kN, -1, 1, 2);
  DeviceVector<uint8_t> codes_a = random_codes(3), codes_b = random_codes(4);  // momentum, or m and v
  DeviceVector<float> absmax_a = random_values(kBlocks, 0, 0.1f, 5), absmax_b = random_values(kBlocks, 0, 0.01f, 6);
  DeviceVector<int32_t> missed = kMissed;
  QuantizedState a() { return {codes_a.data(), absmax_a.data()}; }
  QuantizedState b() { return {codes_b.data(), absmax_b.data()}; }
  FrozenChunks frozen() { return {kMask.data(), missed.data()}; }
};

kernels::UpdateScalars update_scalars(int64_t updates, int32_t skip) {
  kernels::UpdateScalars scalars{};
  scalars.updates = updates;
  scalars.grad_scale = 0.5f;
  scalars.lr = 0.01f;
  scalars.skip = skip;
  return scalars;
}

void expect_same(const Arrays& got, const Arrays& want) {
  EXPECT_EQ(got.w, want.w);
  EXPECT_EQ(got.codes_a, want.codes_a);
  EXPECT_EQ(got.absmax_a, want.absmax_a);
  EXPECT_EQ(got.codes_b, want.codes_b);
  EXPECT_EQ(got.absmax_b, want.absmax_b);
  EXPECT_EQ(got.missed, want.missed);
}

void expect_frozen_untouched(const Arrays& got, const Arrays& initial, bool skipped) {
  for (int64_t i = 0; i < kN; ++i) {
    const int64_t block = i / FrozenChunks::kChunk;
    if (!skipped && !kMask[block]) continue;
    ASSERT_EQ(got.w[i], initial.w[i]) << "a frozen or skipped element moved at " << i;
    ASSERT_EQ(got.codes_a[i], initial.codes_a[i]) << i;
    ASSERT_EQ(got.codes_b[i], initial.codes_b[i]) << i;
    ASSERT_EQ(got.absmax_a[block], initial.absmax_a[block]) << block;
    ASSERT_EQ(got.absmax_b[block], initial.absmax_b[block]) << block;
  }
}

TEST(Optim8BitKernelsEmulated, BitwiseFile) { EXPECT_TRUE(compiled_bitwise("optim.cu")); }

TEST(Optim8BitKernelsEmulated, AdamWMatchesTheCpuLoop) {
  const Arrays initial;
  Arrays cpu = initial, emulated = initial;
  for (int64_t updates : {kUpdates, kUpdates + 1}) {
    DeviceValue<kernels::UpdateScalars> scalars(update_scalars(updates, 0));
    kernels::adamw_step_8bit_cpu(cpu.w.data(), cpu.g.data(), cpu.a(), cpu.b(), kN, 0.5f, 0.01f, 0.9f, 0.999f, 1e-8f,
                                 0.1f, updates, cpu.frozen());
    kernels::adamw_update_8bit_cuda(emulated.w.data(), emulated.g.data(), emulated.a(), emulated.b(), kN,
                                    scalars.get(), 0.9f, 0.999f, 1e-8f, 0.1f, emulated.frozen(), nullptr);
    expect_same(emulated, cpu);
  }
  EXPECT_NE(cpu.codes_a, initial.codes_a);
  EXPECT_NE(cpu.absmax_b, initial.absmax_b);
  expect_frozen_untouched(cpu, initial, false);
  for (std::size_t c = 0; c < kMask.size(); ++c) EXPECT_EQ(cpu.missed[c], kMissed[c] + 2 * kMask[c]) << c;

  const Arrays before_skip = emulated;
  DeviceValue<kernels::UpdateScalars> skip(update_scalars(kUpdates + 2, 1));
  kernels::adamw_update_8bit_cuda(emulated.w.data(), emulated.g.data(), emulated.a(), emulated.b(), kN, skip.get(),
                                  0.9f, 0.999f, 1e-8f, 0.1f, emulated.frozen(), nullptr);
  expect_same(emulated, before_skip);
}

TEST(Optim8BitKernelsEmulated, SgdMomentumMatchesTheCpuLoop) {
  const Arrays initial;
  Arrays cpu = initial, emulated = initial;
  for (int64_t updates : {kUpdates, kUpdates + 1}) {
    DeviceValue<kernels::UpdateScalars> scalars(update_scalars(updates, 0));
    kernels::sgd_step_8bit_cpu(cpu.w.data(), cpu.g.data(), cpu.a(), kN, 0.5f, 0.01f, 0.9f, 0.0f, true, 0.01f, updates,
                               cpu.frozen());
    kernels::sgd_update_8bit_cuda(emulated.w.data(), emulated.g.data(), emulated.a(), kN, scalars.get(), 0.9f, 0.0f,
                                  true, 0.01f, emulated.frozen(), nullptr);
    expect_same(emulated, cpu);
  }
  EXPECT_NE(cpu.codes_a, initial.codes_a);
  expect_frozen_untouched(cpu, initial, false);
}

}  // namespace
}  // namespace cumulus::testing
