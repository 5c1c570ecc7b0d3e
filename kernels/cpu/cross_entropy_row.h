// One logits row's statistics, shared by the CPU cross-entropy kernels (cross_entropy.cpp, the
// fused MLP's head; loss.cpp, the op's rows with ignored positions), so both give the same bits.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/float16.h"

namespace cumulus::kernels {

// The row maximum m and log sum_j exp(x_j - m). The two are kept apart: folding them into one
// float lse = m + log(s) would round away log(s) when |m| is large (1e3 and up).
template <typename T>
inline void row_stats(const T* x, int64_t n, float& max_out, float& log_sum_out) {
  float m = to_f32(x[0]);
  for (int64_t j = 1; j < n; ++j) m = std::fmax(m, to_f32(x[j]));
  double s = 0.0;
  for (int64_t j = 0; j < n; ++j) s += std::exp(static_cast<double>(to_f32(x[j]) - m));
  max_out = m;
  log_sum_out = static_cast<float>(std::log(s));
}

}  // namespace cumulus::kernels
