// batch_norm2d on the CPU: plain loops, statistics accumulated in double. Per channel over the
// m = n * hw values of x [n, c, hw]:
//   mean = sum x / m,  var = sum (x - mean)^2 / m (biased: used to normalize),
//   x_hat = (x - mean) * invstd, invstd = 1 / sqrt(var + eps),  y = gamma * x_hat + beta.
// Backward needs x, gamma and the saved mean and invstd (never x_hat: it is recomputed):
//   dbeta = sum dy,  dgamma = sum dy * x_hat,
//   dx = gamma * invstd * (dy - dbeta / m - x_hat * dgamma / m)   (batch statistics)
//   dx = gamma * invstd * dy                                    (running statistics: constants)
// The sums are formed before anything is written, so accumulating into dgamma / dbeta (beta 1)
// does not disturb dx. x, y, dy and dx may be stored in 16 bits (T: float, BFloat16, Half); the
// arithmetic and everything per channel are f32 (double for the sums).
#include <cmath>

#include "kernels/cpu/conv_kernels.h"

namespace cumulus::kernels {

namespace {

inline float blend(float value, float beta, float old) { return beta == 0.0f ? value : value + beta * old; }

// Sums over one plane of `n` values in 8 float lanes (the compiler vectorizes them; a single
// double accumulator would serialize the loop), returned in double: planes are short (H*W), and
// the sum over planes is taken in double by the callers.
constexpr int kLanes = 8;

template <typename T>
double plane_sum(const T* p, int64_t n) {
  float acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += to_f32(p[j + l]);
  double s = 0.0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  for (; j < n; ++j) s += to_f32(p[j]);
  return s;
}

// sum (p - mean)^2
template <typename T>
double plane_squared_deviation(const T* p, int64_t n, float mean) {
  float acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float d = to_f32(p[j + l]) - mean;
      acc[l] += d * d;
    }
  double s = 0.0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  for (; j < n; ++j) s += static_cast<double>(to_f32(p[j]) - mean) * (to_f32(p[j]) - mean);
  return s;
}

// y = (x - mean) * scale + beta over channel ch: centred first, so that a channel near its mean
// keeps its precision (x * scale + (beta - mean * scale) cancels when the mean is large against
// beta, and a constant channel would not come out as beta).
template <typename T>
void normalize_channel(const T* x, int64_t n, int64_t c, int64_t hw, int64_t ch, float mean, float scale, float beta,
                       T* y) {
  for (int64_t i = 0; i < n; ++i) {
    const T* p = x + (i * c + ch) * hw;
    T* q = y + (i * c + ch) * hw;
    for (int64_t j = 0; j < hw; ++j) q[j] = from_f32<T>((to_f32(p[j]) - mean) * scale + beta);
  }
}

// sum g and sum g * (p - mean), added to *sum_g and *sum_gd.
template <typename T>
void plane_grad_sums(const T* p, const T* g, int64_t n, float mean, double* sum_g, double* sum_gd) {
  float a[kLanes] = {}, b[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      a[l] += to_f32(g[j + l]);
      b[l] += to_f32(g[j + l]) * (to_f32(p[j + l]) - mean);
    }
  double sa = 0.0, sb = 0.0;
  for (int l = 0; l < kLanes; ++l) sa += a[l], sb += b[l];
  for (; j < n; ++j) sa += to_f32(g[j]), sb += static_cast<double>(to_f32(g[j])) * (to_f32(p[j]) - mean);
  *sum_g += sa;
  *sum_gd += sb;
}

}  // namespace

template <typename T>
void batch_norm_forward_training_cpu(const T* x, const float* gamma, const float* beta, int64_t n, int64_t c,
                                     int64_t hw, float eps, float momentum, float* running_mean, float* running_var,
                                     T* y, float* save_mean, float* save_invstd) {
  const double m = static_cast<double>(n * hw);
  for (int64_t ch = 0; ch < c; ++ch) {
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += plane_sum(x + (i * c + ch) * hw, hw);
    const double mean = s / m;
    const float fmean = static_cast<float>(mean);
    double ss = 0.0;  // two passes: no cancellation when the mean is large against the spread
    for (int64_t i = 0; i < n; ++i) ss += plane_squared_deviation(x + (i * c + ch) * hw, hw, fmean);
    const double var = ss / m;
    const float invstd = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
    save_mean[ch] = fmean;
    save_invstd[ch] = invstd;
    if (running_mean != nullptr) {
      const double unbiased = m > 1.0 ? ss / (m - 1.0) : var;
      running_mean[ch] = static_cast<float>((1.0 - momentum) * running_mean[ch] + momentum * mean);
      running_var[ch] = static_cast<float>((1.0 - momentum) * running_var[ch] + momentum * unbiased);
    }
    normalize_channel(x, n, c, hw, ch, fmean, gamma[ch] * invstd, beta[ch], y);
  }
}

template <typename T>
void batch_norm_forward_inference_cpu(const T* x, const float* gamma, const float* beta, const float* running_mean,
                                      const float* running_var, int64_t n, int64_t c, int64_t hw, float eps, T* y,
                                      float* save_mean, float* save_invstd) {
  for (int64_t ch = 0; ch < c; ++ch) {
    const float invstd = static_cast<float>(1.0 / std::sqrt(static_cast<double>(running_var[ch]) + eps));
    save_mean[ch] = running_mean[ch];
    save_invstd[ch] = invstd;
    normalize_channel(x, n, c, hw, ch, running_mean[ch], gamma[ch] * invstd, beta[ch], y);
  }
}

template <typename T>
void batch_norm_backward_cpu(const T* x, const T* dy, const float* gamma, const float* save_mean,
                             const float* save_invstd, int64_t n, int64_t c, int64_t hw, bool training, float beta_dx,
                             T* dx, float beta_dgamma, float* dgamma, float beta_dbeta, float* dbeta) {
  const double m = static_cast<double>(n * hw);
  for (int64_t ch = 0; ch < c; ++ch) {
    const float mean = save_mean[ch], invstd = save_invstd[ch];
    double sum_dy = 0.0, sum_dy_dev = 0.0;
    for (int64_t i = 0; i < n; ++i)
      plane_grad_sums(x + (i * c + ch) * hw, dy + (i * c + ch) * hw, hw, mean, &sum_dy, &sum_dy_dev);
    const double sum_dy_xhat = sum_dy_dev * invstd;
    if (dgamma != nullptr) dgamma[ch] = blend(static_cast<float>(sum_dy_xhat), beta_dgamma, dgamma[ch]);
    if (dbeta != nullptr) dbeta[ch] = blend(static_cast<float>(sum_dy), beta_dbeta, dbeta[ch]);
    if (dx == nullptr) continue;
    const float scale = gamma[ch] * invstd;
    const float mean_dy = training ? static_cast<float>(sum_dy / m) : 0.0f;
    const float mean_dy_xhat = training ? static_cast<float>(sum_dy_xhat / m) : 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      const T* p = x + (i * c + ch) * hw;
      const T* g = dy + (i * c + ch) * hw;
      T* q = dx + (i * c + ch) * hw;
      for (int64_t j = 0; j < hw; ++j) {
        // Evaluation mode's dx is scale * dy whatever x is: x_hat * 0 would make a NaN or an infinite
        // x a NaN dx (CUDA's inference_dx_kernel, and PyTorch, never read x).
        const float xhat = training ? (to_f32(p[j]) - mean) * invstd : 0.0f;
        q[j] = from_f32<T>(blend(scale * (to_f32(g[j]) - mean_dy - xhat * mean_dy_xhat), beta_dx, to_f32(q[j])));
      }
    }
  }
}

#define CUMULUS_INSTANTIATE(T)                                                                                   \
  template void batch_norm_forward_training_cpu(const T*, const float*, const float*, int64_t, int64_t, int64_t, \
                                                float, float, float*, float*, T*, float*, float*);               \
  template void batch_norm_forward_inference_cpu(const T*, const float*, const float*, const float*,             \
                                                 const float*, int64_t, int64_t, int64_t, float, T*, float*,     \
                                                 float*);                                                        \
  template void batch_norm_backward_cpu(const T*, const T*, const float*, const float*, const float*, int64_t,   \
                                        int64_t, int64_t, bool, float, T*, float, float*, float, float*);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
