// Register-tiled CUDA kernels of fused attention (engine/ops/attention.cpp; the algorithm is Note
// [Fused attention] in kernels/cpu/attention.cpp), in f32 on CUDA cores: the opt-in replacement of
// attention.cu's row kernels (CUMULUS_CUDA_ATTENTION_KERNELS=tiled), same contracts and geometry.
//
// Note [Tiled CUDA attention kernels]
// - Head size: each kernel is compiled for D = 32, 64 and 128; a head of d <= 128 columns runs in
//   the smallest that holds it, its columns past d zero (computed on like the others: only d = 32,
//   64 and 128 waste nothing). d > 128 is refused with an error naming the sizes.
// - Register tiles, as a SIMT GEMM: every product of the algorithm (S = Q K^T, dP = dO V^T, O += P V,
//   dV += P^T dO, dK += dS^T Q, dQ += dS K) is a block's product of two f32 tiles staged in shared
//   memory, each thread computing an RM x RN (or RM x D/8) tile of it in registers. The threads
//   form TY rows of 8 lanes (tx = thread % 8): a thread owns rows ty + TY a and keys tx + 8 b, and
//   output columns in float4 slices tx + 8 h. Per float4 step of the inner dimension a thread
//   reads RM + RN float4s for 4 RM RN multiply-adds (10.7 per load at 4 x 8); the 8 lanes of a row
//   are one warp's, so a row's max and sum are a 3-step xor butterfly (every lane gets the same
//   bits). The accumulators are arrays indexed only by loops unrolled at compile time: registers
//   (the build fails a kernel of this file with a stack frame: scripts/cuda_resources.py).
// - Shared tiles are row-major f32 with each row's float4 slices permuted (slice s of row r at
//   s ^ (r % 8)): the 8 lanes reading 8 consecutive rows at one slice hit 8 different bank groups,
//   the 4 rows of a warp's threads read by broadcast, and staging writes whole slices; no padding.
// - Tiles, all with 128 threads, 8 lanes a row. The forward: 64 query rows x 64 keys (4 x 8 a
//   thread) for D <= 64, 32 x 32 (2 x 4) for D = 128, in static shared memory (P takes the K tile's
//   place once S is formed): 48 KiB, 3 blocks an SM by their registers. The backward: 64 x 64 (4 x
//   8) for D <= 64, 64 x 32 (4 x 4) for D = 128, every tile of a kernel its own in dynamic shared
//   memory (cuda_common::launch_with_shared): 64-113 KiB, 2-3 blocks an SM on an H100 (1 for D >=
//   64 on an A100). The registers (ptxas, sm_90): 168 at most, no stack.
// - Forward: the online softmax a key tile at a time: masked scores (past the row's causal end, or
//   past the keys) are -inf, one rescale of the output tile per key tile, each lane's share of the
//   row sum rescaled with it and the shares added by the butterfly at the end; lse = m + log(l).
// - Blocks run tile by tile over the heads, the tiles with the most work first (under a causal
//   mask the last query tiles and the first key tiles), so the grid's last wave is the short ones.
// - Backward: delta_i = rowsum(do_i o_i) once (its own kernel, 8 lanes a row in double); dk and dv,
//   a block per (head, key tile) looping over the query tiles that see it; dq, a block per (head,
//   query tile) looping over its keys. Both form S and dP from the staged tiles and the saved lse:
//   without atomics no block can add into another block's rows, so the scores are formed twice
//   (FlashAttention-2 forms them once and adds dq with atomics), the price of the same bits on
//   every run: 9 tile products per (query, key) tile pair in all, against FlashAttention-2's 7.
// - The floor at GPT-2 small's shape (8 x 12 heads, T = 1024, D = 64, causal): each product is 6.4
//   GFLOP, the 9 are 58 GFLOP a layer and micro-batch, 0.87 ms at an H200's 67 TFLOP/s of f32 FMA;
//   PyTorch's f32 SDPA took 1.9 ms for its 7 (24 TFLOP/s, 2026-11-29), and the fp32 GPT's target
//   asks about 2.35 ms of these kernels (37% of the peak). Memory is no bound: q, k, v, o and their
//   gradients are 25 MB, 8 us at 3 TB/s, re-read from L2 by each block. Shared memory is: an SM
//   delivers 32 floats a clock to its 128 FMA lanes, so an RM x RN thread tile keeps them at most
//   RM RN / (4 (RM + RN)) busy: 67% at 4 x 8, the tile of every product here at D = 64, which puts
//   this design's floor near 1.3 ms. 8 x 8 tiles would reach 100% with more registers a thread.
// Every sum has a fixed order (an accumulator is one thread's, in key or row order; a row's
// statistics a fixed butterfly): no atomics, the same bits on every run.
// Against the CPU: the same sums in another order and the device's expf, so within a few ulp per
// term (tests/emulated/attention_test.cpp). Nothing here has run on a GPU yet, so it is opt-in: the
// CPU emulation (tests/emulation) runs this source; the build's ptxas report gives the registers.
#include <cmath>

#include "kernels/cuda/attention_kernels.h"
#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/unroll.cuh"

namespace cumulus::kernels {

namespace {

using cuda_common::dynamic_shared;
using cuda_common::kThreads;
using cuda_common::launch;
using cuda_common::launch_with_shared;

constexpr int kLanes = 8;  // lanes along the key (and output column) side of a thread's tile

// The launch bounds: 128 threads a block. Blocks resident per SM: the forward's 48 KiB of shared
// memory allow 4, the backward's 64-113 KiB 2-3; asked for 3 and 2, ptxas keeps them within 168
// registers (at 4 forward blocks, 128, it spills).
constexpr int kForwardMaxThreads = 128, kBackwardMaxThreads = 128, kMinForwardBlocksPerSm = 3,
              kMinBackwardBlocksPerSm = 2;

// A kernel's tiles: TY x 8 threads, each owning RM rows and RN keys of a kRows x kKeys score tile.
template <int D, int TY, int RM, int RN>
struct Tiles {
  static_assert(D == 32 || D == 64 || D == 128, "attention kernels are compiled for D = 32, 64 and 128");
  static constexpr int kTy = TY, kRm = RM, kRn = RN;
  static constexpr int kThreads = TY * kLanes;
  static constexpr int kRows = TY * RM;             // query rows of a tile
  static constexpr int kKeys = kLanes * RN;         // keys of a tile
  static constexpr int kSlices = D / (4 * kLanes);  // float4 slices of an output row a thread owns
  static constexpr int kCols = 4 * kSlices;
};

template <int D>
using ForwardTiles = Tiles<D, 16, D <= 64 ? 4 : 2, D <= 64 ? 8 : 4>;
template <int D>
using BackwardTiles = Tiles<D, 16, 4, D <= 64 ? 8 : 4>;

// The backward's shared tiles, in dynamic shared memory (over the 48 KiB of static): float counts.
template <int D>
struct BackwardShared {
  using Tl = BackwardTiles<D>;
  static constexpr int kRowTile = Tl::kRows * D, kKeyTile = Tl::kKeys * D, kScores = Tl::kRows * Tl::kKeys;
  // dk and dv: K, V, Q, dO, P^T, dS^T, then lse and delta of the query tile
  static constexpr std::size_t kKeysKernelBytes =
      sizeof(float) * (2 * kKeyTile + 2 * kRowTile + 2 * kScores + 2 * Tl::kRows);
  // dq: Q, dO, K, V, dS, then lse and delta
  static constexpr std::size_t kQueriesKernelBytes =
      sizeof(float) * (2 * kRowTile + 2 * kKeyTile + kScores + 2 * Tl::kRows);
};

__device__ __forceinline__ int lane_x() { return static_cast<int>(threadIdx.x) % kLanes; }
__device__ __forceinline__ int lane_y() { return static_cast<int>(threadIdx.x) / kLanes; }

// The float4 index of slice s of row r in a shared tile of `Cols` columns (the permuted layout).
template <int Cols>
__device__ __forceinline__ int slice_at(int r, int s) {
  constexpr int kSlicesPerRow = Cols / 4, kMask = (kSlicesPerRow < 8 ? kSlicesPerRow : 8) - 1;
  return r * kSlicesPerRow + (s ^ (r & kMask));
}

// The float index of element (r, c) of such a tile.
template <int Cols>
__device__ __forceinline__ int element_at(int r, int c) {
  return slice_at<Cols>(r, c >> 2) * 4 + (c & 3);
}

__device__ __forceinline__ float component(const float4& v, int e) {
  return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
}

// Rows [r0, r0 + n) of a strided matrix (row r at base + r * stride, d columns) into a Rows x Cols
// tile as f32, by the whole block; zeros past n rows and d columns, so every staged value is finite
// data or 0 (a masked score's probability is 0, and 0 times a stale NaN would not be). A thread
// stages float4 slices kBatch at a time, all their loads issued before any store: the staging of a
// tile waits on a few round trips to L2, not one per element.
template <int Rows, int Cols, int Threads, typename T>
__device__ void stage_rows(const T* base, int64_t stride, int64_t r0, int64_t n, int64_t d, float* tile) {
  constexpr int kSlicesPerRow = Cols / 4, kBatch = 4;
  constexpr int kPerThread = Rows * kSlicesPerRow / Threads;
  static_assert(kPerThread % kBatch == 0, "a tile's slices are a whole number of batches per thread");
  float4* tile4 = reinterpret_cast<float4*>(tile);
  CUMULUS_UNROLL_BY(1)
  for (int first = 0; first < kPerThread; first += kBatch) {
    float x[kBatch][4];
    CUMULUS_UNROLL
    for (int u = 0; u < kBatch; ++u) {
      const int e = static_cast<int>(threadIdx.x) + (first + u) * Threads;
      const int r = e / kSlicesPerRow, c = 4 * (e % kSlicesPerRow);
      const T* row = base + (r0 + r) * stride;
      CUMULUS_UNROLL
      for (int v = 0; v < 4; ++v) x[u][v] = r < n && c + v < d ? to_f32(row[c + v]) : 0.0f;
    }
    CUMULUS_UNROLL
    for (int u = 0; u < kBatch; ++u) {
      const int e = static_cast<int>(threadIdx.x) + (first + u) * Threads;
      tile4[slice_at<Cols>(e / kSlicesPerRow, e % kSlicesPerRow)] = make_float4(x[u][0], x[u][1], x[u][2], x[u][3]);
    }
  }
}

// n values v[r0 + r] into s[0, Rows), zeros past n.
template <int Rows, int Threads>
__device__ void stage_values(const float* v, int64_t r0, int64_t n, float* s) {
  for (int r = static_cast<int>(threadIdx.x); r < Rows; r += Threads) s[r] = r < n ? v[r0 + r] : 0.0f;
}

// The permutation of the rows a thread reads, ty + TY a and tx + 8 b: the same for all of its
// rows, since TY and 8 are multiples of the permutation's period.
template <int Cols>
__device__ __forceinline__ int row_permutation(int first_row) {
  constexpr int kSlicesPerRow = Cols / 4;
  return first_row & ((kSlicesPerRow < 8 ? kSlicesPerRow : 8) - 1);
}

// acc[a][b] += A[ty + TY a] . B[tx + 8 b]: rows of two shared tiles of Cols columns.
template <int Cols, int TY, int RM, int RN>
__device__ __forceinline__ void row_dots(const float* A, const float* B, float (&acc)[RM][RN]) {
  static_assert(TY % 8 == 0, "a thread's rows share their permutation");
  constexpr int kSlicesPerRow = Cols / 4;
  const int ty = lane_y(), tx = lane_x();
  const float4* a4 = reinterpret_cast<const float4*>(A) + ty * kSlicesPerRow;
  const float4* b4 = reinterpret_cast<const float4*>(B) + tx * kSlicesPerRow;
  const int a_perm = row_permutation<Cols>(ty), b_perm = row_permutation<Cols>(tx);
  CUMULUS_UNROLL_BY(1)
  for (int s = 0; s < kSlicesPerRow; ++s) {
    float4 a[RM];
    CUMULUS_UNROLL
    for (int i = 0; i < RM; ++i) a[i] = a4[TY * i * kSlicesPerRow + (s ^ a_perm)];
    CUMULUS_UNROLL
    for (int j = 0; j < RN; ++j) {
      const float4 b = b4[kLanes * j * kSlicesPerRow + (s ^ b_perm)];
      CUMULUS_UNROLL
      for (int i = 0; i < RM; ++i) {
        acc[i][j] += a[i].x * b.x;
        acc[i][j] += a[i].y * b.y;
        acc[i][j] += a[i].z * b.z;
        acc[i][j] += a[i].w * b.w;
      }
    }
  }
}

// out[a][4 h + e] += sum_k W[ty + TY a][k] X[k][4 (tx + 8 h) + e]: a Rows x K weight tile (K
// columns) times a K x D tile, into this thread's output rows and column slices.
template <int K, int D, int TY, int RM>
__device__ __forceinline__ void weighted_rows(const float* W, const float* X, float (&out)[RM][D / kLanes]) {
  static_assert(TY % 8 == 0, "a thread's rows share their permutation");
  constexpr int kSlices = D / (4 * kLanes), kWSlices = K / 4, kXSlices = D / 4;
  const int ty = lane_y(), tx = lane_x();
  const float4* w4 = reinterpret_cast<const float4*>(W) + ty * kWSlices;
  const float4* x4 = reinterpret_cast<const float4*>(X);
  const int w_perm = row_permutation<K>(ty);
  CUMULUS_UNROLL_BY(1)
  for (int s = 0; s < kWSlices; ++s) {
    float4 w[RM];
    CUMULUS_UNROLL
    for (int i = 0; i < RM; ++i) w[i] = w4[TY * i * kWSlices + (s ^ w_perm)];
    CUMULUS_UNROLL
    for (int e = 0; e < 4; ++e) {
      const int k = 4 * s + e;  // X's row: slice tx + 8 h at (tx ^ k % 8) + 8 h (D / 4 >= 8 slices)
      const float4* x_row = x4 + k * kXSlices + (tx ^ (k & 7));
      CUMULUS_UNROLL
      for (int h = 0; h < kSlices; ++h) {
        const float4 x = x_row[kLanes * h];
        CUMULUS_UNROLL
        for (int i = 0; i < RM; ++i) {
          const float wi = component(w[i], e);
          out[i][4 * h] += wi * x.x;
          out[i][4 * h + 1] += wi * x.y;
          out[i][4 * h + 2] += wi * x.z;
          out[i][4 * h + 3] += wi * x.w;
        }
      }
    }
  }
}

template <int R, int C>
__device__ __forceinline__ void zero(float (&x)[R][C]) {
  CUMULUS_UNROLL
  for (int i = 0; i < R; ++i) CUMULUS_UNROLL
  for (int j = 0; j < C; ++j) x[i][j] = 0.0f;
}

// Row r of a matrix at `row` (d columns): this thread's output slices of x[i] times `scale`.
template <int D, typename T>
__device__ void store_row(const float (&x)[D / kLanes], float scale, int64_t d, T* row) {
  const int tx = lane_x();
  CUMULUS_UNROLL
  for (int h = 0; h < D / (4 * kLanes); ++h) CUMULUS_UNROLL
  for (int e = 0; e < 4; ++e) {
    const int c = 4 * (tx + kLanes * h) + e;
    if (c < d) row[c] = from_f32<T>(x[4 * h + e] * scale);
  }
}

// The 8 lanes of a row (xor butterfly; every lane gets the same bits).
__device__ __forceinline__ float row_max(float x) {
  CUMULUS_UNROLL
  for (int o = 1; o < kLanes; o *= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
template <typename V>
__device__ __forceinline__ V row_sum(V x) {
  CUMULUS_UNROLL
  for (int o = 1; o < kLanes; o *= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// The keys row r of a tile of nq rows from i0 sees: [0, end); none for a row past nq.
__device__ __forceinline__ int64_t visible_end(const AttentionGeometry& g, int64_t i0, int64_t nq, int r) {
  return r < nq ? g.key_end(i0 + r) : 0;
}

// The online softmax over one key tile for this thread's rows (Note [Fused attention]): s holds
// the scaled scores, -inf where masked, and becomes the probabilities; m, l (this lane's share)
// and the output rows are rescaled to the new maxima.
template <int RM, int RN, int C>
__device__ void softmax_tile(float (&s)[RM][RN], float (&m)[RM], float (&l)[RM], float (&o)[RM][C]) {
  CUMULUS_UNROLL
  for (int i = 0; i < RM; ++i) {
    float tile_max = -INFINITY;
    CUMULUS_UNROLL
    for (int j = 0; j < RN; ++j) tile_max = fmaxf(tile_max, s[i][j]);
    const float m_new = fmaxf(m[i], row_max(tile_max));
    const float base = m_new == -INFINITY ? 0.0f : m_new;  // no key yet: every p and alpha is 0
    const float alpha = expf(m[i] - base);
    float sum = 0.0f;
    CUMULUS_UNROLL
    for (int j = 0; j < RN; ++j) sum += (s[i][j] = expf(s[i][j] - base));
    l[i] = l[i] * alpha + sum;
    CUMULUS_UNROLL
    for (int c = 0; c < C; ++c) o[i][c] *= alpha;
    m[i] = m_new;
  }
}

// A block per (head, tile of kRows query rows): the online softmax over the key tiles it sees.
template <int D, typename T>
__global__ void __launch_bounds__(kForwardMaxThreads, kMinForwardBlocksPerSm)
    tiled_attention_forward_kernel(AttentionGeometry g, const T* q, const T* k, const T* v, T* out, float* lse,
                                   int64_t tiles) {
  using Tl = ForwardTiles<D>;
  constexpr int kRows = Tl::kRows, kKeys = Tl::kKeys, RM = Tl::kRm, RN = Tl::kRn, TY = Tl::kTy;
  constexpr int kKeysOrP = kKeys * D > kRows * kKeys ? kKeys * D : kRows * kKeys;
  __shared__ __align__(16) float qs[kRows * D];
  __shared__ __align__(16) float kps[kKeysOrP];  // the K tile, then P
  __shared__ __align__(16) float vs[kKeys * D];
  const int64_t bh = blockIdx.x % g.bh(), i0 = (tiles - 1 - blockIdx.x / g.bh()) * kRows;  // the last first
  const int64_t nq = g.tq - i0 < kRows ? g.tq - i0 : kRows;
  const int ty = lane_y(), tx = lane_x();
  stage_rows<kRows, D, Tl::kThreads>(q + g.q_row(bh, 0), g.q_stride[2], i0, nq, g.d, qs);
  float m[RM], l[RM], o[RM][Tl::kCols];
  CUMULUS_UNROLL
  for (int i = 0; i < RM; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
  }
  zero(o);
  const int64_t block_end = g.key_end(i0 + nq - 1);
  for (int64_t j0 = 0; j0 < block_end; j0 += kKeys) {
    const int64_t nk = block_end - j0 < kKeys ? block_end - j0 : kKeys;
    __syncthreads();  // the previous tile's P and V are consumed
    stage_rows<kKeys, D, Tl::kThreads>(k + g.k_row(bh, 0), g.k_stride[2], j0, nk, g.d, kps);
    stage_rows<kKeys, D, Tl::kThreads>(v + g.v_row(bh, 0), g.v_stride[2], j0, nk, g.d, vs);
    __syncthreads();
    float s[RM][RN];
    zero(s);
    row_dots<D, TY, RM, RN>(qs, kps, s);
    CUMULUS_UNROLL
    for (int i = 0; i < RM; ++i) {
      const int64_t end = visible_end(g, i0, nq, ty + TY * i);
      CUMULUS_UNROLL
      for (int j = 0; j < RN; ++j) s[i][j] = j0 + tx + kLanes * j < end ? s[i][j] * g.scale : -INFINITY;
    }
    softmax_tile(s, m, l, o);
    __syncthreads();  // every thread's reads of K are done: P takes its place
    CUMULUS_UNROLL
    for (int i = 0; i < RM; ++i) CUMULUS_UNROLL
    for (int j = 0; j < RN; ++j) kps[element_at<kKeys>(ty + TY * i, tx + kLanes * j)] = s[i][j];
    __syncthreads();
    weighted_rows<kKeys, D, TY, RM>(kps, vs, o);
  }
  CUMULUS_UNROLL
  for (int i = 0; i < RM; ++i) {
    const float row_l = row_sum(l[i]);
    const int64_t row = i0 + ty + TY * i;
    if (row >= g.tq) continue;
    store_row<D>(o[i], 1.0f / row_l, g.d, out + g.o_row(bh, row));
    if (tx == 0) lse[bh * g.tq + row] = m[i] + logf(row_l);
  }
}

// delta_r = rowsum(dout_r out_r): 8 lanes a row, each summing its columns in double, then the
// butterfly (a fixed order).
template <typename T>
__global__ void tiled_attention_delta_kernel(AttentionGeometry g, const T* out, const T* dout, float* delta,
                                             int64_t rows) {
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes;
  double s = 0.0;
  if (r < rows) {
    const T* o = out + g.o_row(r / g.tq, r % g.tq);  // each at its strides
    const T* dor = dout + g.do_row(r / g.tq, r % g.tq);
    for (int64_t c = lane_x(); c < g.d; c += kLanes) s += static_cast<double>(to_f32(dor[c])) * to_f32(o[c]);
  }
  s = row_sum(s);  // every lane takes part
  if (r < rows && lane_x() == 0) delta[r] = static_cast<float>(s);
}

// P and dS of a (query tile, key tile) pair from the staged Q, dO, K and V and the rows' lse and
// delta (lse_s, delta_s: by row of the tile), into shared tiles of a row per query (a row per key
// when Transposed); p and ds may be one tile (dS overwrites P). One tile of scores in registers.
template <int D, typename Tl, bool Transposed>
__device__ void score_grads(const AttentionGeometry& g, const float* qs, const float* dos, const float* ks,
                            const float* vs, const float* lse_s, const float* delta_s, int64_t i0, int64_t nq,
                            int64_t j0, float* p, float* ds) {
  constexpr int RM = Tl::kRm, RN = Tl::kRn, TY = Tl::kTy;
  const int ty = lane_y(), tx = lane_x();
  const auto at = [](int r, int key) {
    return Transposed ? element_at<Tl::kRows>(key, r) : element_at<Tl::kKeys>(r, key);
  };
  float s[RM][RN];
  zero(s);
  row_dots<D, TY, RM, RN>(qs, ks, s);
  CUMULUS_UNROLL
  for (int i = 0; i < RM; ++i) {
    const int r = ty + TY * i;
    const int64_t end = visible_end(g, i0, nq, r);
    CUMULUS_UNROLL
    for (int j = 0; j < RN; ++j) {
      const int key = tx + kLanes * j;
      p[at(r, key)] = j0 + key < end ? expf(s[i][j] * g.scale - lse_s[r]) : 0.0f;
    }
  }
  zero(s);
  row_dots<D, TY, RM, RN>(dos, vs, s);  // dP
  CUMULUS_UNROLL
  for (int i = 0; i < RM; ++i) {
    const int r = ty + TY * i;
    CUMULUS_UNROLL
    for (int j = 0; j < RN; ++j) {
      const int e = at(r, tx + kLanes * j);
      ds[e] = p[e] * (s[i][j] - delta_s[r]) * g.scale;
    }
  }
}

// A block per (head, tile of kKeys keys): dv_j = sum_i p_ij do_i, dk_j = scale sum_i ds_ij q_i over
// the query tiles that see the keys.
template <int D, typename T>
__global__ void __launch_bounds__(kBackwardMaxThreads, kMinBackwardBlocksPerSm)
    tiled_attention_dkdv_kernel(AttentionGeometry g, const T* q, const T* k, const T* v, const float* lse,
                                const T* dout, const float* delta, T* dk, T* dv) {
  using Tl = BackwardTiles<D>;
  constexpr int kRows = Tl::kRows, kKeys = Tl::kKeys, TY = Tl::kTy;
  constexpr int kOwnKeys = kKeys / TY;  // the keys of this thread's dk and dv rows: ty + TY a
  using Sh = BackwardShared<D>;
  float* const ks = dynamic_shared<float>();
  float* const vs = ks + Sh::kKeyTile;
  float* const qs = vs + Sh::kKeyTile;
  float* const dos = qs + Sh::kRowTile;
  float* const pt = dos + Sh::kRowTile;    // P transposed: a row per key
  float* const dst = pt + Sh::kScores;     // dS transposed
  float* const lse_s = dst + Sh::kScores;  // the query tile's
  float* const delta_s = lse_s + kRows;
  const int64_t bh = blockIdx.x % g.bh(), j0 = blockIdx.x / g.bh() * kKeys;  // the first first
  const int64_t nk = g.tk - j0 < kKeys ? g.tk - j0 : kKeys;
  const int ty = lane_y();
  stage_rows<kKeys, D, Tl::kThreads>(k + g.k_row(bh, 0), g.k_stride[2], j0, nk, g.d, ks);
  stage_rows<kKeys, D, Tl::kThreads>(v + g.v_row(bh, 0), g.v_stride[2], j0, nk, g.d, vs);
  float dka[kOwnKeys][Tl::kCols], dva[kOwnKeys][Tl::kCols];
  zero(dka);
  zero(dva);
  for (int64_t i0 = g.causal ? j0 : 0; i0 < g.tq; i0 += kRows) {  // causal: no row before j0 sees the tile
    const int64_t nq = g.tq - i0 < kRows ? g.tq - i0 : kRows;
    __syncthreads();  // the previous tiles are consumed
    stage_rows<kRows, D, Tl::kThreads>(q + g.q_row(bh, 0), g.q_stride[2], i0, nq, g.d, qs);
    stage_rows<kRows, D, Tl::kThreads>(dout + g.do_row(bh, 0), g.do_stride[2], i0, nq, g.d, dos);
    stage_values<kRows, Tl::kThreads>(lse + bh * g.tq, i0, nq, lse_s);
    stage_values<kRows, Tl::kThreads>(delta + bh * g.tq, i0, nq, delta_s);
    __syncthreads();
    score_grads<D, Tl, true>(g, qs, dos, ks, vs, lse_s, delta_s, i0, nq, j0, pt, dst);
    __syncthreads();
    weighted_rows<kRows, D, TY, kOwnKeys>(pt, dos, dva);
    weighted_rows<kRows, D, TY, kOwnKeys>(dst, qs, dka);
  }
  CUMULUS_UNROLL
  for (int a = 0; a < kOwnKeys; ++a) {
    const int64_t key = j0 + ty + TY * a;
    if (key >= g.tk) continue;
    if (dk != nullptr) store_row<D>(dka[a], 1.0f, g.d, dk + g.dk_row(bh, key));
    if (dv != nullptr) store_row<D>(dva[a], 1.0f, g.d, dv + g.dv_row(bh, key));
  }
}

// A block per (head, tile of kRows query rows): dq_i = scale sum_j ds_ij k_j over the keys i sees.
template <int D, typename T>
__global__ void __launch_bounds__(kBackwardMaxThreads, kMinBackwardBlocksPerSm)
    tiled_attention_dq_kernel(AttentionGeometry g, const T* q, const T* k, const T* v, const float* lse, const T* dout,
                              const float* delta, T* dq, int64_t tiles) {
  using Tl = BackwardTiles<D>;
  constexpr int kRows = Tl::kRows, kKeys = Tl::kKeys, RM = Tl::kRm, TY = Tl::kTy;
  using Sh = BackwardShared<D>;
  float* const qs = dynamic_shared<float>();
  float* const dos = qs + Sh::kRowTile;
  float* const ks = dos + Sh::kRowTile;
  float* const vs = ks + Sh::kKeyTile;
  float* const dss = vs + Sh::kKeyTile;    // P, then dS: a row per query
  float* const lse_s = dss + Sh::kScores;  // the query tile's
  float* const delta_s = lse_s + kRows;
  const int64_t bh = blockIdx.x % g.bh(), i0 = (tiles - 1 - blockIdx.x / g.bh()) * kRows;  // the last first
  const int64_t nq = g.tq - i0 < kRows ? g.tq - i0 : kRows;
  stage_rows<kRows, D, Tl::kThreads>(q + g.q_row(bh, 0), g.q_stride[2], i0, nq, g.d, qs);
  stage_rows<kRows, D, Tl::kThreads>(dout + g.do_row(bh, 0), g.do_stride[2], i0, nq, g.d, dos);
  stage_values<kRows, Tl::kThreads>(lse + bh * g.tq, i0, nq, lse_s);
  stage_values<kRows, Tl::kThreads>(delta + bh * g.tq, i0, nq, delta_s);
  float dqa[RM][Tl::kCols];
  zero(dqa);
  const int64_t block_end = g.key_end(i0 + nq - 1);
  for (int64_t j0 = 0; j0 < block_end; j0 += kKeys) {
    const int64_t nk = block_end - j0 < kKeys ? block_end - j0 : kKeys;
    __syncthreads();  // the previous tiles are consumed (and Q, dO, lse, delta staged, the first time)
    stage_rows<kKeys, D, Tl::kThreads>(k + g.k_row(bh, 0), g.k_stride[2], j0, nk, g.d, ks);
    stage_rows<kKeys, D, Tl::kThreads>(v + g.v_row(bh, 0), g.v_stride[2], j0, nk, g.d, vs);
    __syncthreads();
    score_grads<D, Tl, false>(g, qs, dos, ks, vs, lse_s, delta_s, i0, nq, j0, dss, dss);
    __syncthreads();
    weighted_rows<kKeys, D, TY, RM>(dss, ks, dqa);
  }
  const int ty = lane_y();
  CUMULUS_UNROLL
  for (int i = 0; i < RM; ++i)
    if (ty + TY * i < nq) store_row<D>(dqa[i], 1.0f, g.d, dq + g.dq_row(bh, i0 + ty + TY * i));
}

using attention_launch::grid_of;

template <int D, typename T>
void forward_for(const AttentionGeometry& g, const T* q, const T* k, const T* v, T* out, float* lse,
                 cudaStream_t stream) {
  using Tl = ForwardTiles<D>;
  int64_t tiles = 0;
  const unsigned blocks = grid_of(g, g.tq, Tl::kRows, tiles);
  launch<tiled_attention_forward_kernel<D, T>>(blocks, Tl::kThreads, stream, g, q, k, v, out, lse, tiles);
}

template <int D, typename T>
void backward_for(const AttentionGeometry& g, const T* q, const T* k, const T* v, const float* lse, const T* dout,
                  const float* delta, T* dq, T* dk, T* dv, cudaStream_t stream) {
  using Tl = BackwardTiles<D>;
  int64_t tiles = 0;
  if (dk != nullptr || dv != nullptr) {
    const unsigned blocks = grid_of(g, g.tk, Tl::kKeys, tiles);
    launch_with_shared<tiled_attention_dkdv_kernel<D, T>>(blocks, Tl::kThreads, BackwardShared<D>::kKeysKernelBytes,
                                                          stream, g, q, k, v, lse, dout, delta, dk, dv);
  }
  if (dq != nullptr && g.tq > 0) {
    const unsigned blocks = grid_of(g, g.tq, Tl::kRows, tiles);
    launch_with_shared<tiled_attention_dq_kernel<D, T>>(blocks, Tl::kThreads, BackwardShared<D>::kQueriesKernelBytes,
                                                        stream, g, q, k, v, lse, dout, delta, dq, tiles);
  }
}

}  // namespace

template <typename T>
void attention_forward_tiled_cuda(const AttentionGeometry& g, const T* q, const T* k, const T* v, T* out, float* lse,
                                  cudaStream_t stream) {
  const int head = attention_launch::padded_head_size(g.d, "attention_forward_tiled_cuda");
  if (g.bh() == 0 || g.tq == 0 || g.tk == 0) return;
  attention_launch::for_head_size(head, [&](auto d) { forward_for<decltype(d)::value>(g, q, k, v, out, lse, stream); });
}

template <typename T>
void attention_backward_tiled_cuda(const AttentionGeometry& g, const T* q, const T* k, const T* v, const T* out,
                                   const float* lse, const T* dout, float* delta, T* dq, T* dk, T* dv,
                                   cudaStream_t stream) {
  const int head = attention_launch::padded_head_size(g.d, "attention_backward_tiled_cuda");
  if (g.bh() == 0 || g.tk == 0) return;
  const int64_t rows = g.bh() * g.tq;
  if (rows > 0) {
    const int64_t blocks = (rows * kLanes + kThreads - 1) / kThreads;
    CUMULUS_CHECK(blocks <= 2147483647, InvalidArgument, "attention on CUDA: ", rows, " rows is too many for one grid");
    launch<tiled_attention_delta_kernel<T>>(static_cast<unsigned>(blocks), kThreads, stream, g, out, dout, delta, rows);
  }
  attention_launch::for_head_size(
      head, [&](auto d) { backward_for<decltype(d)::value>(g, q, k, v, lse, dout, delta, dq, dk, dv, stream); });
}

#define CUMULUS_INSTANTIATE(T)                                                                                   \
  template void attention_forward_tiled_cuda(const AttentionGeometry&, const T*, const T*, const T*, T*, float*, \
                                             cudaStream_t);                                                      \
  template void attention_backward_tiled_cuda(const AttentionGeometry&, const T*, const T*, const T*, const T*,  \
                                              const float*, const T*, float*, T*, T*, T*, cudaStream_t);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
