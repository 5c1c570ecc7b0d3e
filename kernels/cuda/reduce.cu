// Reductions on CUDA.
//   sum_rows: out[c] = sum_r x[r, c] (+ beta * out[c]): the bias gradient, accumulated in its own
//             kernel (Note [Gradient sinks]), in an order fixed by the shape (Note [Column sums]).
//   sum_all:  Note [Deterministic sum].
//   argmax_rows: one thread per row, kernels::row_argmax's rule (torch.argmax's: the first NaN wins).
// x may be stored in 16 bits (to_f32 loads it); the sums and comparisons are f32.
//
// Note [Column sums]
// sum_rows_cuda runs a 2-D grid: blockIdx.x picks 32 columns (neighbouring threads read
// neighbouring addresses), blockIdx.y a chunk of rows. Within a block, up to 8 row slices
// (threadIdx.y) each sum their contiguous rows of the chunk in order, then slice 0 adds the slices'
// sums in slice order. One chunk (rows up to kChunkRows, or the form without partials) writes the
// column sum with beta directly; more chunks (one per kChunkRows rows, at most kMaxChunks) write
// each chunk's sums into `partials` [chunks, cols], and a second launch adds them per column in
// chunk order, then applies beta. Every addition's operands are fixed by the shape, whatever order
// the blocks run in: the same bits on every run, no atomics. Up to kSliceRows rows there is one
// slice, the rows in order from 0: sum_rows_cpu's order, so with beta 0 its bits. At GPT-2 small's
// shape (8192 rows of 768) the grid is 24 x 32 blocks of 256 threads, each thread 32 rows, where one
// chunk gave 24 blocks whose threads summed 1024 rows each.
//
// Note [Deterministic sum]
// sum_all_cuda never uses atomics on values, so its result is the same bits on every run. Up to
// kSumAllOneBlock terms it is one block of kThreads running cuda_common::block_sum_all (each thread
// a strided partial sum, then block_sum): cross_entropy's one-block loss and fused_mlp's loss sum
// their row losses with that same function and block size, so their losses have sum_all_cuda's bits
// (their batches are far below the limit). Above it, two launches: a grid of sum_all_blocks(n)
// blocks, fixed by n alone, where thread t of block b sums x[b * kThreads + t + k * grid * kThreads]
// for k = 0, 1, ... in order and the block's block_sum goes to partials[b]; then one block sums the
// partials with block_sum_all and scales. Every addition's operands are fixed by n, whatever order
// the blocks run in.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace cumulus::kernels {

namespace {

using cuda_common::kThreads;
using cuda_common::launch;

constexpr int kRowCols = 32, kRowSlices = cuda_common::kThreads / kRowCols;
constexpr int64_t kSliceRows = 64;
constexpr int64_t kChunkRows = 256, kMaxChunks = 1024;  // Note [Column sums]

// The row slices for `rows`: one up to kSliceRows rows, then more, up to kRowSlices.
__host__ __device__ inline int64_t row_slices(int64_t rows) {
  const int64_t wanted = (rows + kSliceRows - 1) / kSliceRows;
  return wanted < 1 ? 1 : wanted > kRowSlices ? kRowSlices : wanted;
}

// The chunks of rows of the 2-D grid: one up to kChunkRows rows, then one per kChunkRows, capped.
int64_t row_chunks(int64_t rows) {
  return rows <= kChunkRows ? 1 : std::min((rows + kChunkRows - 1) / kChunkRows, kMaxChunks);
}

// Block (x, y): columns [32 x, 32 x + 32), rows [y chunk_rows, (y + 1) chunk_rows); its sums go to
// out (with beta) when partials is null, else to partials[y, c].
template <typename T>
__global__ void sum_rows_kernel(const T* x, int64_t rows, int64_t cols, int64_t chunk_rows, float beta, float* out,
                                float* partials) {
  __shared__ float slice_sums[kRowSlices][kRowCols];
  const int64_t c = blockIdx.x * static_cast<int64_t>(kRowCols) + threadIdx.x;
  const int64_t begin = blockIdx.y * chunk_rows, end = begin + chunk_rows < rows ? begin + chunk_rows : rows;
  const int64_t n = end > begin ? end - begin : 0;
  const int64_t slices = row_slices(n), per_slice = (n + slices - 1) / slices;
  const int64_t first = begin + threadIdx.y * per_slice, last = first + per_slice < end ? first + per_slice : end;
  float s = 0.0f;
  if (c < cols)
    for (int64_t r = first; r < last; ++r) s += to_f32(x[r * cols + c]);
  slice_sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  for (int64_t k = 1; k < slices; ++k) s += slice_sums[k][threadIdx.x];
  if (partials != nullptr) partials[blockIdx.y * cols + c] = s;
  else cuda_common::store_blend(out + c, s, beta);
}

// The second launch of Note [Column sums]: each column's chunk sums in chunk order, then beta.
__global__ void sum_rows_finish_kernel(const float* partials, int64_t chunks, int64_t cols, float beta, float* out) {
  CUMULUS_GRID_STRIDE_LOOP(c, cols) {
    float s = 0.0f;
    for (int64_t k = 0; k < chunks; ++k) s += partials[k * cols + c];
    cuda_common::store_blend(out + c, s, beta);
  }
}

__global__ void sum_all_kernel(const float* x, int64_t n, float scale, float* out) {
  const float total = cuda_common::block_sum_all(x, n);
  if (threadIdx.x == 0) out[0] = scale * total;
}

// The first of the two launches of Note [Deterministic sum]: block b's sum into partials[b].
__global__ void sum_all_partials_kernel(const float* x, int64_t n, float* partials) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  float s = 0.0f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride) s += x[i];
  s = cuda_common::block_sum(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

template <typename T>
__global__ void argmax_rows_kernel(const T* x, int64_t rows, int64_t cols, int32_t* out) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= rows) return;
  out[r] = row_argmax(x + r * cols, cols);
}

// One thread per row, uncapped: argmax_rows is not a grid-stride loop.
inline unsigned blocks(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

int64_t sum_rows_partials(int64_t rows, int64_t cols) {
  const int64_t chunks = row_chunks(rows);
  return chunks > 1 ? chunks * cols : 0;
}

template <typename T>
void sum_rows_cuda(const T* x, int64_t rows, int64_t cols, float beta, float* out, float* partials,
                   cudaStream_t stream) {
  if (cols == 0) return;
  const int64_t chunks = partials != nullptr ? row_chunks(rows) : 1;
  const int64_t chunk_rows = chunks > 1 ? (rows + chunks - 1) / chunks : rows;
  const auto col_blocks = static_cast<unsigned>((cols + kRowCols - 1) / kRowCols);
  const dim3 grid(col_blocks, static_cast<unsigned>(chunks));
  launch<sum_rows_kernel<T>>(grid, dim3(kRowCols, kRowSlices), stream, x, rows, cols, chunk_rows, beta, out,
                             chunks > 1 ? partials : nullptr);
  if (chunks > 1)
    launch<sum_rows_finish_kernel>(cuda_common::blocks_for(cols), kThreads, stream, partials, chunks, cols, beta, out);
}

template <typename T>
void sum_rows_cuda(const T* x, int64_t rows, int64_t cols, float beta, float* out, cudaStream_t stream) {
  sum_rows_cuda(x, rows, cols, beta, out, static_cast<float*>(nullptr), stream);
}

// Terms per thread of the first launch before the grid grows, and the grid's cap (the second
// launch's block sums at most 1024 partials, 4 per thread).
constexpr int64_t kSumAllTermsPerThread = 32, kSumAllMaxBlocks = 1024;

int64_t sum_all_blocks(int64_t n) {
  if (n <= kSumAllOneBlock) return 0;
  const int64_t wanted = (n + kThreads * kSumAllTermsPerThread - 1) / (kThreads * kSumAllTermsPerThread);
  return std::min(wanted, kSumAllMaxBlocks);
}

void sum_all_cuda(const float* x, int64_t n, float scale, float* out, float* partials, cudaStream_t stream) {
  const int64_t blocks = sum_all_blocks(n);
  if (blocks == 0) {
    launch<sum_all_kernel>(1, kThreads, stream, x, n, scale, out);
    return;
  }
  CUMULUS_CHECK(partials != nullptr, InvalidArgument, "sum_all_cuda: ", n, " terms need ", blocks,
                " floats of partials (sum_all_blocks)");
  launch<sum_all_partials_kernel>(static_cast<unsigned>(blocks), kThreads, stream, x, n, partials);
  launch<sum_all_kernel>(1, kThreads, stream, partials, blocks, scale, out);
}

void sum_all_cuda(const float* x, int64_t n, float scale, float* out, cudaStream_t stream) {
  sum_all_cuda(x, n, scale, out, nullptr, stream);
}

template <typename T>
void argmax_rows_cuda(const T* x, int64_t rows, int64_t cols, int32_t* out, cudaStream_t stream) {
  if (rows == 0) return;
  launch<argmax_rows_kernel<T>>(blocks(rows), kThreads, stream, x, rows, cols, out);
}

#define CUMULUS_INSTANTIATE(T)                                                                  \
  template void sum_rows_cuda(const T*, int64_t, int64_t, float, float*, float*, cudaStream_t); \
  template void sum_rows_cuda(const T*, int64_t, int64_t, float, float*, cudaStream_t);         \
  template void argmax_rows_cuda(const T*, int64_t, int64_t, int32_t*, cudaStream_t);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
