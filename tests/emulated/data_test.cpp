// The DataLoader's gather kernels (kernels/cuda/data.cu), the very source nvcc compiles, run on the CPU
// through tests/emulation/cuda_runtime.h against gather_batch_cpu's bits (x = u8 / 255.0f stored as
// T, y the labels) for f32, bf16 and f16 batches: with and without a shuffled order, a partial last
// batch, rows shorter and longer than a block and not a multiple of it, empty batches; the
// at-cursor gather over consecutive launches (the position advancing, ring slots wrapping, the
// arrival counter back at 0 after each). Nothing past the batch is written: every buffer is longer
// than the batch and its tail compared too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cuda/kernels.h"
#include "tests/emulated/emulated.h"

namespace cumulus::testing {
namespace {

using kernels::GatherCursor;

constexpr int64_t kBatch = 5;
constexpr int64_t kGuardRows = 1;  // a row past the batch in every output: written by nobody

// `samples` u8 images of `row` bytes holding every byte value, and a distinct label each.
struct Dataset {
  int64_t samples, row;
  std::vector<uint8_t> images;
  std::vector<int32_t> labels;
};

Dataset make_dataset(int64_t samples, int64_t row) {
  Dataset d{samples, row, std::vector<uint8_t>(static_cast<std::size_t>(samples * row)),
            std::vector<int32_t>(static_cast<std::size_t>(samples))};
  for (std::size_t i = 0; i < d.images.size(); ++i) d.images[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
  for (int64_t s = 0; s < samples; ++s) d.labels[s] = static_cast<int32_t>(1000 + 3 * s);
  return d;
}

std::vector<int32_t> shuffled_order(int64_t n) {
  std::vector<int32_t> order(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = static_cast<int32_t>(i);
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  return order;
}

// A batch's outputs for `rows` rows of `row`, and the guard row, filled with values no gather writes.
template <typename T>
struct Batch {
  Batch(int64_t rows, int64_t row)
      : x(static_cast<std::size_t>((rows + kGuardRows) * row), kernels::from_f32<T>(-7.0f)),
        y(static_cast<std::size_t>(rows + kGuardRows), -1) {}
  std::vector<T> x;
  std::vector<int32_t> y;
};

// gather_batch_cpu's batch: the reference.
template <typename T>
Batch<T> cpu_gather(const Dataset& d, const int32_t* order, int64_t start, int64_t count) {
  Batch<T> b(kBatch, d.row);
  kernels::gather_batch_cpu(d.images.data(), d.labels.data(), order, start, count, d.row, b.x.data(), b.y.data());
  return b;
}

template <typename T>
void expect_same_batch(const Batch<T>& got, const Batch<T>& want, const std::string& what) {
  expect_same_bits(got.x, want.x, what + ": x");
  expect_same_bits(got.y, want.y, what + ": y");
}

template <typename T>
class DataKernelsEmulated : public ::testing::Test {};
using Types = ::testing::Types<float, BFloat16, Half>;
TYPED_TEST_SUITE(DataKernelsEmulated, Types);

// Every batch of a 13-sample epoch (batches of 5, the last of 3), rows of 300 (six blocks of 256 for
// a full batch, the last partial) with and without a shuffled order, rows of 1 and of 0 (no pixels:
// the labels alone) shuffled; and an empty batch, which writes nothing.
TYPED_TEST(DataKernelsEmulated, GatherMatchesTheCpu) {
  using T = TypeParam;
  for (int64_t row : {300, 1, 0}) {
    const Dataset d = make_dataset(13, row);
    const std::vector<int32_t> order = shuffled_order(d.samples);
    for (const int32_t* o : {static_cast<const int32_t*>(nullptr), order.data()}) {
      if (!o && row != 300) continue;  // (each launch costs its 256 threads)
      for (int64_t start = 0; start < d.samples; start += kBatch) {
        const int64_t count = std::min(kBatch, d.samples - start);
        const std::string what =
            "row " + std::to_string(row) + ", start " + std::to_string(start) + (o ? ", shuffled" : "");
        Batch<T> b(kBatch, row);
        kernels::gather_batch_cuda(d.images.data(), d.labels.data(), o, start, count, row, b.x.data(), b.y.data(),
                                   nullptr);
        expect_same_batch(b, cpu_gather<T>(d, o, start, count), what);
      }
    }
  }
  const Dataset d = make_dataset(13, 300);
  Batch<T> b(kBatch, d.row);
  kernels::gather_batch_cuda(d.images.data(), d.labels.data(), nullptr, 4, 0, d.row, b.x.data(), b.y.data(), nullptr);
  expect_same_batch(b, Batch<T>(kBatch, d.row), "an empty batch");
}

// ring 0: the batch at position * batch_size of the dataset, shuffled, over the epoch's three batches
// (rows of 257: a full batch is six blocks, the last partial one; and rows of 0 pixels); the cursor
// moves one batch per launch, even for an empty batch, and its arrival counter is back at 0 after each.
TYPED_TEST(DataKernelsEmulated, GatherAtCursorWalksTheEpoch) {
  using T = TypeParam;
  for (int64_t row : {257, 0}) {
    const Dataset d = make_dataset(13, row);
    const std::vector<int32_t> order = shuffled_order(d.samples);
    GatherCursor cursor{0, 0, 0};
    for (int64_t p = 0; p < 4; ++p) {
      const int64_t count = std::max<int64_t>(0, std::min(kBatch, d.samples - p * kBatch));  // 5, 5, 3, 0
      SCOPED_TRACE("row " + std::to_string(row) + ", position " + std::to_string(p) + ", count " +
                   std::to_string(count));
      Batch<T> b(kBatch, d.row);
      kernels::gather_batch_at_cursor_cuda(d.images.data(), d.labels.data(), order.data(), &cursor, kBatch, 0, count,
                                           d.row, b.x.data(), b.y.data(), nullptr);
      expect_same_batch(b, cpu_gather<T>(d, order.data(), p * kBatch, count), "batch");
      EXPECT_EQ(cursor.position, p + 1);
      EXPECT_EQ(cursor.blocks_done, 0u);
      EXPECT_EQ(cursor.ring_slot, 0u) << "ring 0 leaves the slot alone";
    }
  }
}

// ring 3: a staging ring of three slots of five samples (no order), read at cursor->ring_slot over
// seven launches starting at position 40: the slots wrap twice, the position only counts, the last
// batch is partial (two rows of its slot).
TYPED_TEST(DataKernelsEmulated, GatherAtCursorCyclesTheRing) {
  using T = TypeParam;
  const int64_t ring = 3, row = 300;
  const Dataset staging = make_dataset(ring * kBatch, row);
  GatherCursor cursor{40, 0, 0};
  for (int64_t launch = 0; launch < 7; ++launch) {
    const int64_t slot = launch % ring, count = launch == 6 ? 2 : kBatch;
    SCOPED_TRACE("launch " + std::to_string(launch) + ", slot " + std::to_string(slot));
    ASSERT_EQ(cursor.ring_slot, static_cast<uint32_t>(slot));
    Batch<T> b(kBatch, row);
    kernels::gather_batch_at_cursor_cuda(staging.images.data(), staging.labels.data(), nullptr, &cursor, kBatch, ring,
                                         count, row, b.x.data(), b.y.data(), nullptr);
    expect_same_batch(b, cpu_gather<T>(staging, nullptr, slot * kBatch, count), "batch");
    EXPECT_EQ(cursor.position, 40 + launch + 1);
    EXPECT_EQ(cursor.blocks_done, 0u);
    EXPECT_EQ(cursor.ring_slot, static_cast<uint32_t>((slot + 1) % ring));
  }
}

}  // namespace
}  // namespace cumulus::testing
