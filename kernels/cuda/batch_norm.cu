// The kernels of our own for batch_norm2d on CUDA (cuDNN's calls are in kernels/cuda/cudnn_batch_norm.cu):
// evaluation mode's saved statistics and its backward (cuDNN has none: dx = gamma * invstd * dy,
// dgamma = sum dy * x_hat, dbeta = sum dy, per channel), the num_batches_tracked counter, and both
// modes for bf16 and f16, which cuDNN's batch norm is not documented for or folds (Note [bf16 on
// cuDNN] in kernels/cuda/cudnn_kernels.h). In a file without cuDNN's header, so that the CPU
// emulation runs them (Note [Kernel launches] in kernels/cuda/common.cuh). x, y, dy and dx are stored as T (float,
// BFloat16, Half): loads through to_f32, f32 arithmetic, one rounding per 16-bit store; parameters
// and statistics are f32, the sums behind them double (as the CPU's). Each channel's sums are one
// block's (fixed order: deterministic), and the normalizing and the dx formulas are
// kernels/cpu/batch_norm.cpp's. Against the CPU they differ by the order of the sums, by nvcc's
// fused multiply-adds (one rounding fewer per fused step), and in evaluation mode by rsqrtf (CUDA
// documents 2 ulp; the CPU divides by sqrt): within a few f32 roundings relative to the channel's
// terms, not the same bits (Note [CUDA bit parity] in CMakeLists.txt).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace cumulus::kernels {

namespace {

using cuda_common::store_blend;
using cuda_common::blocks_for;
using cuda_common::kThreads;
using cuda_common::launch;

// save_mean = running_mean, save_invstd = 1 / sqrt(running_var + eps), one thread per channel.
__global__ void save_running_stats_kernel(const float* running_mean, const float* running_var, int64_t c, float eps,
                                          float* save_mean, float* save_invstd) {
  const int64_t ch = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (ch >= c) return;
  save_mean[ch] = running_mean[ch];
  save_invstd[ch] = rsqrtf(running_var[ch] + eps);
}

// The offset of the i-th of channel ch's n * hw values in [n, c, hw].
__device__ __forceinline__ int64_t channel_offset(int64_t i, int64_t c, int64_t hw, int64_t ch) {
  return ((i / hw) * c + ch) * hw + i % hw;
}

// sum f(x) over channel ch (blockIdx.x) by the whole block: each thread a strided partial sum, then
// block_sum, in double as the CPU's (no drift over a million values). The order depends only on
// n * hw and blockDim; every thread gets the total.
template <typename T, typename F>
__device__ double channel_sum(const T* x, int64_t n, int64_t c, int64_t hw, F f) {
  const int64_t ch = blockIdx.x;
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n * hw; i += blockDim.x) s += f(to_f32(x[channel_offset(i, c, hw, ch)]));
  return cuda_common::block_sum(s);
}

// One block per channel: the batch mean, then the variance from a second pass (sum (x - mean)^2: no
// cancellation when the mean is large against the spread), saved as mean and 1 / sqrt(var + eps);
// the running statistics, when given, move by momentum towards the mean and the unbiased variance.
template <typename T>
__global__ void batch_stats_kernel(const T* x, int64_t n, int64_t c, int64_t hw, float eps, float momentum,
                                   float* running_mean, float* running_var, float* save_mean, float* save_invstd) {
  const int64_t ch = blockIdx.x;
  const float m = static_cast<float>(n * hw);
  const auto mean = static_cast<float>(channel_sum(x, n, c, hw, [](float v) { return double{v}; }) / (n * hw));
  const auto ss = static_cast<float>(
      channel_sum(x, n, c, hw, [mean](float v) { return static_cast<double>(v - mean) * (v - mean); }));
  if (threadIdx.x != 0) return;
  const float var = ss / m;
  save_mean[ch] = mean;
  save_invstd[ch] = 1.0f / sqrtf(var + eps);
  if (running_mean != nullptr) {
    const float unbiased = n * hw > 1 ? ss / (m - 1.0f) : var;
    running_mean[ch] = (1.0f - momentum) * running_mean[ch] + momentum * mean;
    running_var[ch] = (1.0f - momentum) * running_var[ch] + momentum * unbiased;
  }
}

// y = (x - mean) * scale + beta with scale = gamma * invstd (the CPU's formula: centred first, no
// cancellation when the mean is large against beta), one thread per element.
template <typename T>
__global__ void normalize_kernel(const T* x, const float* gamma, const float* beta, const float* save_mean,
                                 const float* save_invstd, int64_t c, int64_t hw, int64_t total, T* y) {
  CUMULUS_GRID_STRIDE_LOOP(i, total) {
    const int64_t ch = (i / hw) % c;
    y[i] = from_f32<T>((to_f32(x[i]) - save_mean[ch]) * (gamma[ch] * save_invstd[ch]) + beta[ch]);
  }
}

// A channel's sum dy and sum dy * x_hat, every thread of its block getting both.
struct GradSums {
  float dy, dy_xhat;
};

template <typename T>
__device__ GradSums channel_grad_sums(const T* x, const T* dy, float mean, float invstd, int64_t n, int64_t c,
                                      int64_t hw) {
  const int64_t ch = blockIdx.x;
  double a = 0.0, b = 0.0;  // in double, as the statistics
  for (int64_t i = threadIdx.x; i < n * hw; i += blockDim.x) {
    const int64_t idx = channel_offset(i, c, hw, ch);
    const float g = to_f32(dy[idx]);
    a += g;
    b += static_cast<double>(g) * ((to_f32(x[idx]) - mean) * invstd);
  }
  return GradSums{static_cast<float>(cuda_common::block_sum(a)), static_cast<float>(cuda_common::block_sum(b))};
}

// dgamma = sum dy * x_hat, dbeta = sum dy, each blended with its own beta; by thread 0.
__device__ inline void write_param_grads(const GradSums& s, float beta_dgamma, float* dgamma, float beta_dbeta,
                                         float* dbeta) {
  const int64_t ch = blockIdx.x;
  if (threadIdx.x != 0) return;
  if (dgamma != nullptr) store_blend(dgamma + ch, s.dy_xhat, beta_dgamma);
  if (dbeta != nullptr) store_blend(dbeta + ch, s.dy, beta_dbeta);
}

// One block per channel: sum dy and sum dy * x_hat over the channel's n * hw values in a fixed order
// (deterministic), then the parameter gradients.
template <typename T>
__global__ void param_grads_kernel(const T* x, const T* dy, const float* save_mean, const float* save_invstd, int64_t n,
                                   int64_t c, int64_t hw, float beta_dgamma, float* dgamma, float beta_dbeta,
                                   float* dbeta) {
  const GradSums s = channel_grad_sums(x, dy, save_mean[blockIdx.x], save_invstd[blockIdx.x], n, c, hw);
  write_param_grads(s, beta_dgamma, dgamma, beta_dbeta, dbeta);
}

// Training mode's backward, one block per channel: the sums and the parameter gradients as
// param_grads_kernel, then dx = gamma * invstd * (dy - mean(dy) - x_hat * mean(dy * x_hat)) over
// the channel (the sums are taken before anything is written, so dgamma and dbeta may accumulate).
template <typename T>
__global__ void training_backward_kernel(const T* x, const T* dy, const float* gamma, const float* save_mean,
                                         const float* save_invstd, int64_t n, int64_t c, int64_t hw, float beta_dx,
                                         T* dx, float beta_dgamma, float* dgamma, float beta_dbeta, float* dbeta) {
  const int64_t ch = blockIdx.x;
  const float mean = save_mean[ch], invstd = save_invstd[ch];
  const GradSums s = channel_grad_sums(x, dy, mean, invstd, n, c, hw);
  write_param_grads(s, beta_dgamma, dgamma, beta_dbeta, dbeta);
  if (dx == nullptr) return;
  const float m = static_cast<float>(n * hw), scale = gamma[ch] * invstd;
  const float mean_dy = s.dy / m, mean_dy_xhat = s.dy_xhat / m;
  for (int64_t i = threadIdx.x; i < n * hw; i += blockDim.x) {
    const int64_t idx = channel_offset(i, c, hw, ch);
    const float xhat = (to_f32(x[idx]) - mean) * invstd;
    store_blend(dx + idx, scale * (to_f32(dy[idx]) - mean_dy - xhat * mean_dy_xhat), beta_dx);
  }
}

// dx = gamma * invstd * dy (+ beta * dx): the statistics are constants in evaluation mode.
template <typename T>
__global__ void inference_dx_kernel(const T* dy, const float* gamma, const float* save_invstd, int64_t c, int64_t hw,
                                    int64_t total, float beta, T* dx) {
  CUMULUS_GRID_STRIDE_LOOP(i, total) {
    const int64_t ch = (i / hw) % c;
    store_blend(dx + i, gamma[ch] * save_invstd[ch] * to_f32(dy[i]), beta);
  }
}

__global__ void increment_i32_kernel(int32_t* counter) { counter[0] += 1; }

// One block per channel needs c to fit a grid's x dimension.
void check_channels(int64_t c) {
  CUMULUS_CHECK(c <= 2147483647, InvalidArgument, "batch_norm2d: ", c, " channels is too many for one grid");
}

template <typename T>
void normalize(const T* x, const float* gamma, const float* beta, const float* save_mean, const float* save_invstd,
               int64_t n, int64_t c, int64_t hw, T* y, cudaStream_t stream) {
  const int64_t total = n * c * hw;
  if (total > 0)
    launch<normalize_kernel<T>>(blocks_for(total), kThreads, stream, x, gamma, beta, save_mean, save_invstd, c, hw,
                                total, y);
}

template <typename T>
void backward_inference(const void* x, const void* dy, const float* gamma, const float* save_mean,
                        const float* save_invstd, int64_t n, int64_t c, int64_t hw, float beta_dx, void* dx,
                        float beta_dgamma, float* dgamma, float beta_dbeta, float* dbeta, cudaStream_t stream) {
  if ((dgamma != nullptr || dbeta != nullptr) && c > 0) {
    check_channels(c);
    launch<param_grads_kernel<T>>(static_cast<unsigned>(c), kThreads, stream, static_cast<const T*>(x),
                                  static_cast<const T*>(dy), save_mean, save_invstd, n, c, hw, beta_dgamma, dgamma,
                                  beta_dbeta, dbeta);
  }
  const int64_t total = n * c * hw;
  if (dx != nullptr && total > 0)
    launch<inference_dx_kernel<T>>(blocks_for(total), kThreads, stream, static_cast<const T*>(dy), gamma, save_invstd,
                                   c, hw, total, beta_dx, static_cast<T*>(dx));
}

}  // namespace

void batch_norm_save_running_stats_cuda(const float* running_mean, const float* running_var, int64_t c, float eps,
                                        float* save_mean, float* save_invstd, cudaStream_t stream) {
  if (c == 0) return;
  const auto blocks = static_cast<unsigned>((c + kThreads - 1) / kThreads);
  launch<save_running_stats_kernel>(blocks, kThreads, stream, running_mean, running_var, c, eps, save_mean,
                                    save_invstd);
}

void batch_norm_backward_inference_cuda(DType dtype, const void* x, const void* dy, const float* gamma,
                                        const float* save_mean, const float* save_invstd, int64_t n, int64_t c,
                                        int64_t hw, float beta_dx, void* dx, float beta_dgamma, float* dgamma,
                                        float beta_dbeta, float* dbeta, cudaStream_t stream) {
  switch (dtype) {
    case DType::f32:
      return backward_inference<float>(x, dy, gamma, save_mean, save_invstd, n, c, hw, beta_dx, dx, beta_dgamma, dgamma,
                                       beta_dbeta, dbeta, stream);
    case DType::bf16:
      return backward_inference<BFloat16>(x, dy, gamma, save_mean, save_invstd, n, c, hw, beta_dx, dx, beta_dgamma,
                                          dgamma, beta_dbeta, dbeta, stream);
    case DType::f16:
      return backward_inference<Half>(x, dy, gamma, save_mean, save_invstd, n, c, hw, beta_dx, dx, beta_dgamma, dgamma,
                                      beta_dbeta, dbeta, stream);
    default: break;
  }
  throw InvalidArgument(detail::concat("batch_norm2d: no backward for dtype ", dtype_name(dtype)));
}

void increment_i32_cuda(int32_t* counter, cudaStream_t stream) { launch<increment_i32_kernel>(1, 1, stream, counter); }

template <typename T>
void batch_norm_forward_training_cuda(const T* x, const float* gamma, const float* beta, int64_t n, int64_t c,
                                      int64_t hw, float eps, float momentum, float* running_mean, float* running_var,
                                      T* y, float* save_mean, float* save_invstd, cudaStream_t stream) {
  if (c == 0) return;
  check_channels(c);
  launch<batch_stats_kernel<T>>(static_cast<unsigned>(c), kThreads, stream, x, n, c, hw, eps, momentum, running_mean,
                                running_var, save_mean, save_invstd);
  normalize(x, gamma, beta, save_mean, save_invstd, n, c, hw, y, stream);
}

template <typename T>
void batch_norm_forward_inference_cuda(const T* x, const float* gamma, const float* beta, const float* running_mean,
                                       const float* running_var, int64_t n, int64_t c, int64_t hw, float eps, T* y,
                                       float* save_mean, float* save_invstd, cudaStream_t stream) {
  batch_norm_save_running_stats_cuda(running_mean, running_var, c, eps, save_mean, save_invstd, stream);
  normalize(x, gamma, beta, save_mean, save_invstd, n, c, hw, y, stream);
}

template <typename T>
void batch_norm_backward_training_cuda(const T* x, const T* dy, const float* gamma, const float* save_mean,
                                       const float* save_invstd, int64_t n, int64_t c, int64_t hw, float beta_dx, T* dx,
                                       float beta_dgamma, float* dgamma, float beta_dbeta, float* dbeta,
                                       cudaStream_t stream) {
  if (c == 0 || (dx == nullptr && dgamma == nullptr && dbeta == nullptr)) return;
  check_channels(c);
  launch<training_backward_kernel<T>>(static_cast<unsigned>(c), kThreads, stream, x, dy, gamma, save_mean, save_invstd,
                                      n, c, hw, beta_dx, dx, beta_dgamma, dgamma, beta_dbeta, dbeta);
}

#define CUMULUS_INSTANTIATE(T)                                                                                         \
  template void batch_norm_forward_training_cuda(const T*, const float*, const float*, int64_t, int64_t, int64_t,      \
                                                 float, float, float*, float*, T*, float*, float*, cudaStream_t);      \
  template void batch_norm_forward_inference_cuda(const T*, const float*, const float*, const float*, const float*,    \
                                                  int64_t, int64_t, int64_t, float, T*, float*, float*, cudaStream_t); \
  template void batch_norm_backward_training_cuda(const T*, const T*, const float*, const float*, const float*,        \
                                                  int64_t, int64_t, int64_t, float, T*, float, float*, float, float*,  \
                                                  cudaStream_t);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
