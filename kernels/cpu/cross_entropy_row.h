// One logits row's statistics and gradient, shared by the CPU cross-entropy kernels
// (cross_entropy.cpp, the fused MLP's head; loss.cpp, the op's rows with ignored positions), so
// both give the same bits. An f32 row on a CPU with AVX2 (AVX-512: 16 lanes, another order of
// the double sum) goes through kernels/cpu/vec_math.h's vector exp (within 1.3 ulp, where the scalar rule's is glibc's double exp rounded and expf), so
// the loss and gradient may differ from the scalar rule's in their last bits; the sums stay in
// double, and the forward and the backward take the same row_stats, so they agree. The scalar
// rule (16-bit rows, CUMULUS_CPU_CAPABILITY=scalar) is unchanged.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/vec_math.h"
#include "kernels/float16.h"

namespace cumulus::kernels {

// Whether a row of T takes the vector functions.
template <typename T>
inline bool row_vectorized() {
  if constexpr (std::is_same_v<T, float> && vec::kBuilt) return vec::available();
  return false;
}

// The row maximum m and log sum_j exp(x_j - m). The two are kept apart: folding them into one
// float lse = m + log(s) would round away log(s) when |m| is large (1e3 and up).
template <typename T>
inline void row_stats(const T* x, int64_t n, float& max_out, float& log_sum_out) {
  if constexpr (std::is_same_v<T, float>) {
    if (row_vectorized<T>()) {
      const auto stats = vec512::available() ? vec512::cross_entropy_row_stats_f32 : vec::cross_entropy_row_stats_f32;
      return stats(x, n, &max_out, &log_sum_out);
    }
  }
  float m = to_f32(x[0]);
  for (int64_t j = 1; j < n; ++j) m = std::fmax(m, to_f32(x[j]));
  double s = 0.0;
  for (int64_t j = 0; j < n; ++j) s += std::exp(static_cast<double>(to_f32(x[j]) - m));
  max_out = m;
  log_sum_out = static_cast<float>(std::log(s));
}

// dx_j = g (softmax(x)_j - [j == label]) from the row's statistics, blended into dx with beta
// (dx not read when beta is 0).
template <typename T>
inline void row_grad(const T* x, int64_t n, int64_t label, float m, float log_sum, float g, float beta, T* dx) {
  if constexpr (std::is_same_v<T, float>) {
    if (row_vectorized<T>()) {
      const auto grad = vec512::available() ? vec512::cross_entropy_grad_row_f32 : vec::cross_entropy_grad_row_f32;
      return grad(x, n, label, m, log_sum, g, beta, dx);
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    const float v = g * (std::exp((to_f32(x[j]) - m) - log_sum) - (j == label ? 1.0f : 0.0f));
    dx[j] = from_f32<T>(beta == 0.0f ? v : v + beta * to_f32(dx[j]));
  }
}

}  // namespace cumulus::kernels
