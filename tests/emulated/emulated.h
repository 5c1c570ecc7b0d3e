// What the emulated kernel tests share: inputs, and comparisons against the CPU kernels' bits or a
// double-precision reference. Pointers handed to an emulated launcher are host pointers (the
// emulation runs a launch synchronously, on the CPU), so std::vector storage serves as device memory.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "cumulus/tensor/random.h"
#include "kernels/float16.h"

namespace cumulus::testing {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

inline std::vector<float> random_values(int64_t n, float lo, float hi, uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  Generator gen(seed);
  gen.fill_uniform(v.data(), n, lo, hi);
  return v;
}

// v stored as T (rounded to nearest even for 16 bits: Note [Half-precision conversions]).
template <typename T>
std::vector<T> stored_as(const std::vector<float>& v) {
  std::vector<T> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = kernels::from_f32<T>(v[i]);
  return out;
}

// The same bits, element by element (NaN included): where the CPU kernel fixes the order of every
// sum, the CUDA kernel's arithmetic must give exactly its results.
template <typename T>
void expect_same_bits(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(T)), 0)
        << what << " at " << i << ": " << kernels::to_f32(got[i]) << " vs " << kernels::to_f32(want[i]);
}

// |got - want| <= tol (1 + |want|) everywhere, NaN where the reference is NaN, an infinity of the
// same sign where it is one.
template <typename T>
void expect_close(const std::vector<T>& got, const std::vector<double>& want, const std::string& what,
                  double tol = 1e-5) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = kernels::to_f32(got[i]);
    if (std::isnan(want[i]) || std::isinf(want[i])) {
      ASSERT_TRUE(std::isnan(want[i]) ? std::isnan(g) : g == want[i]) << what << " at " << i << ": " << g;
      continue;
    }
    ASSERT_LE(std::abs(g - want[i]), tol * (1 + std::abs(want[i])))
        << what << " at " << i << ": " << g << " vs " << want[i];
  }
}

// The same values element by element: the same bits, except that a NaN matches any NaN (a NaN's
// sign and payload are no contract of ours, and a GPU's arithmetic makes its own).
template <typename T>
void expect_same_values(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const float g = kernels::to_f32(got[i]), w = kernels::to_f32(want[i]);
    if (std::isnan(w) && std::isnan(g)) continue;
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(T)), 0) << what << " at " << i << ": " << g << " vs " << w;
  }
}

template <typename T>
std::vector<double> as_double(const std::vector<T>& v) {
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = kernels::to_f32(v[i]);
  return out;
}

// |got - want| <= rel |want| + abs everywhere, NaN exactly where the reference is NaN, the same
// infinity where it is one: for results whose f32 sums run in another order than the reference's
// (rel: the roundings of the stored type, abs: what the order moves for inputs of order 1).
template <typename T>
void expect_within(const std::vector<T>& got, const std::vector<double>& want, double rel, double abs,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = kernels::to_f32(got[i]);
    if (std::isnan(want[i]) || std::isinf(want[i])) {
      ASSERT_TRUE(std::isnan(want[i]) ? std::isnan(g) : g == want[i]) << what << " at " << i << ": " << g;
      continue;
    }
    ASSERT_LE(std::abs(g - want[i]), rel * std::abs(want[i]) + abs)
        << what << " at " << i << ": " << g << " vs " << want[i];
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
