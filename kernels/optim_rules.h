// The per-element optimizer rules, shared by the CPU loop (kernels/cpu/optim.cpp) and the CUDA
// kernels (kernels/cuda/optim.cu), so both devices apply literally the same arithmetic.
#pragma once

#include <cmath>

#ifdef __CUDACC__
#define CUMULUS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define CUMULUS_HOST_DEVICE inline
#endif

namespace cumulus::kernels::rules {

// torch.optim.SGD: g = s*grad + wd*w; b = g (first) or mu*b + (1-dampening)*g;
// d = nesterov ? g + mu*b : b; w -= lr*d. `buf` is unused when momentum is 0.
CUMULUS_HOST_DEVICE void sgd(float& w, float grad, float* buf, float grad_scale, float lr, float momentum,
                             float dampening, bool nesterov, float weight_decay, bool first) {
  float g = grad_scale * grad + weight_decay * w;
  if (momentum != 0.0f) {
    const float b = first ? g : momentum * *buf + (1.0f - dampening) * g;
    *buf = b;
    g = nesterov ? g + momentum * b : b;
  }
  w -= lr * g;
}

// torch.optim.AdamW: w *= 1 - lr*wd; m, v moving averages; w -= step_size * m / (sqrt(v)/bc2_sqrt + eps)
// with step_size = lr / (1 - beta1^t) and bc2_sqrt = sqrt(1 - beta2^t).
CUMULUS_HOST_DEVICE void adamw(float& w, float grad, float& m, float& v, float grad_scale, float lr, float beta1,
                               float beta2, float eps, float weight_decay, float step_size, float bc2_sqrt) {
  const float g = grad_scale * grad;
  w *= 1.0f - lr * weight_decay;
  m = beta1 * m + (1.0f - beta1) * g;
  v = beta2 * v + (1.0f - beta2) * g * g;
  w -= step_size * m / (sqrtf(v) / bc2_sqrt + eps);
}

}  // namespace cumulus::kernels::rules
