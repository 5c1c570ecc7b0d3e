// What the emulated kernel tests share: device buffers, inputs, and comparisons against the CPU
// kernels' bits or a double-precision reference. A pointer a kernel receives must be in the
// emulation's device arena (the launch throws otherwise), so buffers handed to launchers are
// DeviceVector: a std::vector whose storage is the arena's, readable on the host as any vector
// (the emulation runs a launch synchronously, on the CPU).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_runtime.h>  // the emulation's (tests/emulation): its device arena

#include "cumulus/tensor/dtype.h"
#include "cumulus/tensor/random.h"
#include "kernel_names.h"  // generated: kCudaBitwiseFiles
#include "kernels/float16.h"

namespace cumulus::testing {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Allocates from the emulation's device arena (cuda_emulation::device_allocate).
template <typename T>
struct DeviceAllocator {
  using value_type = T;
  DeviceAllocator() = default;
  template <typename U>
  DeviceAllocator(const DeviceAllocator<U>&) {}  // NOLINT: rebinding, as std::allocator's
  T* allocate(std::size_t n) { return static_cast<T*>(cuda_emulation::device_allocate(n * sizeof(T))); }
  void deallocate(T* p, std::size_t) { cuda_emulation::device_free(p); }
  template <typename U>
  bool operator==(const DeviceAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const DeviceAllocator<U>&) const {
    return false;
  }
};

// A buffer a kernel may be given: a vector in device memory.
template <typename T>
using DeviceVector = std::vector<T, DeviceAllocator<T>>;

// One value in device memory: a scalar or a structure that a kernel reads or updates in place.
template <typename T>
class DeviceValue {
 public:
  explicit DeviceValue(const T& value = T()) : storage_(1, value) {}
  T* get() { return storage_.data(); }
  const T* get() const { return storage_.data(); }
  T& operator*() { return storage_[0]; }
  const T& operator*() const { return storage_[0]; }
  T* operator->() { return storage_.data(); }
  const T* operator->() const { return storage_.data(); }

 private:
  DeviceVector<T> storage_;
};

// A host vector's values in device memory.
template <typename T>
DeviceVector<T> on_device(const std::vector<T>& v) {
  return DeviceVector<T>(v.begin(), v.end());
}

// A device vector's values in host memory (for comparisons with std::vector results).
template <typename T>
std::vector<T> on_host(const DeviceVector<T>& v) {
  return std::vector<T>(v.begin(), v.end());
}

inline DeviceVector<float> random_values(int64_t n, float lo, float hi, uint64_t seed) {
  DeviceVector<float> v(static_cast<std::size_t>(n));
  Generator gen(seed);
  gen.fill_uniform(v.data(), n, lo, hi);
  return v;
}

// v stored as T (rounded to nearest even for 16 bits: Note [Half-precision conversions]).
template <typename T, typename Floats>
DeviceVector<T> stored_as(const Floats& v) {
  DeviceVector<T> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = kernels::from_f32<T>(v[i]);
  return out;
}

// The storage types a templated launcher is instantiated for, for typed tests named after them
// (TYPED_TEST_SUITE(Suite, StorageTypes, StorageTypeName)).
using StorageTypes = ::testing::Types<float, BFloat16, Half>;
struct StorageTypeName {
  template <typename T>
  static std::string GetName(int) {
    return dtype_name(dtype_of<T>::value);
  }
};

// v with one value every `stride` elements (from `first`) replaced by a value that elementwise
// rules and conversions must get right: NaN of both signs and a signalling one, infinities, signed
// zeros, an f32 subnormal, f16's largest finite value and its overflow threshold, bf16 ties (1 +
// 2^-8 rounds down to even, 1 + 3 * 2^-8 up) and an f16 subnormal tie (2^-25 rounds to 0).
inline DeviceVector<float> with_specials(DeviceVector<float> v, std::size_t stride = 7, std::size_t first = 0) {
  const uint32_t signalling = 0x7F800001u;
  float snan;
  std::memcpy(&snan, &signalling, sizeof snan);
  const float specials[] = {kNaN,    -kNaN,    kInf,      -kInf,     -0.0f,    0.0f, 1e-40f,
                            65504.f, -65520.f, 0x1.01p0f, 0x1.03p0f, 0x1p-25f, snan};
  constexpr std::size_t count = sizeof(specials) / sizeof(specials[0]);
  for (std::size_t i = first, k = 0; i < v.size(); i += stride, ++k) v[i] = specials[k % count];
  return v;
}

// x widened to f32 (exact for every T).
template <typename Values>
DeviceVector<float> widened(const Values& x) {
  DeviceVector<float> out;
  out.reserve(x.size());
  for (const auto& v : x) out.push_back(kernels::to_f32(v));
  return out;
}

// rows x cols values in {0, 1, 2, 3}, so most rows have tied maxima, stored as T; with 6 rows and
// 3 columns or more, the first rows hold NaN first, NaN in the middle, all NaN, +inf last, all -inf,
// and -0 before +0 (equal) as their maximum: the cases an argmax rule must settle.
template <typename T>
DeviceVector<T> tied_rows(int64_t rows, int64_t cols, uint64_t seed) {
  auto x = random_values(rows * cols, 0, 4, seed);
  for (float& v : x) v = std::floor(v);
  auto row = [&](int64_t r) { return x.begin() + r * cols; };
  if (rows >= 6 && cols >= 3) {
    row(0)[0] = kNaN;
    row(1)[cols / 2] = kNaN;
    std::fill(row(2), row(3), kNaN);
    row(3)[cols - 1] = kInf;
    std::fill(row(4), row(5), -kInf);
    std::fill(row(5), row(6), -1.0f);
    row(5)[1] = -0.0f;
    row(5)[2] = 0.0f;
  }
  return stored_as<T>(x);
}

// The same bits, element by element (NaN included): where the CPU kernel fixes the order of every
// sum, the CUDA kernel's arithmetic must give exactly its results.
template <typename Got, typename Want>
void expect_same_bits(const Got& got, const Want& want, const std::string& what) {
  using T = typename Got::value_type;
  static_assert(std::is_same<T, typename Want::value_type>::value, "the same storage type");
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(T)), 0)
        << what << " at " << i << ": " << kernels::to_f32(got[i]) << " vs " << kernels::to_f32(want[i]);
}

// The same values element by element: the same bits, except that a NaN matches any NaN (a NaN's
// sign and payload are no contract of ours, and a GPU's arithmetic makes its own).
template <typename Got, typename Want>
void expect_same_values(const Got& got, const Want& want, const std::string& what) {
  using T = typename Got::value_type;
  static_assert(std::is_same<T, typename Want::value_type>::value, "the same storage type");
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const float g = kernels::to_f32(got[i]), w = kernels::to_f32(want[i]);
    if (std::isnan(w) && std::isnan(g)) continue;
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(T)), 0) << what << " at " << i << ": " << g << " vs " << w;
  }
}

template <typename Values>
std::vector<double> as_double(const Values& v) {
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = kernels::to_f32(v[i]);
  return out;
}

// |got - want| <= rel |want| + abs everywhere, NaN exactly where the reference is NaN, the same
// infinity where it is one: for results whose f32 sums run in another order than the reference's
// (rel: the roundings of the stored type, abs: what the order moves for inputs of order 1).
// |got - want| <= rel |want| + abs[i] everywhere, NaN exactly where the reference is NaN, the same
// infinity where it is one: expect_within with a bound of its own for each element.
template <typename Got>
void expect_within_each(const Got& got, const std::vector<double>& want, double rel, const std::vector<double>& abs,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = kernels::to_f32(got[i]);
    if (std::isnan(want[i]) || std::isinf(want[i])) {
      ASSERT_TRUE(std::isnan(want[i]) ? std::isnan(g) : g == want[i]) << what << " at " << i << ": " << g;
      continue;
    }
    ASSERT_LE(std::abs(g - want[i]), rel * std::abs(want[i]) + abs[i])
        << what << " at " << i << ": " << g << " vs " << want[i];
  }
}

// |got - want| <= rel |want| + abs everywhere, NaN exactly where the reference is NaN, the same
// infinity where it is one: for results whose f32 sums run in another order than the reference's
// (rel: the roundings of the stored type, abs: what the order moves for inputs of order 1).
template <typename Got>
void expect_within(const Got& got, const std::vector<double>& want, double rel, double abs, const std::string& what) {
  expect_within_each(got, want, rel, std::vector<double>(want.size(), abs), what);
}

// |got - want| <= tol (1 + |want|): expect_within with the same relative and absolute tolerance.
template <typename Got>
void expect_close(const Got& got, const std::vector<double>& want, const std::string& what, double tol = 1e-5) {
  expect_within(got, want, tol, tol, what);
}

// Whether kernels/cuda/`file` (as "optim.cu") is compiled without contraction into FMAs, so that its
// CPU parity holds bit for bit (CUMULUS_CUDA_BITWISE_FILES; nvcc --fmad=false in the CUDA build).
inline bool compiled_bitwise(const std::string& file) {
  return std::string(kCudaBitwiseFiles).find(";" + file + ";") != std::string::npos;
}

// An FMA skips the rounding of its product: for the products of order 1 to 4 these tests make, that
// moves a result by at most 2^-22 (2.4e-7) whatever the cancellation after it; 1e-6 allows a few.
constexpr double kContractionAbs = 1e-6;

enum class Exact { bits, values };

// A CUDA kernel's results against its CPU twin's: exactly (bits, or values with any NaN matching any
// NaN) where `file` is compiled bitwise; otherwise within rel |want| + abs, as on a GPU whose
// nvcc contracts a * b + c into an FMA (one rounding where the CPU has two).
template <typename Got, typename Want>
void expect_cpu_parity(const std::string& file, const Got& got, const Want& want, double rel, double abs,
                       const std::string& what, Exact exact = Exact::bits) {
  if (!compiled_bitwise(file)) {
    expect_within(got, as_double(want), rel, abs, what + " (contracted)");
  } else if (exact == Exact::bits) {
    expect_same_bits(got, want, what);
  } else {
    expect_same_values(got, want, what);
  }
}

// One rounding of T relative to the value: T keeps 23, 10 or 7 fraction bits, so a unit in the last
// place is at most 2^-23, 2^-10 or 2^-7 of it. Two results that differ before their last rounding by
// far less than that differ after it by at most this much.
template <typename T>
constexpr double unit_rounding() {
  return std::is_same<T, float>::value ? 1.0 / (1 << 23) : std::is_same<T, Half>::value ? 1.0 / 1024 : 1.0 / 128;
}

}  // namespace cumulus::testing
