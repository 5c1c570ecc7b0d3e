// cross_entropy over rows with ignored positions (kernels/cpu/loss_kernels.h).
#include <cmath>
#include <limits>

#include "kernels/cpu/cross_entropy_row.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/loss_kernels.h"

namespace cumulus::kernels {

template <typename T>
int64_t cross_entropy_rows_forward_cpu(const T* logits, const int32_t* labels, int64_t rows, int64_t classes,
                                       int64_t ignore_index, float scale, float* loss, float* row_loss,
                                       float* stats) {
  for (int64_t i = 0; i < rows; ++i) {
    const int32_t y = labels[i];
    if (y != ignore_index && (y < 0 || y >= classes)) return i;
  }
  double total = 0.0;
  for (int64_t i = 0; i < rows; ++i) {
    const int32_t y = labels[i];
    double l = 0.0;
    if (y != ignore_index) {
      const T* x = logits + i * classes;
      float m, log_sum;
      row_stats(x, classes, m, log_sum);
      l = static_cast<double>(m - to_f32(x[y])) + log_sum;
      if (stats != nullptr) stats[2 * i] = m, stats[2 * i + 1] = log_sum;
    }
    if (row_loss != nullptr) row_loss[i] = static_cast<float>(l);
    total += l;
  }
  if (row_loss == nullptr) loss[0] = static_cast<float>(total * scale);
  return -1;
}

template <typename T>
void cross_entropy_rows_backward_cpu(const T* logits, const int32_t* labels, int64_t rows, int64_t classes,
                                     int64_t ignore_index, const float* grad, int64_t grad_stride, float scale,
                                     float beta, T* dlogits, const float* stats) {
  for (int64_t i = 0; i < rows; ++i) {
    const T* x = logits + i * classes;
    T* dx = dlogits + i * classes;
    const int32_t y = labels[i];
    if (y == ignore_index) {
      for (int64_t j = 0; j < classes; ++j) dx[j] = from_f32<T>(beta == 0.0f ? 0.0f : beta * to_f32(dx[j]));
      continue;
    }
    const float g = scale * grad[i * grad_stride];
    float m, log_sum;
    if (stats != nullptr) m = stats[2 * i], log_sum = stats[2 * i + 1];
    else row_stats(x, classes, m, log_sum);
    row_grad(x, classes, y, m, log_sum, g, beta, dx);
  }
}

void indices_to_i32_cpu(const int64_t* in, int64_t n, int32_t* out) {
  constexpr int64_t lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max();
  for (int64_t i = 0; i < n; ++i)
    out[i] = in[i] >= lo && in[i] <= hi ? static_cast<int32_t>(in[i]) : std::numeric_limits<int32_t>::min();
}

#define CUMULUS_INSTANTIATE(T)                                                                                        \
  template int64_t cross_entropy_rows_forward_cpu(const T*, const int32_t*, int64_t, int64_t, int64_t, float, float*, \
                                                  float*, float*);                                                    \
  template void cross_entropy_rows_backward_cpu(const T*, const int32_t*, int64_t, int64_t, int64_t, const float*,    \
                                                int64_t, float, float, T*, const float*);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
