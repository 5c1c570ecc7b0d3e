// CUDA kernels of fused attention (engine/ops/attention.cpp; the algorithm is Note [Fused attention]
// in kernels/cpu/attention.cpp), in f32 on CUDA cores: the f32 path, and the 16-bit one where no
// library attention runs.
//
// Note [CUDA attention kernels]
// - Head size: each kernel is compiled for D = 32, 64 and 128; a head of d <= 128 columns runs in
//   the smallest that holds it, its columns past d zero (computed on like the others: only d = 32,
//   64 and 128 waste nothing). d > 128 is refused with an error naming the sizes.
// - Rows in registers: a row (a query row in the forward and dq kernels, a key in dk/dv) belongs to
//   a group of G consecutive lanes of a warp (G = 2, 4, 8 for D = 32, 64, 128), each lane holding
//   kCols = 16 of its columns, as float4 slices interleaved across the group (lane g holds columns
//   (v G + g) 4 + e, v < 4, e < 4). Its q, k, v, do and accumulators are arrays of kCols floats
//   indexed only by loops unrolled at compile time, so they live in registers (the build fails a
//   kernel of this file with a stack frame: scripts/cuda_resources.py). A dot product is each
//   lane's 16 products, then a butterfly of xor shuffles over the group: every lane of the group
//   gets the same bits (each step adds the same two values, in either order).
// - Tiles sized to D: 128 threads per block for D = 32 and 64, 256 for D = 128, so 64, 32 and 32
//   rows a block; the other side's rows are staged in shared memory as f32, kTile = 4096 / D rows
//   (128, 64, 32) of each of two operands: 32 KiB whatever D. The interleaved columns make the
//   lanes of a group read consecutive float4s of one staged row (no bank conflicts), the groups of
//   a warp the same ones (a broadcast).
// - Forward: the online softmax over chunks of 16 keys (the scores of a chunk in registers, one
//   rescale of the accumulator per chunk); keys past the row's causal end or the tile score -inf,
//   a chunk with none left for the row is skipped after its shuffles (which every lane takes part
//   in). Saves lse = m + log(l), l summed in double across chunks as on the CPU.
// - Backward: delta_i = rowsum(do_i o_i) once (its own kernel); dk and dv, a block per (head, key
//   tile) looping over the query rows that see it; dq, a block per (head, query tile) looping over
//   the keys. Both recompute p from q, k and the saved lse (and dp from do and v): without atomics
//   no block can add into another block's rows, so each of the two kernels forms the scores itself
//   (twice in all, the price of the same bits on every run: FlashAttention-2 forms them once and
//   adds dq with atomics). Nothing but the lse and delta is kept between the kernels.
// Every sum has a fixed order (an accumulator is one lane's, in row or key order; a dot product a
// fixed butterfly): no atomics, the same bits on every run.
// Against the CPU: the same sums in another order and the device's expf, so within a few ulp per
// term (tests/emulated/attention_test.cpp). The default own kernels: run on an H200 (about 6 ms a
// layer and micro-batch at GPT-2 small's shape in f32, bench/results/2026-11-29-h200); the
// register-tiled ones (attention_tiled.cu, Note [Tiled CUDA attention kernels]) are the opt-in.
#include <cmath>

#include "kernels/cuda/attention_kernels.h"
#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/unroll.cuh"

namespace cumulus::kernels {

namespace {

using cuda_common::blocks_for;
using cuda_common::kThreads;
using cuda_common::launch;

// The launch bound of the tiled kernels: D = 128's block, two of them resident per SM at least, so
// ptxas keeps a thread within 128 registers (an SM's 64 K registers over 512 threads); the build's
// resource report shows 105-128 used and no stack. Allowed one block per SM, ptxas (13.0, sm_90)
// gave them 140-168 registers: no more than one block of 256 threads would fit an SM.
constexpr int kMaxBlockThreads = 256, kMinBlocksPerSm = 2;
constexpr int kChunk = 16;  // keys whose scores the forward keeps in registers at once

template <int D>
struct Tiling {
  static_assert(D == 32 || D == 64 || D == 128, "attention kernels are compiled for D = 32, 64 and 128");
  static constexpr int kGroup = D <= 32 ? 2 : D / 16;  // lanes per row
  static constexpr int kCols = D / kGroup;             // columns per lane: 16
  static constexpr int kVecs = kCols / 4;              // float4 slices per lane
  static constexpr int kThreads = D <= 64 ? 128 : 256;
  static constexpr int kRows = kThreads / kGroup;  // rows per block
  static constexpr int kTile = 4096 / D;           // staged rows of the other side, per operand
  static_assert(kThreads <= kMaxBlockThreads && kTile % kChunk == 0, "tiling");
};

template <int D>
using Row = float[Tiling<D>::kCols];

// This lane's place in its row's group.
template <int D>
__device__ __forceinline__ int group_lane() {
  return static_cast<int>(threadIdx.x) % Tiling<D>::kGroup;
}

// The column of element (v, e) of lane `lane`'s slices.
template <int D>
__device__ __forceinline__ int column(int lane, int v, int e) {
  return (v * Tiling<D>::kGroup + lane) * 4 + e;
}

// Sum over the row's group (xor butterfly; every lane gets the same bits). All 32 lanes take part.
template <int G>
__device__ __forceinline__ float group_sum(float x) {
  CUMULUS_UNROLL
  for (int o = 1; o < G; o *= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// x = this lane's columns of `row` (d columns of which are real), zeros where inactive or past d.
template <int D, typename T>
__device__ void load_row(const T* row, int64_t d, bool active, Row<D>& x) {
  const int lane = group_lane<D>();
  CUMULUS_UNROLL
  for (int v = 0; v < Tiling<D>::kVecs; ++v) CUMULUS_UNROLL
  for (int e = 0; e < 4; ++e) {
    const int c = column<D>(lane, v, e);
    x[v * 4 + e] = active && c < d ? to_f32(row[c]) : 0.0f;
  }
}

template <int D>
__device__ void zero_row(Row<D>& x) {
  CUMULUS_UNROLL
  for (int c = 0; c < Tiling<D>::kCols; ++c) x[c] = 0.0f;
}

// row[c] = x * scale for this lane's columns c < d.
template <int D, typename T>
__device__ void store_row(const Row<D>& x, float scale, int64_t d, T* row) {
  const int lane = group_lane<D>();
  CUMULUS_UNROLL
  for (int v = 0; v < Tiling<D>::kVecs; ++v) CUMULUS_UNROLL
  for (int e = 0; e < 4; ++e)
    if (column<D>(lane, v, e) < d) row[column<D>(lane, v, e)] = from_f32<T>(x[v * 4 + e] * scale);
}

// This lane's part of x . staged (a row of D floats in shared memory).
template <int D>
__device__ __forceinline__ float partial_dot(const Row<D>& x, const float* staged) {
  const float4* s4 = reinterpret_cast<const float4*>(staged);
  const int lane = group_lane<D>();
  float s = 0.0f;
  CUMULUS_UNROLL
  for (int v = 0; v < Tiling<D>::kVecs; ++v) {
    const float4 y = s4[v * Tiling<D>::kGroup + lane];
    s += x[v * 4] * y.x + x[v * 4 + 1] * y.y + x[v * 4 + 2] * y.z + x[v * 4 + 3] * y.w;
  }
  return s;
}

// acc += a * staged for this lane's columns.
template <int D>
__device__ __forceinline__ void add_scaled(float a, const float* staged, Row<D>& acc) {
  const float4* s4 = reinterpret_cast<const float4*>(staged);
  const int lane = group_lane<D>();
  CUMULUS_UNROLL
  for (int v = 0; v < Tiling<D>::kVecs; ++v) {
    const float4 y = s4[v * Tiling<D>::kGroup + lane];
    acc[v * 4] += a * y.x;
    acc[v * 4 + 1] += a * y.y;
    acc[v * 4 + 2] += a * y.z;
    acc[v * 4 + 3] += a * y.w;
  }
}

// Rows [r0, r0 + n) of a strided matrix (row r at base + r * stride, d columns) into tile[Rows][D]
// as f32, by the whole block; zeros past n rows and d columns, so every staged value is finite data
// or 0 (a masked score's probability is 0, and 0 times a stale NaN would not be). Unroll: the loads
// a thread keeps in flight, as many as the registers its kernel has left allow.
template <int D, int Rows, int Unroll, typename T>
__device__ void stage_rows(const T* base, int64_t stride, int64_t r0, int64_t n, int64_t d, float* tile) {
  CUMULUS_UNROLL_BY(Unroll)
  for (int e = static_cast<int>(threadIdx.x); e < Rows * D; e += static_cast<int>(blockDim.x)) {
    const int r = e / D, c = e % D;
    tile[e] = r < n && c < d ? to_f32(base[(r0 + r) * stride + c]) : 0.0f;
  }
}

// n values v[r0 + r] into s[0, Rows), zeros past n.
template <int Rows>
__device__ void stage_values(const float* v, int64_t r0, int64_t n, float* s) {
  for (int r = static_cast<int>(threadIdx.x); r < Rows; r += static_cast<int>(blockDim.x))
    s[r] = r < n ? v[r0 + r] : 0.0f;
}

// The forward's online softmax over kChunk staged keys, `valid` of which (from the first) the row
// sees: m, l and acc as Note [Fused attention].
template <int D>
__device__ void forward_chunk(const Row<D>& qf, const float* ks, const float* vs, int64_t valid, float scale, float& m,
                              double& l, Row<D>& acc) {
  float s[kChunk];
  float chunk_max = -INFINITY;
  CUMULUS_UNROLL
  for (int j = 0; j < kChunk; ++j) {
    const float dot = group_sum<Tiling<D>::kGroup>(partial_dot<D>(qf, ks + j * D));
    s[j] = j < valid ? dot * scale : -INFINITY;
    chunk_max = fmaxf(chunk_max, s[j]);
  }
  if (chunk_max == -INFINITY) return;  // no key of this chunk for this row
  const float m_new = fmaxf(m, chunk_max);
  const float alpha = expf(m - m_new);  // 0 on the row's first chunk (m = -inf)
  float chunk_sum = 0.0f;
  CUMULUS_UNROLL
  for (int j = 0; j < kChunk; ++j) chunk_sum += (s[j] = expf(s[j] - m_new));
  l = l * alpha + chunk_sum;
  CUMULUS_UNROLL
  for (int c = 0; c < Tiling<D>::kCols; ++c) acc[c] *= alpha;
  CUMULUS_UNROLL
  for (int j = 0; j < kChunk; ++j) add_scaled<D>(s[j], vs + j * D, acc);
  m = m_new;
}

template <int D, typename T>
__global__ void __launch_bounds__(kMaxBlockThreads, kMinBlocksPerSm)
    attention_forward_kernel(AttentionGeometry g, const T* q, const T* k, const T* v, T* out, float* lse,
                             int64_t tiles) {
  using Tl = Tiling<D>;
  __shared__ __align__(16) float ks[Tl::kTile * D];
  __shared__ __align__(16) float vs[Tl::kTile * D];
  const int64_t bh = blockIdx.x / tiles, i0 = (blockIdx.x % tiles) * Tl::kRows;
  const int64_t i = i0 + threadIdx.x / Tl::kGroup;
  const bool active = i < g.tq;
  Row<D> qf, acc;
  load_row<D>(q + (active ? g.q_row(bh, i) : 0), g.d, active, qf);
  zero_row<D>(acc);
  float m = -INFINITY;
  double l = 0.0;
  const int64_t i_last = (i0 + Tl::kRows < g.tq ? i0 + Tl::kRows : g.tq) - 1;
  const int64_t block_end = g.key_end(i_last), my_end = active ? g.key_end(i) : 0;
  for (int64_t j0 = 0; j0 < block_end; j0 += Tl::kTile) {
    const int64_t nk = block_end - j0 < Tl::kTile ? block_end - j0 : Tl::kTile;
    __syncthreads();  // the previous tile is consumed
    stage_rows<D, Tl::kTile, 2>(k + g.k_row(bh, 0), g.k_stride[2], j0, nk, g.d, ks);
    stage_rows<D, Tl::kTile, 2>(v + g.v_row(bh, 0), g.v_stride[2], j0, nk, g.d, vs);
    __syncthreads();
    for (int jc = 0; jc < nk; jc += kChunk)  // the same count for the whole block
      forward_chunk<D>(qf, ks + jc * D, vs + jc * D, my_end - (j0 + jc), g.scale, m, l, acc);
  }
  if (!active) return;
  store_row<D>(acc, static_cast<float>(1.0 / l), g.d, out + g.o_row(bh, i));
  if (group_lane<D>() == 0) lse[bh * g.tq + i] = m + static_cast<float>(::log(l));
}

template <typename T>
__global__ void attention_delta_kernel(AttentionGeometry g, const T* out, const T* dout, float* delta, int64_t rows) {
  const int64_t d = g.d;
  CUMULUS_GRID_STRIDE_LOOP(r, rows) {
    const T* o = out + g.o_row(r / g.tq, r % g.tq);  // each at its strides
    const T* dor = dout + g.do_row(r / g.tq, r % g.tq);
    double s = 0.0;
    for (int64_t c = 0; c < d; ++c) s += static_cast<double>(to_f32(dor[c])) * to_f32(o[c]);
    delta[r] = static_cast<float>(s);
  }
}

// One lane group per key j of the block's tile: dv_j = sum_i p_ij do_i, dk_j = scale sum_i ds_ij q_i
// over the query rows that see j, staged kTile at a time.
template <int D, typename T>
__global__ void __launch_bounds__(kMaxBlockThreads, kMinBlocksPerSm)
    attention_dkdv_kernel(AttentionGeometry g, const T* q, const T* k, const T* v, const float* lse, const T* dout,
                          const float* delta, T* dk, T* dv, int64_t tiles) {
  using Tl = Tiling<D>;
  __shared__ __align__(16) float qs[Tl::kTile * D];
  __shared__ __align__(16) float dos[Tl::kTile * D];
  __shared__ float lse_s[Tl::kTile];
  __shared__ float delta_s[Tl::kTile];
  const int64_t bh = blockIdx.x / tiles, j0 = (blockIdx.x % tiles) * Tl::kRows;
  const int64_t j = j0 + threadIdx.x / Tl::kGroup;
  const bool active = j < g.tk;
  Row<D> kf, vf, dka, dva;
  load_row<D>(k + (active ? g.k_row(bh, j) : 0), g.d, active, kf);
  load_row<D>(v + (active ? g.v_row(bh, j) : 0), g.d, active, vf);
  zero_row<D>(dka);
  zero_row<D>(dva);
  for (int64_t i0 = g.causal ? j0 : 0; i0 < g.tq; i0 += Tl::kTile) {
    const int64_t nq = g.tq - i0 < Tl::kTile ? g.tq - i0 : Tl::kTile;
    __syncthreads();
    stage_rows<D, Tl::kTile, 1>(q + g.q_row(bh, 0), g.q_stride[2], i0, nq, g.d, qs);
    stage_rows<D, Tl::kTile, 1>(dout + g.do_row(bh, 0), g.do_stride[2], i0, nq, g.d, dos);
    stage_values<Tl::kTile>(lse + bh * g.tq, i0, nq, lse_s);
    stage_values<Tl::kTile>(delta + bh * g.tq, i0, nq, delta_s);
    __syncthreads();
    CUMULUS_UNROLL_BY(1)
    for (int r = 0; r < nq; ++r) {  // the same count for the whole block: every lane shuffles
      const float s = group_sum<Tl::kGroup>(partial_dot<D>(kf, qs + r * D));
      const float dp = group_sum<Tl::kGroup>(partial_dot<D>(vf, dos + r * D));
      const bool sees = active && j < g.key_end(i0 + r);
      const float p = sees ? expf(s * g.scale - lse_s[r]) : 0.0f;
      const float ds = p * (dp - delta_s[r]) * g.scale;
      add_scaled<D>(p, dos + r * D, dva);
      add_scaled<D>(ds, qs + r * D, dka);
    }
  }
  if (!active) return;
  if (dk != nullptr) store_row<D>(dka, 1.0f, g.d, dk + g.dk_row(bh, j));
  if (dv != nullptr) store_row<D>(dva, 1.0f, g.d, dv + g.dv_row(bh, j));
}

// One lane group per query row i: dq_i = scale sum_j ds_ij k_j over the keys i sees.
template <int D, typename T>
__global__ void __launch_bounds__(kMaxBlockThreads, kMinBlocksPerSm)
    attention_dq_kernel(AttentionGeometry g, const T* q, const T* k, const T* v, const float* lse, const T* dout,
                        const float* delta, T* dq, int64_t tiles) {
  using Tl = Tiling<D>;
  __shared__ __align__(16) float ks[Tl::kTile * D];
  __shared__ __align__(16) float vs[Tl::kTile * D];
  const int64_t bh = blockIdx.x / tiles, i0 = (blockIdx.x % tiles) * Tl::kRows;
  const int64_t i = i0 + threadIdx.x / Tl::kGroup;
  const bool active = i < g.tq;
  Row<D> qf, dof, dqa;
  load_row<D>(q + (active ? g.q_row(bh, i) : 0), g.d, active, qf);
  load_row<D>(dout + (active ? g.do_row(bh, i) : 0), g.d, active, dof);
  zero_row<D>(dqa);
  const float row_lse = active ? lse[bh * g.tq + i] : 0.0f, row_delta = active ? delta[bh * g.tq + i] : 0.0f;
  const int64_t i_last = (i0 + Tl::kRows < g.tq ? i0 + Tl::kRows : g.tq) - 1;
  const int64_t block_end = g.key_end(i_last), my_end = active ? g.key_end(i) : 0;
  for (int64_t j0 = 0; j0 < block_end; j0 += Tl::kTile) {
    const int64_t nk = block_end - j0 < Tl::kTile ? block_end - j0 : Tl::kTile;
    __syncthreads();
    stage_rows<D, Tl::kTile, 2>(k + g.k_row(bh, 0), g.k_stride[2], j0, nk, g.d, ks);
    stage_rows<D, Tl::kTile, 2>(v + g.v_row(bh, 0), g.v_stride[2], j0, nk, g.d, vs);
    __syncthreads();
    for (int j = 0; j < nk; ++j) {  // the same count for the whole block: every lane shuffles
      const float s = group_sum<Tl::kGroup>(partial_dot<D>(qf, ks + j * D));
      const float dp = group_sum<Tl::kGroup>(partial_dot<D>(dof, vs + j * D));
      const float p = j0 + j < my_end ? expf(s * g.scale - row_lse) : 0.0f;
      add_scaled<D>(p * (dp - row_delta) * g.scale, ks + j * D, dqa);
    }
  }
  if (active) store_row<D>(dqa, 1.0f, g.d, dq + g.dq_row(bh, i));
}

template <int D>
unsigned grid_of(const AttentionGeometry& g, int64_t rows, int64_t& tiles) {
  return attention_launch::grid_of(g, rows, Tiling<D>::kRows, tiles);
}

template <int D, typename T>
void forward_for(const AttentionGeometry& g, const T* q, const T* k, const T* v, T* out, float* lse,
                 cudaStream_t stream) {
  int64_t tiles = 0;
  const unsigned blocks = grid_of<D>(g, g.tq, tiles);
  launch<attention_forward_kernel<D, T>>(blocks, Tiling<D>::kThreads, stream, g, q, k, v, out, lse, tiles);
}

template <int D, typename T>
void backward_for(const AttentionGeometry& g, const T* q, const T* k, const T* v, const float* lse, const T* dout,
                  const float* delta, T* dq, T* dk, T* dv, cudaStream_t stream) {
  int64_t tiles = 0;
  if (dk != nullptr || dv != nullptr) {
    const unsigned blocks = grid_of<D>(g, g.tk, tiles);
    launch<attention_dkdv_kernel<D, T>>(blocks, Tiling<D>::kThreads, stream, g, q, k, v, lse, dout, delta, dk, dv,
                                        tiles);
  }
  if (dq != nullptr && g.tq > 0) {
    const unsigned blocks = grid_of<D>(g, g.tq, tiles);
    launch<attention_dq_kernel<D, T>>(blocks, Tiling<D>::kThreads, stream, g, q, k, v, lse, dout, delta, dq, tiles);
  }
}

}  // namespace

template <typename T>
void attention_forward_cuda(const AttentionGeometry& g, const T* q, const T* k, const T* v, T* out, float* lse,
                            cudaStream_t stream) {
  const int head = attention_launch::padded_head_size(g.d, "attention_forward_cuda");
  if (g.bh() == 0 || g.tq == 0 || g.tk == 0) return;
  attention_launch::for_head_size(head, [&](auto d) { forward_for<decltype(d)::value>(g, q, k, v, out, lse, stream); });
}

template <typename T>
void attention_backward_cuda(const AttentionGeometry& g, const T* q, const T* k, const T* v, const T* out,
                             const float* lse, const T* dout, float* delta, T* dq, T* dk, T* dv, cudaStream_t stream) {
  const int head = attention_launch::padded_head_size(g.d, "attention_backward_cuda");
  if (g.bh() == 0 || g.tk == 0) return;
  const int64_t rows = g.bh() * g.tq;
  if (rows > 0) launch<attention_delta_kernel<T>>(blocks_for(rows), kThreads, stream, g, out, dout, delta, rows);
  attention_launch::for_head_size(
      head, [&](auto d) { backward_for<decltype(d)::value>(g, q, k, v, lse, dout, delta, dq, dk, dv, stream); });
}

#define CUMULUS_INSTANTIATE(T)                                                                             \
  template void attention_forward_cuda(const AttentionGeometry&, const T*, const T*, const T*, T*, float*, \
                                       cudaStream_t);                                                      \
  template void attention_backward_cuda(const AttentionGeometry&, const T*, const T*, const T*, const T*,  \
                                        const float*, const T*, float*, T*, T*, T*, cudaStream_t);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
