// Elementwise ops and reductions on the CPU: plain loops the compiler vectorizes. Where beta is 0
// the destination is never read (it may hold stale values or NaN).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace cumulus::kernels {

namespace {
inline float blend(float value, float beta, float old) { return beta == 0.0f ? value : value + beta * old; }
}  // namespace

template <typename From, typename To>
void convert_cpu(const From* x, To* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = from_f32<To>(to_f32(x[i]));
}
template void convert_cpu(const float*, BFloat16*, int64_t);
template void convert_cpu(const float*, Half*, int64_t);
template void convert_cpu(const BFloat16*, float*, int64_t);
template void convert_cpu(const Half*, float*, int64_t);
template void convert_cpu(const BFloat16*, Half*, int64_t);
template void convert_cpu(const Half*, BFloat16*, int64_t);

void broadcast_rows_cpu(const float* row, int64_t rows, int64_t cols, float* out) {
  parallel_for(rows, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(cols, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) std::copy(row, row + cols, out + r * cols);
  });
}

// Across threads by blocks of columns: each column adds its rows in order, whoever sums it, so the
// bits are the same at any thread count. A block is a multiple of 16 columns (whole cache lines)
// holding about kParallelGrain elements.
void sum_rows_cpu(const float* x, int64_t rows, int64_t cols, float beta, float* out) {
  const int64_t block = std::max<int64_t>(16, (kParallelGrain / std::max<int64_t>(rows, 1) + 15) / 16 * 16);
  parallel_for(cols, block, [&](int64_t c0, int64_t c1) {
    if (beta == 0.0f) std::fill(out + c0, out + c1, 0.0f);
    else if (beta != 1.0f) for (int64_t c = c0; c < c1; ++c) out[c] *= beta;
    if constexpr (vec::kBuilt) {
      if (vec::available())
        return (vec512::available() ? vec512::column_sums_f32 : vec::column_sums_f32)(x + c0, rows, cols, out + c0,
                                                                                      c1 - c0);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      for (int64_t c = c0; c < c1; ++c) out[c] += xr[c];
    }
  });
}

void sum_all_cpu(const float* x, int64_t n, float scale, float* out) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  out[0] = static_cast<float>(s * scale);
}

// ReLU propagates NaN, as PyTorch's does: `x <= 0 ? 0 : x` is false for NaN, which passes through
// (`x > 0 ? x : 0` and fmax(x, 0) both turn it into 0 and hide a diverged model). Backward follows
// PyTorch's threshold rule on the output: 0 where y <= 0, dy elsewhere, NaN outputs included.
// A 16-bit value is stored as is where no arithmetic touches it (max(x, 0) and its mask either
// keep x or give 0), so the loops below need no rounding beyond the inputs' own.
// In f32 through the AVX2 or AVX-512 rows where the CPU has them: the baseline's 4-lane loop ran
// 1.6x slower from one build to the next with nothing but its place in the library changed (a
// [64, 512] forward 3.0 -> 4.7 us); the vector rows give the same bits (a compare and a select).
template <typename T>
void relu_forward_cpu(const T* x, T* y, int64_t n) {
  if constexpr (std::is_same_v<T, float> && vec::kBuilt) {
    if (vec::available()) return (vec512::available() ? vec512::relu_f32 : vec::relu_f32)(x, y, n);
  }
  for (int64_t i = 0; i < n; ++i) y[i] = to_f32(x[i]) <= 0.0f ? from_f32<T>(0.0f) : x[i];
}

template <typename T>
void relu_backward_cpu(const T* y, const T* dy, float beta, T* dx, int64_t n) {
  // Two loops rather than blend() per element: a branch on beta inside the loop keeps the
  // compiler from vectorizing it, and this runs over every activation of the model. In f32 the
  // first runs through the vector rows where the CPU has them: GCC compiles the loop to a branch
  // per element, mispredicted on every other sign ([16, 512]: 7% of the seed MLP's 16 x 4 epoch).
  if constexpr (std::is_same_v<T, float> && vec::kBuilt) {
    if (beta == 0.0f && vec::available())
      return (vec512::available() ? vec512::relu_grad_f32 : vec::relu_grad_f32)(y, dy, dx, n);
  }
  if (beta == 0.0f) {
    for (int64_t i = 0; i < n; ++i) dx[i] = to_f32(y[i]) <= 0.0f ? from_f32<T>(0.0f) : dy[i];
  } else {
    for (int64_t i = 0; i < n; ++i)
      dx[i] = from_f32<T>((to_f32(y[i]) <= 0.0f ? 0.0f : to_f32(dy[i])) + beta * to_f32(dx[i]));
  }
}

void fill_cpu(float* out, float value, int64_t n) { std::fill(out, out + n, value); }

void fill_from_scalar_cpu(const float* scalar, float scale, float beta, float* out, int64_t n) {
  const float v = scale * scalar[0];
  for (int64_t i = 0; i < n; ++i) out[i] = blend(v, beta, out[i]);
}

template <typename T>
void accumulate_cpu(const T* x, float beta, T* y, int64_t n) {
  if (beta == 0.0f) std::copy(x, x + n, y);
  else for (int64_t i = 0; i < n; ++i) y[i] = from_f32<T>(to_f32(x[i]) + beta * to_f32(y[i]));
}

template <typename T>
void argmax_rows_cpu(const T* x, int64_t rows, int64_t cols, int32_t* out) {
  for (int64_t r = 0; r < rows; ++r) out[r] = row_argmax(x + r * cols, cols);
}

#define CUMULUS_INSTANTIATE(T)                                                      \
  template void relu_forward_cpu(const T*, T*, int64_t);                            \
  template void relu_backward_cpu(const T*, const T*, float, T*, int64_t);          \
  template void accumulate_cpu(const T*, float, T*, int64_t);                       \
  template void argmax_rows_cpu(const T*, int64_t, int64_t, int32_t*);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
