// The kernels of rms_norm on CUDA (kernels/cuda/rms_norm_kernels.h): x, y, dy and dx stored as T,
// f32 arithmetic with the row sums in double (as the CPU's scalar loops), one rounding per 16-bit
// store. No atomics: every sum has a fixed order, so results are the same bits on every run.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rms_norm_kernels.h"

namespace cumulus::kernels {

namespace {

using cuda_common::block_sum;
using cuda_common::kThreads;
using cuda_common::launch;
using cuda_common::store_blend;

template <typename T>
__global__ void rms_norm_forward_kernel(const T* x, const float* weight, int64_t cols, float eps, T* y, float* rstd) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * cols;
  double squares = 0.0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    squares += static_cast<double>(to_f32(xr[c])) * to_f32(xr[c]);
  const auto inv = static_cast<float>(1.0 / sqrt(block_sum(squares) / static_cast<double>(cols) + eps));
  if (threadIdx.x == 0) rstd[r] = inv;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = to_f32(xr[c]) * inv;
    y[r * cols + c] = from_f32<T>(weight != nullptr ? v * weight[c] : v);
  }
}

// dx = rstd g + b x with b = -rstd^3 mean(g x), g = dy weight.
template <typename T>
__global__ void rms_norm_backward_dx_kernel(const T* x, const T* dy, const float* weight, const float* rstd,
                                            int64_t cols, float beta, T* dx) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * cols;
  const T* dyr = dy + r * cols;
  const float inv = rstd[r];
  double gx = 0.0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    gx += static_cast<double>(to_f32(dyr[c]) * (weight != nullptr ? weight[c] : 1.0f)) * to_f32(xr[c]);
  const double rd = inv;
  const auto b = static_cast<float>(-rd * rd * rd * block_sum(gx) / static_cast<double>(cols));
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float g = to_f32(dyr[c]) * (weight != nullptr ? weight[c] : 1.0f);
    store_blend(dx + r * cols + c, inv * g + b * to_f32(xr[c]), beta);
  }
}

// Column sums: threadIdx.x picks a column of the block's 32, threadIdx.y (8 groups) every 8th row;
// group 0 adds the groups' partial sums in the order 0..7.
constexpr int kWeightCols = 32, kWeightGroups = 8;

template <typename T>
__global__ void rms_norm_weight_grad_kernel(const T* x, const T* dy, const float* rstd, int64_t rows, int64_t cols,
                                            float beta_dw, float* dweight) {
  __shared__ double partial[kWeightGroups][kWeightCols];
  const int64_t c = blockIdx.x * static_cast<int64_t>(kWeightCols) + threadIdx.x;
  double sum = 0.0;
  if (c < cols)
    for (int64_t r = threadIdx.y; r < rows; r += kWeightGroups)
      sum += static_cast<double>(to_f32(dy[r * cols + c])) * (to_f32(x[r * cols + c]) * rstd[r]);
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  for (int k = 1; k < kWeightGroups; ++k) sum += partial[k][threadIdx.x];
  store_blend(dweight + c, static_cast<float>(sum), beta_dw);
}

// One block per row needs the rows to fit a grid's x dimension.
void check_rows(int64_t rows) {
  CUMULUS_CHECK(rows <= 2147483647, InvalidArgument, "rms_norm: ", rows, " rows is too many for one grid");
}

}  // namespace

template <typename T>
void rms_norm_forward_cuda(const T* x, const float* weight, int64_t rows, int64_t cols, float eps, T* y, float* rstd,
                           cudaStream_t stream) {
  if (rows == 0) return;
  check_rows(rows);
  launch<rms_norm_forward_kernel<T>>(static_cast<unsigned>(rows), kThreads, stream, x, weight, cols, eps, y, rstd);
}

template <typename T>
void rms_norm_backward_cuda(const T* x, const T* dy, const float* weight, const float* rstd, int64_t rows, int64_t cols,
                            float beta, T* dx, float beta_dw, float* dweight, cudaStream_t stream) {
  if (dx != nullptr && rows > 0) {
    check_rows(rows);
    launch<rms_norm_backward_dx_kernel<T>>(static_cast<unsigned>(rows), kThreads, stream, x, dy, weight, rstd, cols,
                                           beta, dx);
  }
  if (dweight != nullptr && cols > 0) {
    const auto blocks = static_cast<unsigned>((cols + kWeightCols - 1) / kWeightCols);
    launch<rms_norm_weight_grad_kernel<T>>(blocks, dim3(kWeightCols, kWeightGroups), stream, x, dy, rstd, rows, cols,
                                           beta_dw, dweight);
  }
}

#define CUMULUS_INSTANTIATE(T)                                                                                      \
  template void rms_norm_forward_cuda(const T*, const float*, int64_t, int64_t, float, T*, float*, cudaStream_t);   \
  template void rms_norm_backward_cuda(const T*, const T*, const float*, const float*, int64_t, int64_t, float, T*, \
                                       float, float*, cudaStream_t);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
