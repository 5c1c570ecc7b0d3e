// cross_entropy over rows with ignored positions on CUDA (kernels/cuda/loss_kernels.h); the row
// arithmetic is cross_entropy.cu's: one warp per row, the maximum and the sum of exponentials by
// shuffles, so a row whose label is kept gives the bits cross_entropy_forward_cuda gives it.
#include <climits>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/loss_kernels.h"

namespace cumulus::kernels {

namespace {

using cuda_common::launch;

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;
constexpr int64_t kOneBlockRows = 32 * kWarpsPerBlock;

template <typename T>
__device__ __forceinline__ void warp_row_stats(const T* x, int64_t n, int lane, float& m, float& log_sum) {
  m = -INFINITY;
  for (int64_t j = lane; j < n; j += kWarp) m = fmaxf(m, to_f32(x[j]));
  m = cuda_common::warp_max(m);
  float s = 0.0f;
  for (int64_t j = lane; j < n; j += kWarp) s += expf(to_f32(x[j]) - m);
  log_sum = logf(cuda_common::warp_sum(s));
}

// Row `row`'s loss (and whether it counts) by the calling warp. The label is the same for the
// whole warp, so an ignored row skips the shuffles on every lane.
template <typename T>
__device__ __forceinline__ void row_by_warp(const T* logits, const int32_t* labels, int64_t row, int64_t classes,
                                            int64_t ignore_index, int lane, float* row_loss, float* valid) {
  const int32_t y = labels[row];
  const bool ignored = y == ignore_index;
  float l = 0.0f;
  if (!ignored) {
    const T* x = logits + row * classes;
    float m, log_sum;
    warp_row_stats(x, classes, lane, m, log_sum);
    l = (y >= 0 && y < classes) ? (m - to_f32(x[y])) + log_sum : NAN;
  }
  if (lane == 0) {
    row_loss[row] = l;
    if (valid != nullptr) valid[row] = ignored ? 0.0f : 1.0f;
  }
}

template <typename T>
__global__ void ce_rows_loss_kernel(const T* logits, const int32_t* labels, int64_t rows, int64_t classes,
                                    int64_t ignore_index, float* row_loss, float* valid) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  if (row < rows) row_by_warp(logits, labels, row, classes, ignore_index, threadIdx.x % kWarp, row_loss, valid);
}

// The reduction by one block: the sums in block_sum_all's order, which is cross_entropy_forward_cuda's
// and sum_all_cuda's up to kSumAllOneBlock rows (the same bits as the loss before ignore_index);
// above, one block still sums every row (no partials), in its own fixed order.
__device__ __forceinline__ void reduce_by_block(const float* row_loss, const float* valid, int64_t rows, bool mean,
                                                float* loss, float* scale) {
  const float total = cuda_common::block_sum_all(row_loss, rows);
  const float s = mean ? 1.0f / cuda_common::block_sum_all(valid, rows) : 1.0f;
  if (threadIdx.x == 0) {
    loss[0] = s * total;
    scale[0] = s;
  }
}

template <typename T>
__global__ void ce_rows_one_block_kernel(const T* logits, const int32_t* labels, int64_t rows, int64_t classes,
                                         int64_t ignore_index, bool mean, float* row_loss, float* valid, float* loss,
                                         float* scale) {
  const int lane = threadIdx.x % kWarp;
  for (int64_t row = threadIdx.x / kWarp; row < rows; row += kWarpsPerBlock)
    row_by_warp(logits, labels, row, classes, ignore_index, lane, row_loss, valid);
  __syncthreads();
  reduce_by_block(row_loss, valid, rows, mean, loss, scale);
}

__global__ void ce_rows_reduce_kernel(const float* row_loss, const float* valid, int64_t rows, bool mean, float* loss,
                                      float* scale) {
  reduce_by_block(row_loss, valid, rows, mean, loss, scale);
}

template <typename T>
__global__ void ce_rows_backward_kernel(const T* logits, const int32_t* labels, int64_t rows, int64_t classes,
                                        int64_t ignore_index, const float* grad, int64_t grad_stride,
                                        const float* scale, float beta, T* dlogits) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const T* x = logits + row * classes;
  T* dx = dlogits + row * classes;
  const int32_t y = labels[row];
  if (y == ignore_index) {
    for (int64_t j = lane; j < classes; j += kWarp) cuda_common::store_blend(dx + j, 0.0f, beta);
    return;
  }
  float m, log_sum;
  warp_row_stats(x, classes, lane, m, log_sum);
  const float g = (scale != nullptr ? scale[0] : 1.0f) * grad[row * grad_stride];
  for (int64_t j = lane; j < classes; j += kWarp) {
    const float v = g * (expf((to_f32(x[j]) - m) - log_sum) - (j == y ? 1.0f : 0.0f));
    cuda_common::store_blend(dx + j, v, beta);
  }
}

__global__ void indices_to_i32_kernel(const int64_t* in, int64_t n, int32_t* out) {
  CUMULUS_GRID_STRIDE_LOOP(i, n) {
    const int64_t v = in[i];
    out[i] = v >= INT_MIN && v <= INT_MAX ? static_cast<int32_t>(v) : INT_MIN;
  }
}

inline unsigned blocks_for_rows(int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

template <typename T>
void cross_entropy_rows_forward_cuda(const T* logits, const int32_t* labels, int64_t rows, int64_t classes,
                                     int64_t ignore_index, bool mean, float* row_loss, float* valid, float* loss,
                                     float* scale, cudaStream_t stream) {
  static_assert(kWarpsPerBlock * kWarp == cuda_common::kThreads, "block_sum_all's block size");
  constexpr int threads = kWarpsPerBlock * kWarp;
  if (loss != nullptr && rows <= kOneBlockRows) {
    launch<ce_rows_one_block_kernel<T>>(1, threads, stream, logits, labels, rows, classes, ignore_index, mean, row_loss,
                                        valid, loss, scale);
    return;
  }
  if (rows > 0)
    launch<ce_rows_loss_kernel<T>>(blocks_for_rows(rows), threads, stream, logits, labels, rows, classes, ignore_index,
                                   row_loss, valid);
  if (loss != nullptr) launch<ce_rows_reduce_kernel>(1, threads, stream, row_loss, valid, rows, mean, loss, scale);
}

template <typename T>
void cross_entropy_rows_backward_cuda(const T* logits, const int32_t* labels, int64_t rows, int64_t classes,
                                      int64_t ignore_index, const float* grad, int64_t grad_stride, const float* scale,
                                      float beta, T* dlogits, cudaStream_t stream) {
  if (rows == 0) return;
  launch<ce_rows_backward_kernel<T>>(blocks_for_rows(rows), kWarpsPerBlock * kWarp, stream, logits, labels, rows,
                                     classes, ignore_index, grad, grad_stride, scale, beta, dlogits);
}

void indices_to_i32_cuda(const int64_t* in, int64_t n, int32_t* out, cudaStream_t stream) {
  if (n == 0) return;
  launch<indices_to_i32_kernel>(cuda_common::blocks_for(n), cuda_common::kThreads, stream, in, n, out);
}

#define CUMULUS_INSTANTIATE(T)                                                                                      \
  template void cross_entropy_rows_forward_cuda(const T*, const int32_t*, int64_t, int64_t, int64_t, bool, float*,  \
                                                float*, float*, float*, cudaStream_t);                              \
  template void cross_entropy_rows_backward_cuda(const T*, const int32_t*, int64_t, int64_t, int64_t, const float*, \
                                                 int64_t, const float*, float, T*, cudaStream_t);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
