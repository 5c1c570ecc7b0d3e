// Optimizer updates on CUDA over one flat array: one launch updates every parameter of the model
// (the multi-tensor apply of PyTorch's foreach/fused optimizers, made trivial by the flat layout of
// DESIGN.md, decision 8). The per-element rules are kernels/optim_rules.h, shared with the CPU.
//   sum_squares: stage 1, kPartials blocks each reduce a strided slice into partials[b];
//                stage 2, one block sums the partials. Fixed order: deterministic.
#include <algorithm>

#include "cumulus/core/cuda_check.h"
#include "kernels/cuda/kernels.h"
#include "kernels/optim_rules.h"

namespace cumulus::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kPartials = 256;

__device__ float block_sum(float v, float* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  return shared[0];
}

__global__ void sum_squares_stage1(const float* x, int64_t n, float* partials) {
  __shared__ float shared[kThreads];
  float s = 0.0f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)
    s += x[i] * x[i];
  const float total = block_sum(s, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void sum_squares_stage2(const float* partials, float* out) {
  __shared__ float shared[kThreads];
  float s = 0.0f;
  for (int i = threadIdx.x; i < kPartials; i += blockDim.x) s += partials[i];
  const float total = block_sum(s, shared);
  if (threadIdx.x == 0) out[0] = total;
}

__global__ void sgd_step_kernel(float* w, const float* grad, float* buf, int64_t n, float grad_scale,
                                float lr, float momentum, float dampening, bool nesterov,
                                float weight_decay, bool first) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)
    rules::sgd(w[i], grad[i], buf ? buf + i : nullptr, grad_scale, lr, momentum, dampening, nesterov, weight_decay, first);
}

__global__ void adamw_step_kernel(float* w, const float* grad, float* m, float* v, int64_t n,
                                  float grad_scale, float lr, float beta1, float beta2, float eps,
                                  float weight_decay, float step_size, float bc2_sqrt) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)
    rules::adamw(w[i], grad[i], m[i], v[i], grad_scale, lr, beta1, beta2, eps, weight_decay, step_size, bc2_sqrt);
}

inline unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 4096));
}

}  // namespace

int sum_squares_partials() { return kPartials; }

void sum_squares_cuda(const float* x, int64_t n, float* partials, float* out, cudaStream_t stream) {
  sum_squares_stage1<<<kPartials, kThreads, 0, stream>>>(x, n, partials);
  CUMULUS_LAUNCH_CHECK();
  sum_squares_stage2<<<1, kThreads, 0, stream>>>(partials, out);
  CUMULUS_LAUNCH_CHECK();
}

void sgd_step_cuda(float* w, const float* grad, float* buf, int64_t n, float grad_scale, float lr,
                   float momentum, float dampening, bool nesterov, float weight_decay, bool first,
                   cudaStream_t stream) {
  if (n == 0) return;
  sgd_step_kernel<<<blocks_for(n), kThreads, 0, stream>>>(w, grad, buf, n, grad_scale, lr, momentum,
                                                          dampening, nesterov, weight_decay, first);
  CUMULUS_LAUNCH_CHECK();
}

void adamw_step_cuda(float* w, const float* grad, float* m, float* v, int64_t n, float grad_scale,
                     float lr, float beta1, float beta2, float eps, float weight_decay,
                     float bias_correction1, float bias_correction2, cudaStream_t stream) {
  if (n == 0) return;
  adamw_step_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
      w, grad, m, v, n, grad_scale, lr, beta1, beta2, eps, weight_decay, lr / bias_correction1,
      std::sqrt(bias_correction2));
  CUMULUS_LAUNCH_CHECK();
}

}  // namespace cumulus::kernels
