// CPU kernels of rms_norm (kernels/cpu/rms_norm_kernels.h): f32 rows through the vector rows
// (kernels/cpu/rms_norm_rows.h) where the CPU has AVX2 and FMA, else the scalar loops below, whose
// sums run in double.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/rms_norm_kernels.h"
#include "kernels/cpu/rms_norm_rows.h"
#include "kernels/cpu/vec_math.h"

namespace cumulus::kernels {

namespace {

float blend(float value, float beta, float old) { return beta == 0.0f ? value : value + beta * old; }

template <typename T>
void forward_row_scalar(const T* x, const float* weight, int64_t n, float eps, T* y, float* rstd) {
  double squares = 0.0;
  for (int64_t c = 0; c < n; ++c) squares += static_cast<double>(to_f32(x[c])) * to_f32(x[c]);
  const auto r = static_cast<float>(1.0 / std::sqrt(squares / static_cast<double>(n) + eps));
  *rstd = r;
  for (int64_t c = 0; c < n; ++c) {
    const float v = to_f32(x[c]) * r;
    y[c] = from_f32<T>(weight != nullptr ? v * weight[c] : v);
  }
}

template <typename T>
void grad_row_scalar(const T* x, const T* dy, const float* weight, float rstd, int64_t n, float beta, T* dx) {
  double gx = 0.0;
  for (int64_t c = 0; c < n; ++c)
    gx += static_cast<double>(to_f32(dy[c]) * (weight != nullptr ? weight[c] : 1.0f)) * to_f32(x[c]);
  const double r = rstd;
  const auto b = static_cast<float>(-r * r * r * gx / static_cast<double>(n));
  for (int64_t c = 0; c < n; ++c) {
    const float g = to_f32(dy[c]) * (weight != nullptr ? weight[c] : 1.0f);
    dx[c] = from_f32<T>(blend(rstd * g + b * to_f32(x[c]), beta, to_f32(dx[c])));
  }
}

// dweight down the rows in double per column, the columns split across threads in blocks that stay
// in the L1 cache; each column adds its rows in order, so the bits do not depend on the threads.
template <typename T>
void weight_grad_scalar(const T* x, const T* dy, const float* rstd, int64_t rows, int64_t cols, float beta_dw,
                        float* dweight) {
  constexpr int64_t kColumns = 256;
  parallel_for(cols, kColumns, [&](int64_t c0, int64_t c1) {
    for (int64_t b0 = c0; b0 < c1; b0 += kColumns) {
      const int64_t b1 = std::min(c1, b0 + kColumns);
      double sums[kColumns] = {};
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = b0; c < b1; ++c)
          sums[c - b0] += static_cast<double>(to_f32(dy[r * cols + c])) * (to_f32(x[r * cols + c]) * rstd[r]);
      for (int64_t c = b0; c < b1; ++c) dweight[c] = blend(static_cast<float>(sums[c - b0]), beta_dw, dweight[c]);
    }
  });
}

// Note [RMS norm's backward in one pass]
// As layer norm's (Note [Layer norm's backward in one pass] in structural.cpp): the row kernel adds
// each row's share of dweight in float over groups of kRowGroup rows on its way through x and dy,
// each group's partial sums then into a double sum per block of whole rows, and the blocks' sums
// in order at the end. The groups and blocks follow from the shape alone, so the bits do not depend
// on the thread count; the sums (at most kSumsBytes) are this kernel's own workspace.
void backward_one_pass_f32(const float* x, const float* dy, const float* weight, const float* rstd, int64_t rows,
                           int64_t cols, float beta, float* dx, float beta_dw, float* dweight) {
  const bool wide = vec512::available();
  const auto row = wide ? vec512::rms_norm_grad_row_f32 : vec::rms_norm_grad_row_f32;
  const auto add_sums = wide ? vec512::add_float_sums : vec::add_float_sums;
  constexpr int64_t kSumsBytes = int64_t{4} << 20, kRowGroup = 8;
  const int64_t max_blocks = std::clamp<int64_t>(kSumsBytes / (cols * int64_t{sizeof(double)}), 1, 64);
  const int64_t block_rows = std::max<int64_t>(grain_for(cols), (rows + max_blocks - 1) / max_blocks);
  const int64_t blocks = (rows + block_rows - 1) / block_rows;
  std::vector<double> sums(static_cast<std::size_t>(blocks * cols), 0.0);
  parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> partial(static_cast<std::size_t>(cols), 0.0f);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t first = b * block_rows, end = std::min(rows, first + block_rows);
      for (int64_t r = first; r < end; ++r) {
        row(x + r * cols, dy + r * cols, weight, rstd[r], cols, beta, dx + r * cols, partial.data());
        if ((r - first) % kRowGroup == kRowGroup - 1 || r == end - 1)
          add_sums(partial.data(), cols, sums.data() + b * cols);
      }
    }
  });
  for (int64_t b = 1; b < blocks; ++b)
    for (int64_t c = 0; c < cols; ++c)
      sums[static_cast<std::size_t>(c)] += sums[static_cast<std::size_t>(b * cols + c)];
  for (int64_t c = 0; c < cols; ++c)
    dweight[c] = blend(static_cast<float>(sums[static_cast<std::size_t>(c)]), beta_dw, dweight[c]);
}

}  // namespace

template <typename T>
void rms_norm_forward_cpu(const T* x, const float* weight, int64_t rows, int64_t cols, float eps, T* y, float* rstd) {
  bool vector = false;
  if constexpr (vec::kBuilt && std::is_same_v<T, float>) vector = vec::available();
  parallel_for(rows, grain_for(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      if constexpr (vec::kBuilt && std::is_same_v<T, float>) {
        if (vector) {
          const auto row = vec512::available() ? vec512::rms_norm_row_f32 : vec::rms_norm_row_f32;
          row(x + r * cols, weight, cols, eps, y + r * cols, rstd + r);
          continue;
        }
      }
      forward_row_scalar(x + r * cols, weight, cols, eps, y + r * cols, rstd + r);
    }
  });
}

template <typename T>
void rms_norm_backward_cpu(const T* x, const T* dy, const float* weight, const float* rstd, int64_t rows, int64_t cols,
                           float beta, T* dx, float beta_dw, float* dweight) {
  if (rows == 0 || cols == 0) {
    if (dweight != nullptr)
      for (int64_t c = 0; c < cols; ++c) dweight[c] = blend(0.0f, beta_dw, dweight[c]);
    return;
  }
  if constexpr (vec::kBuilt && std::is_same_v<T, float>) {
    if (vec::available()) {
      if (dx != nullptr && dweight != nullptr)
        return backward_one_pass_f32(x, dy, weight, rstd, rows, cols, beta, dx, beta_dw, dweight);
      if (dx != nullptr) {
        const auto row = vec512::available() ? vec512::rms_norm_grad_row_f32 : vec::rms_norm_grad_row_f32;
        parallel_for(rows, grain_for(cols), [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r)
            row(x + r * cols, dy + r * cols, weight, rstd[r], cols, beta, dx + r * cols, nullptr);
        });
        return;
      }
    }
  }
  if (dx != nullptr)
    parallel_for(rows, grain_for(cols), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        grad_row_scalar(x + r * cols, dy + r * cols, weight, rstd[r], cols, beta, dx + r * cols);
    });
  if (dweight != nullptr) weight_grad_scalar(x, dy, rstd, rows, cols, beta_dw, dweight);
}

#define CUMULUS_INSTANTIATE(T)                                                                                     \
  template void rms_norm_forward_cpu(const T*, const float*, int64_t, int64_t, float, T*, float*);                 \
  template void rms_norm_backward_cpu(const T*, const T*, const float*, const float*, int64_t, int64_t, float, T*, \
                                      float, float*);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
