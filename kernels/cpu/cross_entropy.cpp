// Softmax cross-entropy over integer labels.
//   forward:  loss = scale * sum_i ((m_i - x_i,y_i) + log sum_j exp(x_ij - m_i)), m_i = max_j x_ij
//   backward: dx_ij = scale * g * (softmax(x_i)_j - [j == y_i]); needs the logits and labels only.
// Logits and their gradient may be stored in 16 bits; the arithmetic and the loss are f32 (double
// for the sums), as Note [Mixed precision] in engine/ops/linear.cpp asks of losses and softmax.
#include <cmath>

#include "kernels/cpu/cross_entropy_row.h"
#include "kernels/cpu/kernels.h"

namespace cumulus::kernels {

template <typename T>
int64_t cross_entropy_forward_cpu(const T* logits, const int32_t* labels, int64_t batch, int64_t classes,
                                  float scale, float* loss) {
  double total = 0.0;
  for (int64_t i = 0; i < batch; ++i) {
    const int32_t y = labels[i];
    if (y < 0 || y >= classes) return i;
    const T* x = logits + i * classes;
    float m, log_sum;
    row_stats(x, classes, m, log_sum);
    total += static_cast<double>(m - to_f32(x[y])) + log_sum;
  }
  loss[0] = static_cast<float>(total * scale);
  return -1;
}

template <typename T>
void cross_entropy_backward_cpu(const T* logits, const int32_t* labels, int64_t batch, int64_t classes,
                                const float* grad_loss, float scale, float beta, T* dlogits) {
  const float g = scale * grad_loss[0];
  for (int64_t i = 0; i < batch; ++i) {
    const T* x = logits + i * classes;
    T* dx = dlogits + i * classes;
    float m, log_sum;
    row_stats(x, classes, m, log_sum);
    row_grad(x, classes, labels[i], m, log_sum, g, beta, dx);
  }
}

template <typename T>
void classification_tally_cpu(const T* logits, const int32_t* labels, int64_t rows, int64_t cols,
                              const float* batch_loss, ClassificationTotals* totals) {
  int64_t correct = 0;
  for (int64_t r = 0; r < rows; ++r) {
    correct += row_argmax(logits + r * cols, cols) == labels[r];  // argmax_rows_cpu's result
  }
  totals->loss_sum += static_cast<double>(*batch_loss);
  totals->correct += correct;
  totals->samples += rows;
  totals->batches += 1;
}

#define CUMULUS_INSTANTIATE(T)                                                                                \
  template int64_t cross_entropy_forward_cpu(const T*, const int32_t*, int64_t, int64_t, float, float*);      \
  template void cross_entropy_backward_cpu(const T*, const int32_t*, int64_t, int64_t, const float*, float,   \
                                           float, T*);                                                       \
  template void classification_tally_cpu(const T*, const int32_t*, int64_t, int64_t, const float*,           \
                                         ClassificationTotals*);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
