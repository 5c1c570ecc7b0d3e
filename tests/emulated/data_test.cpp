// The DataLoader's row gather (kernels/cuda/data.cu), the very source nvcc compiles, run on the CPU
// through tests/emulation/cuda_runtime.h against gather_rows_cpu's bytes, and gather_rows_cpu
// against a reference written out here, for f32, bf16 and f16 batches. One gather carries eight
// tensors (the most it takes): u8 pixels scaled by 1/255 into the batch type (the image path), i32
// labels, i64 and f32 rows copied in units of 8 bytes, u8 rows of 7 and 6 bytes (units of 1 and 2),
// f32 rows converted to the batch type and i64 rows converted with a divisor of 2; another gather
// has a source one byte off alignment (unit 1 whatever the row) and rows of no elements. With and
// without a shuffled order, a partial last batch, an empty batch; the at-cursor gather over
// consecutive launches (the position advancing, ring slots wrapping, the arrival counter back at 0
// after each). Nothing past the batch is written: every output is a row longer than the batch and
// its tail compared too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cuda/kernels.h"
#include "tests/emulated/emulated.h"

namespace cumulus::testing {
namespace {

using kernels::GatherColumn;
using kernels::GatherColumns;
using kernels::GatherCursor;

constexpr int64_t kBatch = 5;
constexpr int64_t kGuardRows = 1;  // a row past the batch in every output: written by nobody
constexpr uint8_t kUnwritten = 0xA5;

// One dataset tensor of `samples` rows and its batch buffer.
struct Column {
  DType src_type, dst_type;
  int64_t row;
  float divisor;
  std::size_t misalign;      // bytes the source starts past its buffer's (aligned) start
  DeviceVector<uint8_t> src;  // misalign + samples * row elements
  DeviceVector<uint8_t> dst;  // (kBatch + kGuardRows) * row elements, kUnwritten
};

// Values every type must carry exactly: every byte value, i64s past 2^53 and negative, f32
// specials; the converting i64 column holds values whose f32 rounding matters.
Column make_column(DType src_type, DType dst_type, int64_t row, float divisor, int64_t samples,
                   std::size_t misalign = 0) {
  Column c{src_type, dst_type, row, divisor, misalign, {}, {}};
  const int64_t n = samples * row;
  c.src.assign(misalign + static_cast<std::size_t>(n) * dtype_size(src_type), 0);
  uint8_t* p = c.src.data() + misalign;
  const DeviceVector<float> f = with_specials(random_values(n, -1e6f, 1e6f, 3 + static_cast<uint64_t>(row)));
  for (int64_t i = 0; i < n; ++i) {
    if (src_type == DType::u8) p[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
    if (src_type == DType::i32) {
      const auto v = static_cast<int32_t>(1000 + 3 * i);
      std::memcpy(p + 4 * i, &v, 4);
    }
    if (src_type == DType::i64) {
      const int64_t v = (i % 2 ? -1 : 1) * ((int64_t{1} << 53) + 1 + 977 * i);
      std::memcpy(p + 8 * i, &v, 8);
    }
    if (src_type == DType::f32) std::memcpy(p + 4 * i, &f[static_cast<std::size_t>(i)], 4);
  }
  c.dst.assign(static_cast<std::size_t>((kBatch + kGuardRows) * row) * dtype_size(dst_type), kUnwritten);
  return c;
}

GatherColumns columns_of(std::vector<Column>& cols) {
  GatherColumns g{};
  g.count = static_cast<int32_t>(cols.size());
  for (std::size_t k = 0; k < cols.size(); ++k) {
    Column& c = cols[k];
    g.column[k] = {c.src.data() + c.misalign, c.dst.data(), c.row, c.src_type, c.dst_type, c.divisor};
  }
  return g;
}

// The eight-tensor dataset of a T batch, and the misaligned / empty-row one.
template <typename T>
std::vector<Column> wide_dataset(int64_t samples) {
  const DType t = dtype_of<T>::value;
  return {make_column(DType::u8, t, 300, 255.0f, samples),    make_column(DType::i32, DType::i32, 1, 1, samples),
          make_column(DType::i64, DType::i64, 3, 1, samples), make_column(DType::f32, DType::f32, 10, 1, samples),
          make_column(DType::u8, DType::u8, 7, 1, samples),   make_column(DType::u8, DType::u8, 6, 1, samples),
          make_column(DType::f32, t, 3, 1, samples),          make_column(DType::i64, t, 2, 2.0f, samples)};
}
template <typename T>
std::vector<Column> odd_dataset(int64_t samples) {
  return {make_column(DType::u8, DType::u8, 8, 1, samples, /*misalign=*/1),
          make_column(DType::i32, DType::i32, 0, 1, samples),
          make_column(DType::u8, dtype_of<T>::value, 0, 255.0f, samples)};
}

// The batch written out: row r from sample order[start + r]; copies byte for byte, conversions as
// float(v) / divisor rounded once to T.
template <typename T>
std::vector<DeviceVector<uint8_t>> reference(const std::vector<Column>& cols, const int32_t* order, int64_t start,
                                             int64_t count) {
  std::vector<DeviceVector<uint8_t>> out;
  for (const Column& c : cols) {
    DeviceVector<uint8_t> d(c.dst.size(), kUnwritten);
    const uint8_t* src = c.src.data() + c.misalign;
    for (int64_t r = 0; r < count; ++r) {
      const int64_t s = order ? order[start + r] : start + r;
      for (int64_t e = 0; e < c.row; ++e) {
        if (c.src_type == c.dst_type && c.divisor == 1.0f) {
          const std::size_t size = dtype_size(c.src_type);
          std::memcpy(&d[(r * c.row + e) * size], src + (s * c.row + e) * size, size);
          continue;
        }
        float v = 0;
        if (c.src_type == DType::u8) v = static_cast<float>(src[s * c.row + e]);
        if (c.src_type == DType::f32) std::memcpy(&v, src + 4 * (s * c.row + e), 4);
        if (c.src_type == DType::i64) {
          int64_t i = 0;
          std::memcpy(&i, src + 8 * (s * c.row + e), 8);
          v = static_cast<float>(i);
        }
        const T stored = kernels::from_f32<T>(v / c.divisor);
        std::memcpy(&d[static_cast<std::size_t>(r * c.row + e) * sizeof(T)], &stored, sizeof(T));
      }
    }
    out.push_back(std::move(d));
  }
  return out;
}

void reset(std::vector<Column>& cols) {
  for (Column& c : cols) std::fill(c.dst.begin(), c.dst.end(), kUnwritten);
}

void expect_outputs(const std::vector<Column>& cols, const std::vector<DeviceVector<uint8_t>>& want,
                    const std::string& what) {
  for (std::size_t k = 0; k < cols.size(); ++k)
    expect_same_bits(cols[k].dst, want[k], what + ", tensor " + std::to_string(k));
}

DeviceVector<int32_t> shuffled_order(int64_t n) {
  DeviceVector<int32_t> order(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = static_cast<int32_t>(i);
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  return order;
}

template <typename T>
class DataKernelsEmulated : public ::testing::Test {};
TYPED_TEST_SUITE(DataKernelsEmulated, StorageTypes, StorageTypeName);

// Every batch of a 13-sample epoch (batches of 5, the last of 3) with and without a shuffled order:
// the CPU loop against the reference, the CUDA kernel against the CPU loop; then an empty batch.
TYPED_TEST(DataKernelsEmulated, GatherMatchesTheCpu) {
  using T = TypeParam;
  const int64_t samples = 13;
  const DeviceVector<int32_t> order = shuffled_order(samples);
  for (const bool wide : {true, false}) {
    std::vector<Column> cols = wide ? wide_dataset<T>(samples) : odd_dataset<T>(samples);
    const GatherColumns g = columns_of(cols);
    for (const int32_t* o : {static_cast<const int32_t*>(nullptr), order.data()}) {
      for (int64_t start = 0; start < samples; start += kBatch) {
        const int64_t count = std::min(kBatch, samples - start);
        const std::string what =
            std::string(wide ? "wide" : "odd") + ", start " + std::to_string(start) + (o ? ", shuffled" : "");
        const auto want = reference<T>(cols, o, start, count);
        reset(cols);
        kernels::gather_rows_cpu(g, o, start, count);
        expect_outputs(cols, want, what + " (cpu)");
        reset(cols);
        kernels::gather_rows_cuda(g, o, start, count, nullptr);
        expect_outputs(cols, want, what + " (cuda)");
      }
    }
  }
  std::vector<Column> cols = wide_dataset<T>(samples);
  kernels::gather_rows_cuda(columns_of(cols), nullptr, 4, 0, nullptr);
  expect_outputs(cols, reference<T>(cols, nullptr, 4, 0), "an empty batch");
}

// ring 0: the batch at position * batch_size, shuffled, over the epoch's three batches and one
// empty one past it; the cursor moves one batch per launch, even for the empty batch, and its
// arrival counter is back at 0 after each. Also with rows of no elements only (a one-block grid).
TYPED_TEST(DataKernelsEmulated, GatherAtCursorWalksTheEpoch) {
  using T = TypeParam;
  const int64_t samples = 13;
  const DeviceVector<int32_t> order = shuffled_order(samples);
  for (const bool wide : {true, false}) {
    std::vector<Column> cols = wide ? wide_dataset<T>(samples) : odd_dataset<T>(samples);
    if (!wide) cols.erase(cols.begin());  // rows of 0 elements only
    DeviceValue<GatherCursor> cursor(GatherCursor{0, 0, 0});
    for (int64_t p = 0; p < 4; ++p) {
      const int64_t count = std::max<int64_t>(0, std::min(kBatch, samples - p * kBatch));  // 5, 5, 3, 0
      SCOPED_TRACE(std::string(wide ? "wide" : "empty rows") + ", position " + std::to_string(p));
      const auto want = reference<T>(cols, order.data(), p * kBatch, count);
      reset(cols);
      kernels::gather_rows_at_cursor_cuda(columns_of(cols), order.data(), cursor.get(), kBatch, 0, count, nullptr);
      expect_outputs(cols, want, "batch");
      EXPECT_EQ(cursor->position, p + 1);
      EXPECT_EQ(cursor->blocks_done, 0u);
      EXPECT_EQ(cursor->ring_slot, 0u) << "ring 0 leaves the slot alone";
    }
  }
}

// ring 3: a staging ring of three slots of five samples per tensor (no order), read at the
// cursor->ring_slot the host sets before each of seven launches starting at position 40, in an
// order that is not a cycle: the gather reads the slot it is told and leaves it, the position only
// counts, the last batch is partial (two rows of its slot).
TYPED_TEST(DataKernelsEmulated, GatherAtCursorReadsTheSlotTheHostSets) {
  using T = TypeParam;
  const int64_t ring = 3;
  std::vector<Column> cols = wide_dataset<T>(ring * kBatch);
  DeviceValue<GatherCursor> cursor(GatherCursor{40, 0, 0});
  const int64_t slots[] = {0, 2, 2, 1, 0, 1, 2};
  for (int64_t launch = 0; launch < 7; ++launch) {
    const int64_t slot = slots[launch], count = launch == 6 ? 2 : kBatch;
    SCOPED_TRACE("launch " + std::to_string(launch) + ", slot " + std::to_string(slot));
    kernels::set_gather_cursor_cuda(cursor.get(), -1, slot, nullptr);
    ASSERT_EQ(cursor->position, 40 + launch) << "a negative position leaves it";
    const auto want = reference<T>(cols, nullptr, slot * kBatch, count);
    reset(cols);
    kernels::gather_rows_at_cursor_cuda(columns_of(cols), nullptr, cursor.get(), kBatch, ring, count, nullptr);
    expect_outputs(cols, want, "batch");
    EXPECT_EQ(cursor->position, 40 + launch + 1);
    EXPECT_EQ(cursor->blocks_done, 0u);
    EXPECT_EQ(cursor->ring_slot, static_cast<uint32_t>(slot));
  }
  kernels::set_gather_cursor_cuda(cursor.get(), 3, -1, nullptr);
  EXPECT_EQ(cursor->position, 3);
  EXPECT_EQ(cursor->ring_slot, 2u) << "a negative slot leaves it";
}

}  // namespace
}  // namespace cumulus::testing
