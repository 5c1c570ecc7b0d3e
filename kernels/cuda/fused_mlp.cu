// The fused MLP training path on CUDA (Note [Fused MLP] in engine/ops/fused_mlp.cpp): four kernels
// of our own, one launch each, for a stack of Linear + ReLU layers ending in softmax cross-entropy.
// At a training micro-batch (16 rows) the GPU waits on launches and memory latency, not on FLOPs,
// so each kernel does a whole step of the layer and keeps many loads in flight. f32 FMA throughout.
//   linear_forward: y = act(x W^T + b). A block of 4 warps owns a tile of 16 rows x 8 output
//       features (2 per warp). The x tile goes through shared memory in chunks of 128 k (8 KB);
//       each lane sums over k = lane, lane + 32, ... of the chunk for its 16 x 2 outputs, reading
//       W straight from global memory (a warp reads 128 consecutive bytes of a row). The next
//       chunk's x and W are loaded into registers while the current one is multiplied. At the end
//       a transposing butterfly leaves each lane with one of the warp's 32 outputs (31 shuffles
//       instead of 32 x 5). 8 features per block: 64 blocks for 512 outputs at 16 rows, a balance
//       between SMs in use and the L2 traffic of re-reading the x tile once per block.
//   head_forward: the same tile product for the logits (one block of 8 warps per 16 rows, class c
//       on warp c % 8), then one warp per row for max, sum of exponentials, row loss and softmax,
//       exactly as cross_entropy.cu computes them. The last block to finish (a counter after a
//       memory fence, as in optim.cu) sums the row losses with cuda_common::block_sum_all over 256
//       threads: cross_entropy_forward_cuda's order, so the loss has the unfused path's bits for
//       the same logits. 256 threads for the whole kernel so that sum needs no second block size.
//   head_backward and linear_backward: one launch each, the grid cut into parts by blockIdx.x
//       ranges (dx, then dw, then db; a null destination has no blocks). dw and db: each element
//       summed over the rows in order by one thread (a hidden layer's dw: 4 consecutive elements
//       of a row per thread, sharing the load of dz). The head's dx: one thread per element summing over
//       the classes in order. A hidden layer's dx = dz W: a block owns 32 k x 16 rows, its 8
//       warps split the reduction over n and meet in shared memory in warp order. dx's blocks come
//       first in the grid because they are the longest; the short dw blocks fill the other SMs.
//       With mask_relu, dx is zeroed where x <= 0 (relu_backward's test: a NaN x passes the
//       gradient), before the blend.
// Deterministic: no atomics on values (the counter only elects the block that sums), every sum in
// an order fixed by the shapes alone. Every index is bounds-checked, so any batch and width >= 1
// works (tiles past an edge read zeros and write nothing), with no alignment assumed on global data.
// A beta of 0 never reads the destination (cuda_common::store_blend's rule). The inputs are not written
// by the launch that reads them, so they are read through the read-only cache (__ldg).
#include <algorithm>
#include <climits>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace cumulus::kernels {

namespace {

using cuda_common::store_blend;
using cuda_common::kThreads;
using cuda_common::launch;

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// The forward tiles: 16 rows, K staged 128 floats at a time (4 per lane).
constexpr int kTileRows = 16;
constexpr int kChunk = 128;
constexpr int kKPerLane = kChunk / kWarp;

constexpr int kFwdWarps = 4;
constexpr int kFwdThreads = kFwdWarps * kWarp;
constexpr int kFwdFeaturesPerWarp = 2;
constexpr int kFwdFeatures = kFwdWarps * kFwdFeaturesPerWarp;  // per block

constexpr int kHeadWarps = kThreads / kWarp;                                 // 8
constexpr int kHeadSlots = static_cast<int>(kFusedMaxClasses) / kHeadWarps;  // classes per warp, at most
static_assert(kHeadSlots * kHeadWarps == kFusedMaxClasses, "every class has a warp");
static_assert(kFusedMaxClasses <= kWarp, "one lane per class in the softmax");

// The hidden layers' dx tile: 32 k (one per lane) x 16 rows; dz staged 256 n at a time.
constexpr int kDxCols = kWarp;
constexpr int kDxRows = 16;
constexpr int kDxChunk = kThreads;
constexpr int kDxWarps = kThreads / kWarp;
constexpr int kDxQuads = kDxChunk / 4 / kDxWarps;  // groups of 4 n per warp per chunk
static_assert(kDxWarps * kDxRows * kDxCols == kDxRows * kDxChunk, "the partial sums reuse the dz tile's memory");

__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A hidden layer's weight gradient: consecutive k per thread (see linear_backward_kernel).
constexpr int kDwPerThread = 4;

using cuda_common::warp_max;
using cuda_common::warp_sum;

// Sums each of v[0, V) over the warp's 32 lanes; returns to lane l the total of value
// l / (32 / V). Each stage halves the values a lane holds: it keeps one half, sends the other to
// its partner and adds what comes back, so V sums cost V - 1 shuffles (plus log2(32 / V) for the
// lanes that end up sharing a value) instead of 5 V. The tree is fixed: deterministic.
template <int V>
__device__ __forceinline__ float transpose_sum(float (&v)[V], int lane) {
  static_assert(V >= 1 && V <= kWarp && (V & (V - 1)) == 0, "a power of two up to the warp size");
  constexpr int kStages = V >= 32 ? 5 : V >= 16 ? 4 : V >= 8 ? 3 : V >= 4 ? 2 : V >= 2 ? 1 : 0;  // log2(V)
#pragma unroll
  for (int stage = 0; stage < kStages; ++stage) {  // counted, so that it unrolls and v stays in registers
    const int half = V >> (stage + 1);             // the lane holds 2 * half values
    const int o = half * (kWarp / V);              // 16 first, whatever V
    const bool upper = (lane & o) != 0;
#pragma unroll
    for (int i = 0; i < V / 2; ++i) {  // a constant trip count, for the same reason
      if (i >= half) break;
      const float lo = v[i], hi = v[i + half];  // values first: a select of addresses would put v in local memory
      const float send = upper ? lo : hi;
      const float keep = upper ? hi : lo;
      v[i] = keep + __shfl_xor_sync(kFullMask, send, o);
    }
  }
  float s = v[0];
#pragma unroll
  for (int stage = kStages; stage < 5; ++stage) s += __shfl_xor_sync(kFullMask, s, 16 >> stage);
  return s;
}

// ---- the forward tile product --------------------------------------------------------------------

// One thread's share of an x chunk [kTileRows][kChunk]: elements tid, tid + T, ... of the row-major
// tile, so neighbouring threads read neighbouring k (coalesced). Zero past the batch or past `in`.
template <int T>
struct XChunk {
  static constexpr int kPerThread = kTileRows * kChunk / T;
  static_assert(kPerThread * T == kTileRows * kChunk, "the block covers the chunk evenly");
  float v[kPerThread];

  __device__ __forceinline__ void load(const float* __restrict__ x, int64_t batch, int64_t in, int64_t row0, int64_t k0,
                                       int tid) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int e = i * T + tid;
      const int64_t row = row0 + e / kChunk, k = k0 + e % kChunk;
      v[i] = (row < batch && k < in) ? __ldg(x + row * in + k) : 0.0f;
    }
  }
  __device__ __forceinline__ void store(float (&xs)[kTileRows][kChunk], int tid) const {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int e = i * T + tid;
      xs[e / kChunk][e % kChunk] = v[i];
    }
  }
};

// The lane's W values for a chunk: w[f][j] = W row f at k0 + lane + 32 j (0 for a missing row or
// past `in`).
template <int F>
__device__ __forceinline__ void load_w(const float* const (&wrow)[F], int64_t in, int64_t k0, int lane,
                                       float (&w)[F][kKPerLane]) {
#pragma unroll
  for (int f = 0; f < F; ++f)
#pragma unroll
    for (int j = 0; j < kKPerLane; ++j) {
      const int64_t k = k0 + lane + j * kWarp;
      w[f][j] = (wrow[f] != nullptr && k < in) ? __ldg(wrow[f] + k) : 0.0f;
    }
}

// acc[f][r] = the lane's part of sum_k x[row0 + r, k] * W_f[k], over k = lane (mod 32), for the
// warp's F weight rows (wrow[f], nullptr for none: its acc stays 0). Called by all T threads of
// the block (it synchronizes). Each lane's k run in increasing order: deterministic.
template <int T, int F>
__device__ __forceinline__ void tile_product(const float* __restrict__ x, int64_t batch, int64_t in, int64_t row0,
                                             const float* const (&wrow)[F], float (&xs)[kTileRows][kChunk],
                                             float (&acc)[F][kTileRows]) {
  const int tid = threadIdx.x, lane = tid % kWarp;
#pragma unroll
  for (int f = 0; f < F; ++f)
#pragma unroll
    for (int r = 0; r < kTileRows; ++r) acc[f][r] = 0.0f;
  XChunk<T> next;
  float w_next[F][kKPerLane];
  if (in > 0) {
    next.load(x, batch, in, row0, 0, tid);
    load_w(wrow, in, 0, lane, w_next);
  }
  for (int64_t k0 = 0; k0 < in; k0 += kChunk) {
    __syncthreads();  // every warp is done with the previous chunk
    next.store(xs, tid);
    float w[F][kKPerLane];
#pragma unroll
    for (int f = 0; f < F; ++f)
#pragma unroll
      for (int j = 0; j < kKPerLane; ++j) w[f][j] = w_next[f][j];
    __syncthreads();  // the chunk is staged
    // The next chunk's loads are issued now and land while this chunk is multiplied.
    if (k0 + kChunk < in) {
      next.load(x, batch, in, row0, k0 + kChunk, tid);
      load_w(wrow, in, k0 + kChunk, lane, w_next);
    }
#pragma unroll
    for (int j = 0; j < kKPerLane; ++j) {
      float xv[kTileRows];
#pragma unroll
      for (int r = 0; r < kTileRows; ++r) xv[r] = xs[r][lane + j * kWarp];  // consecutive banks
#pragma unroll
      for (int f = 0; f < F; ++f) {
        if (wrow[f] == nullptr) continue;  // warp-uniform: a missing row costs no FMAs
#pragma unroll
        for (int r = 0; r < kTileRows; ++r) acc[f][r] = fmaf(xv[r], w[f][j], acc[f][r]);
      }
    }
  }
}

// Block b: row tile b / feature_tiles, feature tile b % feature_tiles (neighbouring blocks share
// the x tile, which they then find in L2). Warp w owns features n0 + 2w and n0 + 2w + 1.
__global__ void __launch_bounds__(kFwdThreads)
    linear_forward_kernel(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                          int64_t batch, int64_t in, int64_t out, bool relu, float* __restrict__ y,
                          int64_t feature_tiles) {
  __shared__ float xs[kTileRows][kChunk];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x / feature_tiles) * kTileRows;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x % feature_tiles) * kFwdFeatures + warp * kFwdFeaturesPerWarp;
  const float* wrow[kFwdFeaturesPerWarp];
#pragma unroll
  for (int f = 0; f < kFwdFeaturesPerWarp; ++f) wrow[f] = n0 + f < out ? w + (n0 + f) * in : nullptr;
  float acc[kFwdFeaturesPerWarp][kTileRows];
  tile_product<kFwdThreads>(x, batch, in, row0, wrow, xs, acc);
  // Value r * 2 + f is output (row r, feature f): lane l ends with row l / 2, feature l % 2.
  float v[kTileRows * kFwdFeaturesPerWarp];
#pragma unroll
  for (int r = 0; r < kTileRows; ++r)
#pragma unroll
    for (int f = 0; f < kFwdFeaturesPerWarp; ++f) v[r * kFwdFeaturesPerWarp + f] = acc[f][r];
  const float s = transpose_sum(v, lane);
  const int64_t row = row0 + lane / kFwdFeaturesPerWarp, n = n0 + lane % kFwdFeaturesPerWarp;
  if (row < batch && n < out) {
    const float t = s + __ldg(b + n);
    // `t <= 0 ? 0 : t`, never fmaxf: NaN propagates, as relu_forward does.
    y[row * out + n] = relu && t <= 0.0f ? 0.0f : t;
  }
}

// ---- the head's forward ------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads)
    head_forward_kernel(const float* __restrict__ h, const float* __restrict__ w, const float* __restrict__ b,
                        const int32_t* __restrict__ labels, int64_t batch, int64_t in, int64_t classes, float scale,
                        float* __restrict__ probs, float* row_loss, float* loss, unsigned* arrival_counter) {
  __shared__ float xs[kTileRows][kChunk];
  __shared__ float logits_s[kTileRows][kFusedMaxClasses];
  __shared__ bool last;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kTileRows;

  // Logits: warp w owns classes w, w + 8, w + 16, w + 24.
  const float* wrow[kHeadSlots];
#pragma unroll
  for (int f = 0; f < kHeadSlots; ++f) {
    const int64_t c = warp + f * kHeadWarps;
    wrow[f] = c < classes ? w + c * in : nullptr;
  }
  float acc[kHeadSlots][kTileRows];
  tile_product<kThreads>(h, batch, in, row0, wrow, xs, acc);
#pragma unroll
  for (int f = 0; f < kHeadSlots; ++f) {
    const int64_t c = warp + f * kHeadWarps;
    if (c >= classes) continue;                   // warp-uniform
    const float s = transpose_sum(acc[f], lane);  // lane l: row l / 2 (lanes 2i and 2i + 1 agree)
    if (lane % 2 == 0) logits_s[lane / 2][c] = s + __ldg(b + c);
  }
  __syncthreads();

  // Softmax and loss: one warp per row, lane = class; cross_entropy.cu's operations in its order
  // (warp_row_stats, row_loss_by_warp), so equal logits give equal bits.
  for (int r = warp; r < kTileRows; r += kHeadWarps) {
    const int64_t row = row0 + r;
    if (row >= batch) break;  // warp-uniform, and the later rows are past the batch too
    const bool active = lane < classes;
    const float x = active ? logits_s[r][lane] : -INFINITY;
    const float m = warp_max(x);
    const float e = active ? expf(x - m) : 0.0f;
    const float s = warp_sum(e);
    const float log_sum = logf(s);
    if (lane == 0) {
      const int32_t y = __ldg(labels + row);
      row_loss[row] = (y >= 0 && y < classes) ? (m - logits_s[r][y]) + log_sum : NAN;
    }
    if (active) probs[row * classes + lane] = e / s;
  }

  // The last block to arrive sums the losses (optim.cu's pattern). The row losses come from several
  // warps, so every thread fences its own stores, the barrier hands them to thread 0, and thread 0
  // fences again before the arrival is counted: they are visible GPU-wide before it. The last block
  // fences before reading them (which also drops stale L1 lines).
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(arrival_counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  // blockDim.x == kThreads: sum_all_cuda's order for a batch up to kSumAllOneBlock (Note [Deterministic sum])
  const float total = cuda_common::block_sum_all(row_loss, batch);
  if (threadIdx.x == 0) {
    loss[0] = scale * total;
    *arrival_counter = 0;  // every block has arrived: ready for the next launch
  }
}

// ---- the head's backward -----------------------------------------------------------------------

// dlogits[row, c] = g * (probs[row, c] - onehot), cross_entropy_backward's form.
__device__ __forceinline__ float head_dlogit(const float* __restrict__ probs, int32_t label, float g, int64_t row,
                                             int64_t c, int64_t classes) {
  return g * (__ldg(probs + row * classes + c) - (label == c ? 1.0f : 0.0f));
}

// Blocks [0, dx_blocks): dx; then [.., + dw_blocks): dw; then db.
__global__ void __launch_bounds__(kThreads)
    head_backward_kernel(const float* __restrict__ probs, const int32_t* __restrict__ labels,
                         const float* __restrict__ grad_loss, float scale, const float* __restrict__ h,
                         const float* __restrict__ w, int64_t batch, int64_t in, int64_t classes, FusedGradients grads,
                         unsigned dx_blocks, unsigned dw_blocks) {
  const float g = __ldg(grad_loss) * scale;
  unsigned block = blockIdx.x;
  if (block < dx_blocks) {
    // dx[row, k] = sum_c dlogits[row, c] W[c, k], c in order; masked by the ReLU that made h.
    const int64_t e = static_cast<int64_t>(block) * kThreads + threadIdx.x;
    if (e >= batch * in) return;
    const int64_t row = e / in, k = e % in;
    const int32_t label = __ldg(labels + row);
    float v = 0.0f;
    for (int64_t c = 0; c < classes; ++c)
      v = fmaf(head_dlogit(probs, label, g, row, c, classes), __ldg(w + c * in + k), v);
    if (grads.mask_relu && __ldg(h + e) <= 0.0f) v = 0.0f;  // relu_backward's test: NaN passes
    store_blend(grads.dx + e, v, grads.beta_x);
    return;
  }
  block -= dx_blocks;
  if (block < dw_blocks) {
    // dw[c, k] = sum_row dlogits[row, c] h[row, k], rows in order.
    const int64_t e = static_cast<int64_t>(block) * kThreads + threadIdx.x;
    if (e >= classes * in) return;
    const int64_t c = e / in, k = e % in;
    float v = 0.0f;
#pragma unroll 4
    for (int64_t row = 0; row < batch; ++row)
      v = fmaf(head_dlogit(probs, __ldg(labels + row), g, row, c, classes), __ldg(h + row * in + k), v);
    store_blend(grads.dw + e, v, grads.beta_w);
    return;
  }
  block -= dw_blocks;
  // db[c] = sum_row dlogits[row, c], rows in order.
  const int64_t c = static_cast<int64_t>(block) * kThreads + threadIdx.x;
  if (c >= classes) return;
  float v = 0.0f;
#pragma unroll 4
  for (int64_t row = 0; row < batch; ++row) v += head_dlogit(probs, __ldg(labels + row), g, row, c, classes);
  store_blend(grads.db + c, v, grads.beta_b);
}

// ---- a hidden layer's backward -----------------------------------------------------------------

// dx = dz W for the tile of block `tile` (row tile tile / col_tiles, k tile tile % col_tiles): lane
// = k, warp w sums n in groups of 4 (4 (w + 8 j) + t within each chunk of 256), each group in
// increasing n, then the 8 warps' partials are added in warp order. All threads of the block call it.
__device__ __forceinline__ void linear_dx_tile(const float* __restrict__ dz, const float* __restrict__ x,
                                               const float* __restrict__ w, int64_t batch, int64_t in, int64_t out,
                                               const FusedGradients& grads, int64_t tile, int64_t col_tiles,
                                               float* smem) {
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int64_t row0 = tile / col_tiles * kDxRows, col0 = tile % col_tiles * kDxCols;
  const int64_t k = col0 + lane;
  const bool k_ok = k < in;
  float(*dzs)[kDxChunk] = reinterpret_cast<float(*)[kDxChunk]>(smem);
  float acc[kDxRows];
#pragma unroll
  for (int r = 0; r < kDxRows; ++r) acc[r] = 0.0f;
  for (int64_t n0 = 0; n0 < out; n0 += kDxChunk) {
    // This chunk's W column for the warp's groups and the dz tile: all loads issued before the
    // barrier, so they are in flight together.
    float wv[kDxQuads][4];
#pragma unroll
    for (int j = 0; j < kDxQuads; ++j)
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const int64_t n = n0 + 4 * (warp + j * kDxWarps) + t;
        wv[j][t] = (k_ok && n < out) ? __ldg(w + n * in + k) : 0.0f;
      }
    float dzr[kDxRows];
#pragma unroll
    for (int i = 0; i < kDxRows; ++i) {
      const int64_t row = row0 + i, n = n0 + tid;
      dzr[i] = (row < batch && n < out) ? __ldg(dz + row * out + n) : 0.0f;
    }
    __syncthreads();  // every warp is done with the previous chunk
#pragma unroll
    for (int i = 0; i < kDxRows; ++i) dzs[i][tid] = dzr[i];
    __syncthreads();  // the chunk is staged
#pragma unroll
    for (int j = 0; j < kDxQuads; ++j) {
      const int q = warp + j * kDxWarps;
      if (n0 + 4 * q >= out) break;  // warp-uniform; the later groups are past `out` too
#pragma unroll
      for (int r = 0; r < kDxRows; ++r) {
        const float4 d = reinterpret_cast<const float4*>(dzs[r])[q];  // one broadcast load for 4 n
        acc[r] = fmaf(d.x, wv[j][0], acc[r]);
        acc[r] = fmaf(d.y, wv[j][1], acc[r]);
        acc[r] = fmaf(d.z, wv[j][2], acc[r]);
        acc[r] = fmaf(d.w, wv[j][3], acc[r]);
      }
    }
  }
  // The warps' partials through the same shared memory: part[warp][r][lane].
  __syncthreads();  // every warp is done with the dz tile
  float(*part)[kDxRows][kDxCols] = reinterpret_cast<float(*)[kDxRows][kDxCols]>(smem);
#pragma unroll
  for (int r = 0; r < kDxRows; ++r) part[warp][r][lane] = acc[r];
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kDxRows * kDxCols / kThreads; ++i) {
    const int o = i * kThreads + tid;
    const int r = o / kDxCols, c = o % kDxCols;
    float s = part[0][r][c];
#pragma unroll
    for (int p = 1; p < kDxWarps; ++p) s += part[p][r][c];
    const int64_t row = row0 + r, kk = col0 + c;
    if (row < batch && kk < in) {
      if (grads.mask_relu && __ldg(x + row * in + kk) <= 0.0f) s = 0.0f;  // relu_backward's test: NaN passes
      store_blend(grads.dx + row * in + kk, s, grads.beta_x);
    }
  }
}

// Blocks [0, dx_blocks): dx tiles; then [.., + dw_blocks): dw; then db.
__global__ void __launch_bounds__(kThreads)
    linear_backward_kernel(const float* __restrict__ dz, const float* __restrict__ x, const float* __restrict__ w,
                           int64_t batch, int64_t in, int64_t out, FusedGradients grads, unsigned dx_blocks,
                           unsigned dw_blocks, int64_t dx_col_tiles) {
  // The dz tile, then the warps' partial sums (dx's blocks only; 16 KB, aligned for float4 reads).
  __shared__ __align__(16) float smem[kDxRows * kDxChunk];
  unsigned block = blockIdx.x;
  if (block < dx_blocks) {
    linear_dx_tile(dz, x, w, batch, in, out, grads, block, dx_col_tiles, smem);
    return;
  }
  block -= dx_blocks;
  if (block < dw_blocks) {
    // dw[n, k] = sum_row dz[row, n] x[row, k], rows in order, one accumulator per element. A
    // thread takes kDwPerThread consecutive k of one n: dz[row, n] is loaded once for all of them,
    // and a quarter of the threads (and waves of blocks) covers the matrix. Unrolled so the loads
    // of 4 rows are in flight together.
    const int64_t groups_per_row = ceil_div(in, kDwPerThread);
    const int64_t group = static_cast<int64_t>(block) * kThreads + threadIdx.x;
    if (group >= out * groups_per_row) return;
    const int64_t n = group / groups_per_row, k0 = group % groups_per_row * kDwPerThread;
    const int kn = static_cast<int>(in - k0 < kDwPerThread ? in - k0 : kDwPerThread);  // the last group may be short
    float v[kDwPerThread] = {};
#pragma unroll 4
    for (int64_t row = 0; row < batch; ++row) {
      const float d = __ldg(dz + row * out + n);
      const float* xr = x + row * in + k0;
#pragma unroll
      for (int i = 0; i < kDwPerThread; ++i)
        if (i < kn) v[i] = fmaf(d, __ldg(xr + i), v[i]);
    }
#pragma unroll
    for (int i = 0; i < kDwPerThread; ++i)
      if (i < kn) store_blend(grads.dw + n * in + k0 + i, v[i], grads.beta_w);
    return;
  }
  block -= dw_blocks;
  // db[n] = sum_row dz[row, n], rows in order.
  const int64_t n = static_cast<int64_t>(block) * kThreads + threadIdx.x;
  if (n >= out) return;
  float v = 0.0f;
#pragma unroll 4
  for (int64_t row = 0; row < batch; ++row) v += __ldg(dz + row * out + n);
  store_blend(grads.db + n, v, grads.beta_b);
}

// Blocks for one thread per element of n elements (0 when the destination is absent).
inline int64_t element_blocks(const float* dst, int64_t n) { return dst == nullptr ? 0 : ceil_div(n, kThreads); }

unsigned grid_size(int64_t blocks, const char* who) {
  CUMULUS_CHECK(blocks <= INT_MAX, InvalidArgument, who, ": ", blocks, " blocks is too many for one grid");
  return static_cast<unsigned>(blocks);
}

}  // namespace

void fused_linear_forward_cuda(const float* x, const float* w, const float* b, int64_t batch, int64_t in, int64_t out,
                               bool relu, float* y, cudaStream_t stream) {
  if (batch <= 0 || out <= 0) return;
  const int64_t feature_tiles = ceil_div(out, kFwdFeatures);
  const unsigned blocks = grid_size(feature_tiles * ceil_div(batch, kTileRows), "fused_linear_forward");
  launch<linear_forward_kernel>(blocks, kFwdThreads, stream, x, w, b, batch, in, out, relu, y, feature_tiles);
}

void fused_head_forward_cuda(const float* h, const float* w, const float* b, const int32_t* labels, int64_t batch,
                             int64_t in, int64_t classes, float scale, float* probs, float* row_loss, float* loss,
                             unsigned* arrival_counter, cudaStream_t stream) {
  CUMULUS_CHECK(classes >= 1 && classes <= kFusedMaxClasses, InvalidArgument, "fused_head_forward: ", classes,
                " classes (1 to ", kFusedMaxClasses, " supported)");
  // At least one block, so that an empty batch still writes loss = 0 (as sum_all_cuda does).
  const unsigned blocks = grid_size(std::max<int64_t>(1, ceil_div(batch, kTileRows)), "fused_head_forward");
  launch<head_forward_kernel>(blocks, kThreads, stream, h, w, b, labels, batch, in, classes, scale, probs, row_loss,
                              loss, arrival_counter);
}

void fused_head_backward_cuda(const float* probs, const int32_t* labels, const float* grad_loss, float scale,
                              const float* h, const float* w, int64_t batch, int64_t in, int64_t classes,
                              const FusedGradients& grads, cudaStream_t stream) {
  CUMULUS_CHECK(classes >= 1 && classes <= kFusedMaxClasses, InvalidArgument, "fused_head_backward: ", classes,
                " classes (1 to ", kFusedMaxClasses, " supported)");
  const int64_t dx_blocks = element_blocks(grads.dx, batch * in);
  const int64_t dw_blocks = element_blocks(grads.dw, classes * in);
  const int64_t db_blocks = element_blocks(grads.db, classes);
  const int64_t blocks = dx_blocks + dw_blocks + db_blocks;
  if (blocks == 0) return;
  launch<head_backward_kernel>(grid_size(blocks, "fused_head_backward"), kThreads, stream, probs, labels, grad_loss,
                               scale, h, w, batch, in, classes, grads, static_cast<unsigned>(dx_blocks),
                               static_cast<unsigned>(dw_blocks));
}

void fused_linear_backward_cuda(const float* dz, const float* x, const float* w, int64_t batch, int64_t in, int64_t out,
                                const FusedGradients& grads, cudaStream_t stream) {
  const int64_t col_tiles = ceil_div(in, kDxCols);
  const int64_t dx_blocks = grads.dx == nullptr ? 0 : col_tiles * ceil_div(batch, kDxRows);
  const int64_t dw_blocks = element_blocks(grads.dw, out * ceil_div(in, kDwPerThread));
  const int64_t db_blocks = element_blocks(grads.db, out);
  const int64_t blocks = dx_blocks + dw_blocks + db_blocks;
  if (blocks == 0) return;
  launch<linear_backward_kernel>(grid_size(blocks, "fused_linear_backward"), kThreads, stream, dz, x, w, batch, in, out,
                                 grads, static_cast<unsigned>(dx_blocks), static_cast<unsigned>(dw_blocks), col_tiles);
}

}  // namespace cumulus::kernels
