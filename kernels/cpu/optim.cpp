// Optimizer updates over one flat array (DESIGN.md, decision 8): one pass, the gradient scaled by
// grad_scale (normalization and clipping folded in) as it is read. The rules are PyTorch's; see
// engine/include/cumulus/optim/sgd.h and adamw.h.
#include <cmath>

#include "kernels/cpu/kernels.h"

namespace cumulus::kernels {

double sum_squares_cpu(const float* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

void sgd_step_cpu(float* w, const float* grad, float* buf, int64_t n, float grad_scale, float lr,
                  float momentum, float dampening, bool nesterov, float weight_decay, bool first) {
  for (int64_t i = 0; i < n; ++i) {
    float g = grad_scale * grad[i] + weight_decay * w[i];
    if (momentum != 0.0f) {
      const float b = first ? g : momentum * buf[i] + (1.0f - dampening) * g;
      buf[i] = b;
      g = nesterov ? g + momentum * b : b;
    }
    w[i] -= lr * g;
  }
}

void adamw_step_cpu(float* w, const float* grad, float* m, float* v, int64_t n, float grad_scale,
                    float lr, float beta1, float beta2, float eps, float weight_decay,
                    float bias_correction1, float bias_correction2) {
  const float step_size = lr / bias_correction1;
  const float bc2_sqrt = std::sqrt(bias_correction2);
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad_scale * grad[i];
    w[i] *= 1.0f - lr * weight_decay;
    m[i] = beta1 * m[i] + (1.0f - beta1) * g;
    v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
    w[i] -= step_size * m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps);
  }
}

}  // namespace cumulus::kernels
