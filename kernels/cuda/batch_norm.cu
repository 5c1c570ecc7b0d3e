// The kernels of our own for batch_norm2d on CUDA (cuDNN's calls are in kernels/cuda/cudnn_batch_norm.cu):
// evaluation mode's saved statistics and its backward (cuDNN has none: dx = gamma * invstd * dy,
// dgamma = sum dy * x_hat, dbeta = sum dy, per channel) and the num_batches_tracked counter. In a
// file without cuDNN's header, so that the CPU emulation runs them (Note [Kernel launches] in
// kernels/cuda/common.cuh). x, dy and dx are stored as T (float, BFloat16, Half): loads through
// to_f32, f32 arithmetic, one rounding per 16-bit store; parameters and statistics are f32.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace cumulus::kernels {

namespace {

using cuda_common::blend;
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

// One block per channel: sum dy and sum dy * x_hat over the channel's n * hw values in a fixed order
// (deterministic), then the parameter gradients.
template <typename T>
__global__ void param_grads_kernel(const T* x, const T* dy, const float* save_mean, const float* save_invstd, int64_t n,
                                   int64_t c, int64_t hw, float beta_dgamma, float* dgamma, float beta_dbeta,
                                   float* dbeta) {
  const int64_t ch = blockIdx.x;
  const float mean = save_mean[ch], invstd = save_invstd[ch];
  float a = 0.0f, b = 0.0f;
  for (int64_t i = threadIdx.x; i < n * hw; i += blockDim.x) {
    const int64_t idx = ((i / hw) * c + ch) * hw + i % hw;
    const float g = to_f32(dy[idx]);
    a += g;
    b += g * (to_f32(x[idx]) - mean) * invstd;
  }
  a = cuda_common::block_sum(a);
  b = cuda_common::block_sum(b);
  if (threadIdx.x == 0) {
    if (dgamma != nullptr) dgamma[ch] = blend(b, beta_dgamma, dgamma[ch]);
    if (dbeta != nullptr) dbeta[ch] = blend(a, beta_dbeta, dbeta[ch]);
  }
}

// dx = gamma * invstd * dy (+ beta * dx): the statistics are constants in evaluation mode.
template <typename T>
__global__ void inference_dx_kernel(const T* dy, const float* gamma, const float* save_invstd, int64_t c, int64_t hw,
                                    int64_t total, float beta, T* dx) {
  CUMULUS_GRID_STRIDE_LOOP(i, total) {
    const int64_t ch = (i / hw) % c;
    dx[i] = from_f32<T>(blend(gamma[ch] * save_invstd[ch] * to_f32(dy[i]), beta, to_f32(dx[i])));
  }
}

__global__ void increment_i32_kernel(int32_t* counter) { counter[0] += 1; }

template <typename T>
void backward_inference(const void* x, const void* dy, const float* gamma, const float* save_mean,
                        const float* save_invstd, int64_t n, int64_t c, int64_t hw, float beta_dx, void* dx,
                        float beta_dgamma, float* dgamma, float beta_dbeta, float* dbeta, cudaStream_t stream) {
  if ((dgamma != nullptr || dbeta != nullptr) && c > 0) {
    CUMULUS_CHECK(c <= 2147483647, InvalidArgument, "batch_norm2d: ", c, " channels is too many for one grid");
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

}  // namespace cumulus::kernels
