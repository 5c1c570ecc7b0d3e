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

}  // namespace cumulus::testing
