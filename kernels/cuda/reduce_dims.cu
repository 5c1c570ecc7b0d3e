// The reductions over dimensions on CUDA (kernels/cuda/reduce_dims_kernels.h).
//   sum_dims: a block per output element (grid-stride over the outputs), its threads striding over
//             the terms in double, then block_sum in double: the same bits run to run; against the
//             CPU's sequential double sum, the same f32 result but for a rounding tie. A block of
//             32 threads for fewer than kWideTerms terms, so short sums do not idle 224 threads.
//   sum_dims_backward: a thread per input element.
//   extreme_dims (amax / amin) and its backward: a thread per output element, the CPU's rule.
//   select_along_dim: a thread per row running select_row, or for rows of kBlockSelectDim or more
//             a block per row (a vocabulary's top k) whose picks are select_row's.
//   scatter_along_dim, multinomial: a thread per row, the CPU's row rules.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce_dims_kernels.h"

namespace cumulus::kernels {

namespace {

using cuda_common::blocks_for;
using cuda_common::kThreads;
using cuda_common::launch;

constexpr int64_t kWideTerms = 4096;
constexpr int64_t kMaxSumBlocks = 65535;  // also the cap of the block-per-row selection's grid
constexpr int64_t kBlockSelectDim = 1024;

template <typename T>
__global__ void sum_dims_kernel(ReduceGeometry g, const T* x, int64_t divisor, T* y) {
  for (int64_t o = blockIdx.x; o < g.outputs; o += gridDim.x) {
    const T* xo = x + kept_offset(g, o);
    double s = 0.0;
    for (int64_t r = threadIdx.x; r < g.terms; r += blockDim.x)
      s += static_cast<double>(to_f32(xo[reduced_offset(g, r)]));
    s = cuda_common::block_sum(s);
    if (threadIdx.x == 0) y[o] = from_f32<T>(static_cast<float>(s / static_cast<double>(divisor)));
  }
}

template <typename T>
__global__ void sum_dims_backward_kernel(ReduceGeometry g, const T* dy, float scale, float beta, T* dx) {
  CUMULUS_GRID_STRIDE_LOOP(i, g.outputs * g.terms) {
    const int64_t o = i / g.terms, r = i % g.terms;
    cuda_common::store_blend(dx + kept_offset(g, o) + reduced_offset(g, r), scale * to_f32(dy[o]), beta);
  }
}

template <typename T>
__global__ void extreme_dims_kernel(ReduceGeometry g, const T* x, bool largest, T* y) {
  CUMULUS_GRID_STRIDE_LOOP(o, g.outputs) y[o] = from_f32<T>(extreme_of(g, x, o, largest));
}

template <typename T>
__global__ void extreme_dims_backward_kernel(ReduceGeometry g, const T* x, const T* y, const T* dy, float beta, T* dx) {
  CUMULUS_GRID_STRIDE_LOOP(o, g.outputs) extreme_backward_of(g, x, y, dy, o, beta, dx);
}

template <typename T>
__global__ void select_along_dim_kernel(const T* x, int64_t outer, int64_t dim, int64_t inner, int64_t k, bool largest,
                                        bool nan_first, T* values, int64_t* indices) {
  CUMULUS_GRID_STRIDE_LOOP(row, outer * inner) {
    const int64_t o = row / inner, i = row % inner, out = o * k * inner + i;
    select_row(x + o * dim * inner + i, dim, inner, k, largest, nan_first, values ? values + out : nullptr,
               indices + out);
  }
}

// Rows of kBlockSelectDim elements or more: a block per row, select_row's picks made by the block.
// For each pick every thread takes the first-ranking element of its strided share that ranks after
// the previous pick, then a tree over the block keeps the first-ranking of those. The order is
// total (ties go to the lower index), so the pick is select_row's whatever the tree's shape.
template <typename T>
__global__ void select_along_dim_block_kernel(const T* x, int64_t outer, int64_t dim, int64_t inner, int64_t k,
                                              bool largest, bool nan_first, T* values, int64_t* indices) {
  __shared__ float best_values[kThreads];
  __shared__ int64_t best_indices[kThreads];
  const int t = static_cast<int>(threadIdx.x);
  for (int64_t row = blockIdx.x; row < outer * inner; row += gridDim.x) {
    const int64_t o = row / inner, i = row % inner, out = o * k * inner + i;
    const T* xr = x + o * dim * inner + i;
    float prev = 0.0f;
    int64_t prev_index = -1;
    for (int64_t j = 0; j < k; ++j) {
      float best = 0.0f;
      int64_t best_index = -1;
      for (int64_t d = t; d < dim; d += blockDim.x) {
        const float v = to_f32(xr[d * inner]);
        if (prev_index >= 0 && !ranks_before(prev, prev_index, v, d, largest, nan_first)) continue;
        if (best_index < 0 || ranks_before(v, d, best, best_index, largest, nan_first)) {
          best = v;
          best_index = d;
        }
      }
      best_values[t] = best;
      best_indices[t] = best_index;
      __syncthreads();
      for (int half = static_cast<int>(blockDim.x) / 2; half > 0; half /= 2) {
        if (t < half) {
          const float v = best_values[t + half];
          const int64_t d = best_indices[t + half];
          if (d >= 0 &&
              (best_indices[t] < 0 || ranks_before(v, d, best_values[t], best_indices[t], largest, nan_first))) {
            best_values[t] = v;
            best_indices[t] = d;
          }
        }
        __syncthreads();
      }
      prev = best_values[0];
      prev_index = best_indices[0];
      if (t == 0) {
        if (values) values[out + j * inner] = xr[prev_index * inner];
        indices[out + j * inner] = prev_index;
      }
      __syncthreads();  // best_* are rewritten by the next pick
    }
  }
}

template <typename T>
__global__ void scatter_along_dim_kernel(const T* dy, const int64_t* indices, int64_t outer, int64_t dim, int64_t inner,
                                         int64_t k, float beta, T* dx) {
  CUMULUS_GRID_STRIDE_LOOP(row, outer * inner) {
    const int64_t o = row / inner, i = row % inner, in = o * k * inner + i;
    scatter_row(dy + in, indices + in, dim, inner, k, beta, dx + o * dim * inner + i);
  }
}

template <typename T>
__global__ void multinomial_kernel(const T* w, int64_t rows, int64_t n, int64_t samples, bool replacement,
                                   uint64_t seed, int64_t* out) {
  CUMULUS_GRID_STRIDE_LOOP(r, rows) multinomial_row(w + r * n, n, samples, replacement, seed, r, out + r * samples);
}

}  // namespace

template <typename T>
void sum_dims_cuda(const ReduceGeometry& g, const T* x, int64_t divisor, T* y, cudaStream_t stream) {
  if (g.outputs == 0) return;
  const unsigned blocks = static_cast<unsigned>(g.outputs < kMaxSumBlocks ? g.outputs : kMaxSumBlocks);
  launch<sum_dims_kernel<T>>(blocks, g.terms < kWideTerms ? 32 : kThreads, stream, g, x, divisor, y);
}

template <typename T>
void sum_dims_backward_cuda(const ReduceGeometry& g, const T* dy, float scale, float beta, T* dx, cudaStream_t stream) {
  const int64_t n = g.outputs * g.terms;
  if (n == 0) return;
  launch<sum_dims_backward_kernel<T>>(blocks_for(n), kThreads, stream, g, dy, scale, beta, dx);
}

template <typename T>
void extreme_dims_cuda(const ReduceGeometry& g, const T* x, bool largest, T* y, cudaStream_t stream) {
  if (g.outputs == 0) return;
  launch<extreme_dims_kernel<T>>(blocks_for(g.outputs), kThreads, stream, g, x, largest, y);
}

template <typename T>
void extreme_dims_backward_cuda(const ReduceGeometry& g, const T* x, const T* y, const T* dy, float beta, T* dx,
                                cudaStream_t stream) {
  if (g.outputs == 0) return;
  launch<extreme_dims_backward_kernel<T>>(blocks_for(g.outputs), kThreads, stream, g, x, y, dy, beta, dx);
}

template <typename T>
void select_along_dim_cuda(const T* x, int64_t outer, int64_t dim, int64_t inner, int64_t k, bool largest,
                           bool nan_first, T* values, int64_t* indices, cudaStream_t stream) {
  const int64_t rows = outer * inner;
  if (rows == 0 || k == 0) return;
  if (dim >= kBlockSelectDim) {
    const auto blocks = static_cast<unsigned>(rows < kMaxSumBlocks ? rows : kMaxSumBlocks);
    launch<select_along_dim_block_kernel<T>>(blocks, kThreads, stream, x, outer, dim, inner, k, largest, nan_first,
                                             values, indices);
    return;
  }
  launch<select_along_dim_kernel<T>>(blocks_for(rows), kThreads, stream, x, outer, dim, inner, k, largest, nan_first,
                                     values, indices);
}

template <typename T>
void scatter_along_dim_cuda(const T* dy, const int64_t* indices, int64_t outer, int64_t dim, int64_t inner, int64_t k,
                            float beta, T* dx, cudaStream_t stream) {
  if (outer * inner == 0) return;
  launch<scatter_along_dim_kernel<T>>(blocks_for(outer * inner), kThreads, stream, dy, indices, outer, dim, inner, k,
                                      beta, dx);
}

template <typename T>
void multinomial_cuda(const T* w, int64_t rows, int64_t n, int64_t samples, bool replacement, uint64_t seed,
                      int64_t* out, cudaStream_t stream) {
  if (rows == 0 || samples == 0) return;
  launch<multinomial_kernel<T>>(blocks_for(rows), kThreads, stream, w, rows, n, samples, replacement, seed, out);
}

#define CUMULUS_INSTANTIATE(T)                                                                                  \
  template void sum_dims_cuda(const ReduceGeometry&, const T*, int64_t, T*, cudaStream_t);                      \
  template void sum_dims_backward_cuda(const ReduceGeometry&, const T*, float, float, T*, cudaStream_t);        \
  template void extreme_dims_cuda(const ReduceGeometry&, const T*, bool, T*, cudaStream_t);                     \
  template void extreme_dims_backward_cuda(const ReduceGeometry&, const T*, const T*, const T*, float, T*,      \
                                           cudaStream_t);                                                       \
  template void select_along_dim_cuda(const T*, int64_t, int64_t, int64_t, int64_t, bool, bool, T*, int64_t*,   \
                                      cudaStream_t);                                                            \
  template void scatter_along_dim_cuda(const T*, const int64_t*, int64_t, int64_t, int64_t, int64_t, float, T*, \
                                       cudaStream_t);                                                           \
  template void multinomial_cuda(const T*, int64_t, int64_t, int64_t, bool, uint64_t, int64_t*, cudaStream_t);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
