// batch_norm2d on the CPU: loops over planes, statistics accumulated in double. Per channel over the
// m = n * hw values of x [n, c, hw]:
//   mean = sum x / m,  var = sum (x - mean)^2 / m (biased: used to normalize),
//   x_hat = (x - mean) * invstd, invstd = 1 / sqrt(var + eps),  y = gamma * x_hat + beta.
// Backward needs x, gamma and the saved mean and invstd (never x_hat: it is recomputed):
//   dbeta = sum dy,  dgamma = sum dy * x_hat,
//   dx = gamma * invstd * (dy - dbeta / m - x_hat * dgamma / m)   (batch statistics)
//   dx = gamma * invstd * dy                                    (running statistics: constants)
// The sums are formed before anything is written, so accumulating into dgamma / dbeta (beta 1)
// does not disturb dx. x, y, dy and dx may be stored in 16 bits (T: float, BFloat16, Half); the
// arithmetic and everything per channel are f32 (double for the sums). Channels run across the
// kernel threads, each channel's work as the serial loop does it: the same bits at any thread count;
// the per-plane loops are batch_norm_planes.h's, built at AVX2's width for f32 where it runs.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cpu/batch_norm_planes.h"
#include "kernels/cpu/batch_norm_rows.h"
#include "kernels/cpu/conv_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace cumulus::kernels {

namespace {

inline float blend(float value, float beta, float old) { return beta == 0.0f ? value : value + beta * old; }

// Channels [0, c) of m values each across the kernel threads: fn(first, last).
template <typename Fn>
void for_channels(int64_t c, int64_t m, const Fn& fn) {
  parallel_for(c, grain_for(m), fn);
}

// batch_norm_planes.h's loops for T: AVX2's build of them for f32 where it runs, else the baseline's.
template <typename T>
struct Planes {
  double (*sum)(const T*, int64_t);
  double (*squared_deviation)(const T*, int64_t, float);
  void (*normalize)(const T*, int64_t, float, float, float, T*);
  void (*grad_sums)(const T*, const T*, int64_t, float, double*, double*);
  void (*dx)(const T*, const T*, int64_t, bool, float, float, float, float, float, float, T*);
};

template <typename T>
Planes<T> planes() {
  if constexpr (vec::kBuilt && std::is_same_v<T, float>) {
    if (vec::available())
      return {vec::batch_norm_plane_sum_f32, vec::batch_norm_plane_squared_deviation_f32,
              vec::batch_norm_normalize_plane_f32, vec::batch_norm_plane_grad_sums_f32, vec::batch_norm_plane_dx_f32};
  }
  return {plane_sum<T>, plane_squared_deviation<T>, normalize_plane<T>, plane_grad_sums<T>, plane_dx_of<T>};
}

}  // namespace

template <typename T>
void batch_norm_forward_training_cpu(const T* x, const float* gamma, const float* beta, int64_t n, int64_t c,
                                     int64_t hw, float eps, float momentum, float* running_mean, float* running_var,
                                     T* y, float* save_mean, float* save_invstd) {
  const Planes<T> f = planes<T>();
  const double m = static_cast<double>(n * hw);
  for_channels(c, n * hw, [&](int64_t first, int64_t last) {
    for (int64_t ch = first; ch < last; ++ch) {
      double s = 0.0;
      for (int64_t i = 0; i < n; ++i) s += f.sum(x + (i * c + ch) * hw, hw);
      const double mean = s / m;
      const float fmean = static_cast<float>(mean);
      double ss = 0.0;  // two passes: no cancellation when the mean is large against the spread
      for (int64_t i = 0; i < n; ++i) ss += f.squared_deviation(x + (i * c + ch) * hw, hw, fmean);
      const double var = ss / m;
      const float invstd = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
      save_mean[ch] = fmean;
      save_invstd[ch] = invstd;
      if (running_mean != nullptr) {
        const double unbiased = m > 1.0 ? ss / (m - 1.0) : var;
        running_mean[ch] = static_cast<float>((1.0 - momentum) * running_mean[ch] + momentum * mean);
        running_var[ch] = static_cast<float>((1.0 - momentum) * running_var[ch] + momentum * unbiased);
      }
      for (int64_t i = 0; i < n; ++i)
        f.normalize(x + (i * c + ch) * hw, hw, fmean, gamma[ch] * invstd, beta[ch], y + (i * c + ch) * hw);
    }
  });
}

template <typename T>
void batch_norm_forward_inference_cpu(const T* x, const float* gamma, const float* beta, const float* running_mean,
                                      const float* running_var, int64_t n, int64_t c, int64_t hw, float eps, T* y,
                                      float* save_mean, float* save_invstd) {
  const Planes<T> f = planes<T>();
  for_channels(c, n * hw, [&](int64_t first, int64_t last) {
    for (int64_t ch = first; ch < last; ++ch) {
      const float invstd = static_cast<float>(1.0 / std::sqrt(static_cast<double>(running_var[ch]) + eps));
      save_mean[ch] = running_mean[ch];
      save_invstd[ch] = invstd;
      for (int64_t i = 0; i < n; ++i)
        f.normalize(x + (i * c + ch) * hw, hw, running_mean[ch], gamma[ch] * invstd, beta[ch], y + (i * c + ch) * hw);
    }
  });
}

template <typename T>
void batch_norm_backward_cpu(const T* x, const T* dy, const float* gamma, const float* save_mean,
                             const float* save_invstd, int64_t n, int64_t c, int64_t hw, bool training, float beta_dx,
                             T* dx, float beta_dgamma, float* dgamma, float beta_dbeta, float* dbeta) {
  const Planes<T> f = planes<T>();
  const double m = static_cast<double>(n * hw);
  for_channels(c, n * hw, [&](int64_t first, int64_t last) {
    for (int64_t ch = first; ch < last; ++ch) {
      const float mean = save_mean[ch], invstd = save_invstd[ch];
      double sum_dy = 0.0, sum_dy_dev = 0.0;
      for (int64_t i = 0; i < n; ++i)
        f.grad_sums(x + (i * c + ch) * hw, dy + (i * c + ch) * hw, hw, mean, &sum_dy, &sum_dy_dev);
      const double sum_dy_xhat = sum_dy_dev * invstd;
      if (dgamma != nullptr) dgamma[ch] = blend(static_cast<float>(sum_dy_xhat), beta_dgamma, dgamma[ch]);
      if (dbeta != nullptr) dbeta[ch] = blend(static_cast<float>(sum_dy), beta_dbeta, dbeta[ch]);
      if (dx == nullptr) continue;
      const float scale = gamma[ch] * invstd;
      const float mean_dy = training ? static_cast<float>(sum_dy / m) : 0.0f;
      const float mean_dy_xhat = training ? static_cast<float>(sum_dy_xhat / m) : 0.0f;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t at = (i * c + ch) * hw;
        f.dx(x + at, dy + at, hw, training, mean, invstd, scale, mean_dy, mean_dy_xhat, beta_dx, dx + at);
      }
    }
  });
}

#define CUMULUS_INSTANTIATE(T)                                                                                     \
  template void batch_norm_forward_training_cpu(const T*, const float*, const float*, int64_t, int64_t, int64_t,   \
                                                float, float, float*, float*, T*, float*, float*);                 \
  template void batch_norm_forward_inference_cpu(const T*, const float*, const float*, const float*, const float*, \
                                                 int64_t, int64_t, int64_t, float, T*, float*, float*);            \
  template void batch_norm_backward_cpu(const T*, const T*, const float*, const float*, const float*, int64_t,     \
                                        int64_t, int64_t, bool, float, T*, float, float*, float, float*);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
