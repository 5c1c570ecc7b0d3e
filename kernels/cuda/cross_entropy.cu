// Softmax cross-entropy over integer labels on CUDA (the math: kernels/cpu/cross_entropy.cpp).
// One warp per row: lanes stride over the classes, the max and the sum of exponentials are reduced
// with shuffles, so a row of any width costs one pass for the max and one for the sum.
//   forward:  per-row losses into scratch, then the deterministic one-block sum (reduce.cu); up to
//             256 rows both in one launch.
//   backward: dx = scale * g * (softmax - onehot) (+ beta * dx); recomputes the row statistics
//             from the saved logits instead of saving the softmax (saves B x C floats).
// A label outside [0, C) makes the row's loss NaN: a kernel cannot throw, and a host-side check
// would synchronize every micro-batch. The optimizer's non-finite guard then sees it.
// Logits and their gradient may be stored in 16 bits (to_f32 / from_f32<T>); the row statistics,
// the losses and the gradient's arithmetic are f32 (Note [Mixed precision] in engine/ops/linear.cpp).
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace cumulus::kernels {

namespace {

using cuda_common::launch;

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;

using cuda_common::warp_max;
using cuda_common::warp_sum;

// Row maximum m and log sum_j exp(x_j - m), computed by the whole warp; every lane gets both. They
// stay apart: one float m + log(s) would round log(s) away when |m| is large.
template <typename T>
__device__ __forceinline__ void warp_row_stats(const T* x, int64_t n, int lane, float& m, float& log_sum) {
  m = -INFINITY;
  for (int64_t j = lane; j < n; j += kWarp) m = fmaxf(m, to_f32(x[j]));
  m = warp_max(m);
  float s = 0.0f;
  for (int64_t j = lane; j < n; j += kWarp) s += expf(to_f32(x[j]) - m);
  log_sum = logf(warp_sum(s));
}

// Row `row`'s loss into row_loss[row], by the calling warp.
template <typename T>
__device__ __forceinline__ void row_loss_by_warp(const T* logits, const int32_t* labels, int64_t row,
                                                 int64_t classes, int lane, float* row_loss) {
  const T* x = logits + row * classes;
  float m, log_sum;
  warp_row_stats(x, classes, lane, m, log_sum);
  if (lane == 0) {
    const int32_t y = labels[row];
    row_loss[row] = (y >= 0 && y < classes) ? (m - to_f32(x[y])) + log_sum : NAN;
  }
}

template <typename T>
__global__ void cross_entropy_forward_kernel(const T* logits, const int32_t* labels,
                                             int64_t batch, int64_t classes, float* row_loss) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  if (row < batch) row_loss_by_warp(logits, labels, row, classes, threadIdx.x % kWarp, row_loss);
}

// Small batches in one launch: the block's warps take the rows in turn, then the block sums them
// as sum_all_cuda does (cuda_common::block_sum_all), so the loss has the same bits as the two-launch
// path. __syncthreads makes the block's global writes visible to the whole block.
template <typename T>
__global__ void cross_entropy_forward_one_block_kernel(const T* logits, const int32_t* labels, int64_t batch,
                                                       int64_t classes, float scale, float* row_loss, float* loss) {
  const int lane = threadIdx.x % kWarp;
  for (int64_t row = threadIdx.x / kWarp; row < batch; row += kWarpsPerBlock)
    row_loss_by_warp(logits, labels, row, classes, lane, row_loss);
  __syncthreads();
  const float total = cuda_common::block_sum_all(row_loss, batch);
  if (threadIdx.x == 0) loss[0] = scale * total;
}

template <typename T>
__global__ void cross_entropy_backward_kernel(const T* logits, const int32_t* labels, int64_t batch, int64_t classes,
                                              const float* grad_loss, float scale, float beta, T* dlogits) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= batch) return;
  const T* x = logits + row * classes;
  T* dx = dlogits + row * classes;
  float m, log_sum;
  warp_row_stats(x, classes, lane, m, log_sum);
  const float g = scale * grad_loss[0];
  const int32_t y = labels[row];
  for (int64_t j = lane; j < classes; j += kWarp) {
    const float v = g * (expf((to_f32(x[j]) - m) - log_sum) - (j == y ? 1.0f : 0.0f));
    dx[j] = from_f32<T>(beta == 0.0f ? v : v + beta * to_f32(dx[j]));
  }
}

inline unsigned blocks_for_rows(int64_t batch) {
  return static_cast<unsigned>((batch + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

template <typename T>
void cross_entropy_forward_cuda(const T* logits, const int32_t* labels, int64_t batch, int64_t classes, float scale,
                                float* row_loss, float* loss, cudaStream_t stream) {
  static_assert(kWarpsPerBlock * kWarp == cuda_common::kThreads, "sum_all_cuda's block size");
  // Up to 32 rows per warp, one block costs less than a second launch (a training micro-batch);
  // larger batches (evaluation) spread the rows over the GPU first.
  constexpr int64_t kOneBlockRows = 32 * kWarpsPerBlock;
  if (batch > 0 && batch <= kOneBlockRows) {
    launch<cross_entropy_forward_one_block_kernel<T>>(1, kWarpsPerBlock * kWarp, stream, logits, labels, batch, classes,
                                                      scale, row_loss, loss);
    return;
  }
  if (batch > 0) {
    launch<cross_entropy_forward_kernel<T>>(blocks_for_rows(batch), kWarpsPerBlock * kWarp, stream, logits, labels,
                                            batch, classes, row_loss);
  }
  sum_all_cuda(row_loss, batch, scale, loss, row_loss + batch, stream);
}

template <typename T>
void cross_entropy_backward_cuda(const T* logits, const int32_t* labels, int64_t batch, int64_t classes,
                                 const float* grad_loss, float scale, float beta, T* dlogits, cudaStream_t stream) {
  if (batch == 0) return;
  launch<cross_entropy_backward_kernel<T>>(blocks_for_rows(batch), kWarpsPerBlock * kWarp, stream, logits, labels,
                                           batch, classes, grad_loss, scale, beta, dlogits);
}

// One block: each thread takes rows tid, tid + blockDim, ...; argmax_rows's rule exactly
// (row_argmax), then the block's count and one thread's update.
template <typename T>
__global__ void classification_tally_kernel(const T* logits, const int32_t* labels, int64_t rows, int64_t cols,
                                            const float* batch_loss, ClassificationTotals* totals) {
  int64_t correct = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    correct += row_argmax(logits + r * cols, cols) == labels[r];
  }
  correct = cuda_common::block_sum<long long>(correct);
  if (threadIdx.x == 0) {
    totals->loss_sum += static_cast<double>(*batch_loss);
    totals->correct += correct;
    totals->samples += rows;
    totals->batches += 1;
  }
}

template <typename T>
void classification_tally_cuda(const T* logits, const int32_t* labels, int64_t rows, int64_t cols,
                               const float* batch_loss, ClassificationTotals* totals, cudaStream_t stream) {
  launch<classification_tally_kernel<T>>(1, cuda_common::kThreads, stream, logits, labels, rows, cols, batch_loss,
                                         totals);
}

#define CUMULUS_INSTANTIATE(T)                                                                                \
  template void cross_entropy_forward_cuda(const T*, const int32_t*, int64_t, int64_t, float, float*, float*, \
                                           cudaStream_t);                                                     \
  template void cross_entropy_backward_cuda(const T*, const int32_t*, int64_t, int64_t, const float*, float,  \
                                            float, T*, cudaStream_t);                                         \
  template void classification_tally_cuda(const T*, const int32_t*, int64_t, int64_t, const float*,           \
                                          ClassificationTotals*, cudaStream_t);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
