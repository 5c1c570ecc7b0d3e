// The kernels of the structural ops on CUDA (kernels/cuda/structural_kernels.h): layer norm, slab
// copies (cat / split / narrow) and gathers with their scatter-add (index_select, embedding). x, y,
// dy and dx are stored as T (float, BFloat16, Half): f32 arithmetic (layer norm's sums in double),
// one rounding per 16-bit store.
// No atomics anywhere: every sum has a fixed order, so results are the same bits on every run.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/structural_kernels.h"

namespace cumulus::kernels {

namespace {

using cuda_common::store_blend;
using cuda_common::block_sum;
using cuda_common::blocks_for;
using cuda_common::kThreads;
using cuda_common::launch;

// ---- layer norm: one block per row ----

// The row sums in double (as the CPU's, kernels/cpu/structural.cpp): no drift over wide rows, no
// cancellation against a large mean, no overflow of the squares.
template <typename T>
__device__ double row_sum_centered(const T* xr, int64_t cols, double m) {
  double s = 0.0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += (to_f32(xr[c]) - m) * (to_f32(xr[c]) - m);
  return block_sum(s);
}

template <typename T>
__global__ void layer_norm_forward_kernel(const T* x, const float* weight, const float* bias, int64_t cols, float eps,
                                          T* y, float* mean, float* rstd) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * cols;
  double s = 0.0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += to_f32(xr[c]);
  const double m = block_sum(s) / static_cast<double>(cols);
  const double inv = 1.0 / sqrt(row_sum_centered(xr, cols, m) / static_cast<double>(cols) + eps);
  if (threadIdx.x == 0) {
    mean[r] = static_cast<float>(m);
    rstd[r] = static_cast<float>(inv);
  }
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float v = static_cast<float>((to_f32(xr[c]) - m) * inv);
    if (weight != nullptr) v *= weight[c];
    if (bias != nullptr) v += bias[c];
    y[r * cols + c] = from_f32<T>(v);
  }
}

// g = dy * weight rounded alone (__fmul_rn, never contracted into g - mean_g): over one column
// g - mean_g is then exactly 0, and so is dx, as on the CPU (an FMA left dy * w's rounding error).
template <typename T>
__global__ void layer_norm_backward_dx_kernel(const T* x, const T* dy, const float* weight, const float* mean,
                                              const float* rstd, int64_t cols, float beta, T* dx) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * cols;
  const T* dyr = dy + r * cols;
  const float m = mean[r], inv = rstd[r];
  double a = 0.0, b = 0.0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const double g = __fmul_rn(to_f32(dyr[c]), weight != nullptr ? weight[c] : 1.0f);
    a += g;
    b += g * ((static_cast<double>(to_f32(xr[c])) - m) * inv);
  }
  const auto mean_g = static_cast<float>(block_sum(a) / static_cast<double>(cols));
  const auto mean_g_xhat = static_cast<float>(block_sum(b) / static_cast<double>(cols));
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float g = __fmul_rn(to_f32(dyr[c]), weight != nullptr ? weight[c] : 1.0f);
    const auto xhat = static_cast<float>((static_cast<double>(to_f32(xr[c])) - m) * inv);
    store_blend(dx + r * cols + c, inv * (g - mean_g - xhat * mean_g_xhat), beta);
  }
}

// Column sums over a 2-D grid, as sum_rows (Note [Column sums] in reduce.cu): blockIdx.x picks 32
// columns, blockIdx.y a chunk of rows; within a block threadIdx.y (8 groups) takes every 8th row of
// the chunk, the groups' sums combined by group 0 in the order 0..7. One chunk writes the gradients
// with their betas; more write each chunk's sums into partials [chunks][2][cols] (doubles: dweight's
// then dbias's) and a second launch adds them in chunk order. A fixed order: deterministic.
constexpr int kParamCols = 32, kParamGroups = 8;
constexpr int64_t kParamChunkRows = 256, kParamMaxChunks = 1024;

int64_t param_chunks(int64_t rows) {
  return rows <= kParamChunkRows ? 1 : std::min((rows + kParamChunkRows - 1) / kParamChunkRows, kParamMaxChunks);
}

template <typename T>
__global__ void layer_norm_param_grads_kernel(const T* x, const T* dy, const float* mean, const float* rstd,
                                              int64_t rows, int64_t cols, int64_t chunk_rows, float beta_dw,
                                              float* dweight, float beta_db, float* dbias, double* partials) {
  __shared__ double partial_w[kParamGroups][kParamCols];
  __shared__ double partial_b[kParamGroups][kParamCols];
  const int64_t c = blockIdx.x * static_cast<int64_t>(kParamCols) + threadIdx.x;
  const int64_t begin = blockIdx.y * chunk_rows, end = begin + chunk_rows < rows ? begin + chunk_rows : rows;
  double sw = 0.0, sb = 0.0;  // in double, as the row sums
  if (c < cols)
    for (int64_t r = begin + threadIdx.y; r < end; r += kParamGroups) {
      const float g = to_f32(dy[r * cols + c]);
      sw += g * ((static_cast<double>(to_f32(x[r * cols + c])) - mean[r]) * rstd[r]);
      sb += g;
    }
  partial_w[threadIdx.y][threadIdx.x] = sw;
  partial_b[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  for (int k = 1; k < kParamGroups; ++k) {
    sw += partial_w[k][threadIdx.x];
    sb += partial_b[k][threadIdx.x];
  }
  if (partials != nullptr) {
    partials[2 * blockIdx.y * cols + c] = sw;
    partials[(2 * blockIdx.y + 1) * cols + c] = sb;
    return;
  }
  if (dweight != nullptr) store_blend(dweight + c, static_cast<float>(sw), beta_dw);
  if (dbias != nullptr) store_blend(dbias + c, static_cast<float>(sb), beta_db);
}

// The second launch: each column's chunk sums in chunk order, then the betas.
__global__ void layer_norm_param_grads_finish_kernel(const double* partials, int64_t chunks, int64_t cols,
                                                     float beta_dw, float* dweight, float beta_db, float* dbias) {
  CUMULUS_GRID_STRIDE_LOOP(c, cols) {
    double sw = 0.0, sb = 0.0;
    for (int64_t k = 0; k < chunks; ++k) {
      sw += partials[2 * k * cols + c];
      sb += partials[(2 * k + 1) * cols + c];
    }
    if (dweight != nullptr) store_blend(dweight + c, static_cast<float>(sw), beta_dw);
    if (dbias != nullptr) store_blend(dbias + c, static_cast<float>(sb), beta_db);
  }
}

// ---- slabs: [outer, dim, inner], one thread per element ----

template <typename T>
__global__ void copy_slab_kernel(const T* src, int64_t src_dim, int64_t src_start, T* dst, int64_t dst_dim,
                                 int64_t dst_start, int64_t length, int64_t inner, float beta, int64_t total) {
  CUMULUS_GRID_STRIDE_LOOP(e, total) {
    const int64_t i = e % inner, j = (e / inner) % length, o = e / (inner * length);
    const T v = src[(o * src_dim + src_start + j) * inner + i];
    T& out = dst[(o * dst_dim + dst_start + j) * inner + i];
    out = beta == 0.0f ? v : from_f32<T>(to_f32(v) + beta * to_f32(out));
  }
}

template <typename T>
__global__ void narrow_backward_kernel(const T* dy, int64_t dim, int64_t start, int64_t length, int64_t inner,
                                       float beta, T* dx, int64_t total) {
  CUMULUS_GRID_STRIDE_LOOP(e, total) {
    const int64_t i = e % inner, d = (e / inner) % dim, o = e / (inner * dim);
    const bool inside = d >= start && d < start + length;
    const float g = inside ? to_f32(dy[(o * length + d - start) * inner + i]) : 0.0f;
    store_blend(dx + e, g, beta);
  }
}

// ---- gathers ----

template <typename T>
__global__ void index_gather_kernel(const T* x, int64_t dim, const int32_t* indices, int64_t count, int64_t inner, T* y,
                                    int64_t total) {
  CUMULUS_GRID_STRIDE_LOOP(e, total) {
    const int64_t i = e % inner, j = (e / inner) % count, o = e / (inner * count);
    const int32_t d = indices[j];
    y[e] = d >= 0 && d < dim ? x[(o * dim + d) * inner + i] : from_f32<T>(NAN);
  }
}

template <typename T>
__global__ void zero_kernel(T* out, int64_t n) {
  CUMULUS_GRID_STRIDE_LOOP(e, n) { out[e] = from_f32<T>(0.0f); }
}

// Note [Sorted scatter-add]
// index_scatter_add sums, for each index d, dy over the positions j holding d in increasing j,
// starting from beta * dx: index_scatter_add_cpu's order, hence its bits, and no atomics. The
// positions are first sorted by (d, j) as 64-bit keys d << 32 | j (an index outside [0, dim) gets
// the largest key and is left out), by a bitonic network over the keys padded to a power of two
// (a fixed sequence of compare-exchanges: the same result whatever the scheduling); the steps whose
// pairs lie within a tile of kSortTile keys run in one launch per size in shared memory, the wider
// ones one launch per step over global memory (log^2 of count / kSortTile of them). Then every
// index's positions are one run of the sorted keys, in increasing j, and the block of the run's
// first key sums it. Work: O(count log^2 count) for the sort, O(count * outer * inner) for the sums.
// With partials (the form the engine calls), a run is summed in segments, so that a long run (an
// embedding's most frequent token) is not one block's sequential loop: the sorted positions are cut
// at every multiple of kSegment and at every run's start. A run inside one segment is summed by
// that segment's block as above (starting from beta * dx, in increasing j: the CPU's bits). A longer
// run's segments each sum their positions in order into a slot of `partials` (2 per window of
// kSegment positions: the segment starting at the window's start, and one starting inside it),
// then the block of the run's first key adds beta * dx and the segments' sums in segment order. A
// fixed order (the same bits on every run), no atomics; for long runs not the CPU's order, so
// within a few roundings of its sums.
constexpr uint64_t kNoPosition = ~uint64_t{0};

__global__ void scatter_keys_kernel(const int32_t* indices, int64_t count, int64_t dim, int64_t padded,
                                    uint64_t* keys) {
  CUMULUS_GRID_STRIDE_LOOP(j, padded) {
    const int32_t d = j < count ? indices[j] : -1;
    keys[j] = d >= 0 && d < dim ? static_cast<uint64_t>(d) << 32 | static_cast<uint64_t>(j) : kNoPosition;
  }
}

constexpr int kSortThreads = 512;
constexpr int64_t kSortTile = 2 * kSortThreads;

// Keys i < partner exchanged into the order of bitonic block `size` (ascending where i & size is 0).
__device__ __forceinline__ void compare_exchange(uint64_t& a, uint64_t& b, int64_t i, int64_t size) {
  if (((i & size) == 0) == (a > b)) {
    const uint64_t t = a;
    a = b;
    b = t;
  }
}

// One step of the network over global memory (stride >= kSortTile): a thread per pair.
__global__ void bitonic_step_kernel(uint64_t* keys, int64_t padded, int64_t size, int64_t stride) {
  CUMULUS_GRID_STRIDE_LOOP(p, padded / 2) {
    const int64_t i = p / stride * 2 * stride + p % stride;
    compare_exchange(keys[i], keys[i + stride], i, size);
  }
}

// The steps of sizes first_size..last_size whose stride is below `tile` (the block's keys, a power
// of two up to kSortTile), in shared memory: each block sorts its own tile of the keys.
__global__ void __launch_bounds__(kSortThreads)
    bitonic_tile_kernel(uint64_t* keys, int64_t tile, int64_t first_size, int64_t last_size) {
  __shared__ uint64_t t[kSortTile];
  const int64_t base = blockIdx.x * tile;
  for (int64_t k = threadIdx.x; k < tile; k += blockDim.x) t[k] = keys[base + k];
  __syncthreads();
  for (int64_t size = first_size; size <= last_size; size *= 2)
    for (int64_t stride = (size < tile ? size : tile) / 2; stride > 0; stride /= 2) {
      for (int64_t p = threadIdx.x; p < tile / 2; p += blockDim.x) {
        const int64_t i = p / stride * 2 * stride + p % stride;
        compare_exchange(t[i], t[i + stride], base + i, size);
      }
      __syncthreads();
    }
  for (int64_t k = threadIdx.x; k < tile; k += blockDim.x) keys[base + k] = t[k];
}

// One block per sorted key s; the block of a run's first key sums the run for each element (o, i)
// of its index's rows, in tiles of blockDim.
template <typename T>
__global__ void scatter_runs_kernel(const T* dy, int64_t outer, int64_t count, const uint64_t* keys, int64_t dim,
                                    int64_t inner, float beta, T* dx) {
  const int64_t s = blockIdx.x;
  const uint64_t d = keys[s] >> 32;
  if (keys[s] == kNoPosition || (s > 0 && keys[s - 1] >> 32 == d)) return;  // the whole block
  for (int64_t e = threadIdx.x; e < outer * inner; e += blockDim.x) {
    const int64_t o = e / inner, i = e % inner;
    T* out = dx + (o * dim + static_cast<int64_t>(d)) * inner + i;
    float acc = beta == 0.0f ? 0.0f : beta * to_f32(*out);
    for (int64_t t = s; t < count && keys[t] >> 32 == d; ++t) {
      const auto j = static_cast<int64_t>(keys[t] & 0xffffffffu);
      acc += to_f32(dy[(o * count + j) * inner + i]);
    }
    *out = from_f32<T>(acc);
  }
}

constexpr int64_t kSegment = 32;  // sorted positions per segment of a long run

// The slot in partials of the segment that starts at sorted position s.
__device__ __forceinline__ int64_t segment_slot(int64_t s) { return 2 * (s / kSegment) + (s % kSegment != 0); }

// One block per sorted key s; the block of a segment's first key sums the segment for each element
// (o, i) of its index's rows: into dx when the segment is its run's whole, else into its slot.
template <typename T>
__global__ void scatter_segments_kernel(const T* dy, int64_t outer, int64_t count, const uint64_t* keys, int64_t dim,
                                        int64_t inner, float beta, T* dx, float* partials) {
  const int64_t s = blockIdx.x, boundary = (s / kSegment + 1) * kSegment;
  const uint64_t d = keys[s] >> 32;
  const bool run_start = s == 0 || keys[s - 1] >> 32 != d;
  if (keys[s] == kNoPosition || (!run_start && s % kSegment != 0)) return;  // the whole block
  int64_t end = s + 1;
  while (end < count && end < boundary && keys[end] >> 32 == d) ++end;
  const bool whole_run = run_start && (end == count || keys[end] >> 32 != d);
  const int64_t elements = outer * inner;
  for (int64_t e = threadIdx.x; e < elements; e += blockDim.x) {
    const int64_t o = e / inner, i = e % inner;
    T* out = dx + (o * dim + static_cast<int64_t>(d)) * inner + i;
    float acc = whole_run && beta != 0.0f ? beta * to_f32(*out) : 0.0f;
    for (int64_t t = s; t < end; ++t)
      acc += to_f32(dy[(o * count + static_cast<int64_t>(keys[t] & 0xffffffffu)) * inner + i]);
    if (whole_run) *out = from_f32<T>(acc);
    else partials[segment_slot(s) * elements + e] = acc;
  }
}

// One block per sorted key s; the block of a long run's first key adds its segments' sums in order.
template <typename T>
__global__ void scatter_long_runs_kernel(int64_t outer, int64_t count, const uint64_t* keys, int64_t dim, int64_t inner,
                                         float beta, T* dx, const float* partials) {
  const int64_t s = blockIdx.x, boundary = (s / kSegment + 1) * kSegment;
  const uint64_t d = keys[s] >> 32;
  if (keys[s] == kNoPosition || (s > 0 && keys[s - 1] >> 32 == d)) return;  // not a run's start
  if (boundary >= count || keys[boundary] >> 32 != d) return;               // a short run: written
  const int64_t elements = outer * inner;
  for (int64_t e = threadIdx.x; e < elements; e += blockDim.x) {
    T* out = dx + ((e / inner) * dim + static_cast<int64_t>(d)) * inner + e % inner;
    float acc = beta == 0.0f ? 0.0f : beta * to_f32(*out);
    acc += partials[segment_slot(s) * elements + e];
    for (int64_t w = boundary; w < count && keys[w] >> 32 == d; w += kSegment)
      acc += partials[segment_slot(w) * elements + e];
    *out = from_f32<T>(acc);
  }
}

}  // namespace

// One block per row needs the rows to fit a grid's x dimension.
void check_rows(int64_t rows) {
  CUMULUS_CHECK(rows <= 2147483647, InvalidArgument, "layer_norm: ", rows, " rows is too many for one grid");
}

template <typename T>
void layer_norm_forward_cuda(const T* x, const float* weight, const float* bias, int64_t rows, int64_t cols, float eps,
                             T* y, float* mean, float* rstd, cudaStream_t stream) {
  if (rows == 0) return;
  check_rows(rows);
  launch<layer_norm_forward_kernel<T>>(static_cast<unsigned>(rows), kThreads, stream, x, weight, bias, cols, eps, y,
                                       mean, rstd);
}

template <typename T>
void layer_norm_backward_dx_cuda(const T* x, const T* dy, const float* weight, const float* mean, const float* rstd,
                                 int64_t rows, int64_t cols, float beta, T* dx, cudaStream_t stream) {
  if (rows == 0) return;
  check_rows(rows);
  launch<layer_norm_backward_dx_kernel<T>>(static_cast<unsigned>(rows), kThreads, stream, x, dy, weight, mean, rstd,
                                           cols, beta, dx);
}

int64_t layer_norm_param_grads_partials(int64_t rows, int64_t cols) {
  const int64_t chunks = param_chunks(rows);
  return chunks > 1 ? 2 * chunks * cols : 0;
}

template <typename T>
void layer_norm_param_grads_cuda(const T* x, const T* dy, const float* mean, const float* rstd, int64_t rows,
                                 int64_t cols, float beta_dw, float* dweight, float beta_db, float* dbias,
                                 double* partials, cudaStream_t stream) {
  if (cols == 0 || (dweight == nullptr && dbias == nullptr)) return;
  const int64_t chunks = partials != nullptr ? param_chunks(rows) : 1;
  const int64_t chunk_rows = chunks > 1 ? (rows + chunks - 1) / chunks : rows;
  const dim3 grid(static_cast<unsigned>((cols + kParamCols - 1) / kParamCols), static_cast<unsigned>(chunks));
  launch<layer_norm_param_grads_kernel<T>>(grid, dim3(kParamCols, kParamGroups), stream, x, dy, mean, rstd, rows, cols,
                                           chunk_rows, beta_dw, dweight, beta_db, dbias,
                                           chunks > 1 ? partials : nullptr);
  if (chunks > 1)
    launch<layer_norm_param_grads_finish_kernel>(blocks_for(cols), kThreads, stream, partials, chunks, cols, beta_dw,
                                                 dweight, beta_db, dbias);
}

template <typename T>
void layer_norm_param_grads_cuda(const T* x, const T* dy, const float* mean, const float* rstd, int64_t rows,
                                 int64_t cols, float beta_dw, float* dweight, float beta_db, float* dbias,
                                 cudaStream_t stream) {
  layer_norm_param_grads_cuda(x, dy, mean, rstd, rows, cols, beta_dw, dweight, beta_db, dbias,
                              static_cast<double*>(nullptr), stream);
}

template <typename T>
void copy_slab_cuda(const T* src, int64_t src_dim, int64_t src_start, T* dst, int64_t dst_dim, int64_t dst_start,
                    int64_t outer, int64_t length, int64_t inner, float beta, cudaStream_t stream) {
  const int64_t total = outer * length * inner;
  if (total == 0) return;
  launch<copy_slab_kernel<T>>(blocks_for(total), kThreads, stream, src, src_dim, src_start, dst, dst_dim, dst_start,
                              length, inner, beta, total);
}

template <typename T>
void narrow_backward_cuda(const T* dy, int64_t outer, int64_t dim, int64_t start, int64_t length, int64_t inner,
                          float beta, T* dx, cudaStream_t stream) {
  const int64_t total = outer * dim * inner;
  if (total == 0) return;
  launch<narrow_backward_kernel<T>>(blocks_for(total), kThreads, stream, dy, dim, start, length, inner, beta, dx,
                                    total);
}

template <typename T>
void index_gather_cuda(const T* x, int64_t outer, int64_t dim, const int32_t* indices, int64_t count, int64_t inner,
                       T* y, cudaStream_t stream) {
  const int64_t total = outer * count * inner;
  if (total == 0) return;
  launch<index_gather_kernel<T>>(blocks_for(total), kThreads, stream, x, dim, indices, count, inner, y, total);
}

template <typename T>
void fill_zero_cuda(T* out, int64_t n, cudaStream_t stream) {
  if (n > 0) launch<zero_kernel<T>>(blocks_for(n), kThreads, stream, out, n);
}

int64_t index_scatter_add_scratch(int64_t count) {
  int64_t padded = 1;
  while (padded < count) padded *= 2;
  return count == 0 ? 0 : padded;
}

// The keys of Note [Sorted scatter-add], sorted.
void sort_scatter_keys(const int32_t* indices, int64_t count, int64_t dim, uint64_t* keys, cudaStream_t stream) {
  const int64_t padded = index_scatter_add_scratch(count);
  launch<scatter_keys_kernel>(blocks_for(padded), kThreads, stream, indices, count, dim, padded, keys);
  const int64_t tile = std::min(padded, kSortTile);
  const auto tiles = static_cast<unsigned>(padded / tile);
  const auto threads = static_cast<unsigned>(std::max<int64_t>(tile / 2, 32));
  launch<bitonic_tile_kernel>(tiles, threads, stream, keys, tile, int64_t{2}, tile);
  for (int64_t size = 2 * tile; size <= padded; size *= 2) {
    for (int64_t stride = size / 2; stride >= tile; stride /= 2)
      launch<bitonic_step_kernel>(blocks_for(padded / 2), kThreads, stream, keys, padded, size, stride);
    launch<bitonic_tile_kernel>(tiles, threads, stream, keys, tile, size, size);
  }
}

int64_t index_scatter_add_partials(int64_t count, int64_t outer, int64_t inner) {
  return 2 * ((count + kSegment - 1) / kSegment) * outer * inner;
}

template <typename T>
void index_scatter_add_cuda(const T* dy, int64_t outer, int64_t count, const int32_t* indices, int64_t dim,
                            int64_t inner, float beta, T* dx, uint64_t* scratch, float* partials, cudaStream_t stream) {
  if (beta == 0.0f) fill_zero_cuda(dx, outer * dim * inner, stream);
  if (count == 0 || outer * inner == 0) return;
  CUMULUS_CHECK(count <= 2147483647, InvalidArgument, "index_scatter_add_cuda: ", count,
                " indices is too many for one grid");
  CUMULUS_CHECK(scratch != nullptr, InvalidArgument, "index_scatter_add_cuda: no scratch for the sorted positions");
  sort_scatter_keys(indices, count, dim, scratch, stream);
  // A warp per 32 elements of an index's rows, up to a block: an embedding's rows are narrow.
  const int64_t elements = outer * inner;
  const auto threads = static_cast<unsigned>(elements >= kThreads ? kThreads : (elements + 31) / 32 * 32);
  const auto blocks = static_cast<unsigned>(count);
  if (partials == nullptr) {
    launch<scatter_runs_kernel<T>>(blocks, threads, stream, dy, outer, count, scratch, dim, inner, beta, dx);
    return;
  }
  launch<scatter_segments_kernel<T>>(blocks, threads, stream, dy, outer, count, scratch, dim, inner, beta, dx,
                                     partials);
  launch<scatter_long_runs_kernel<T>>(blocks, threads, stream, outer, count, static_cast<const uint64_t*>(scratch), dim,
                                      inner, beta, dx, static_cast<const float*>(partials));
}

template <typename T>
void index_scatter_add_cuda(const T* dy, int64_t outer, int64_t count, const int32_t* indices, int64_t dim,
                            int64_t inner, float beta, T* dx, uint64_t* scratch, cudaStream_t stream) {
  index_scatter_add_cuda(dy, outer, count, indices, dim, inner, beta, dx, scratch, static_cast<float*>(nullptr),
                         stream);
}

#define CUMULUS_INSTANTIATE(T)                                                                                        \
  template void fill_zero_cuda(T*, int64_t, cudaStream_t);                                                            \
  template void layer_norm_forward_cuda(const T*, const float*, const float*, int64_t, int64_t, float, T*, float*,    \
                                        float*, cudaStream_t);                                                        \
  template void layer_norm_backward_dx_cuda(const T*, const T*, const float*, const float*, const float*, int64_t,    \
                                            int64_t, float, T*, cudaStream_t);                                        \
  template void layer_norm_param_grads_cuda(const T*, const T*, const float*, const float*, int64_t, int64_t, float,  \
                                            float*, float, float*, cudaStream_t);                                     \
  template void layer_norm_param_grads_cuda(const T*, const T*, const float*, const float*, int64_t, int64_t, float,  \
                                            float*, float, float*, double*, cudaStream_t);                            \
  template void copy_slab_cuda(const T*, int64_t, int64_t, T*, int64_t, int64_t, int64_t, int64_t, int64_t, float,    \
                               cudaStream_t);                                                                         \
  template void narrow_backward_cuda(const T*, int64_t, int64_t, int64_t, int64_t, int64_t, float, T*, cudaStream_t); \
  template void index_gather_cuda(const T*, int64_t, int64_t, const int32_t*, int64_t, int64_t, T*, cudaStream_t);    \
  template void index_scatter_add_cuda(const T*, int64_t, int64_t, const int32_t*, int64_t, int64_t, float, T*,       \
                                       uint64_t*, cudaStream_t);                                                      \
  template void index_scatter_add_cuda(const T*, int64_t, int64_t, const int32_t*, int64_t, int64_t, float, T*,       \
                                       uint64_t*, float*, cudaStream_t);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
