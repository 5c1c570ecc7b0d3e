// CUDA kernels of fused attention (engine/ops/attention.cpp; the algorithm is Note [Fused
// attention] in kernels/cpu/attention.cpp). Straightforward rather than tuned: one thread per
// query row (forward, dq) or per key (dk, dv), its row and accumulators in registers (D <= 128),
// the other side's rows staged through shared memory a tile at a time, the online softmax as on
// the CPU. The backward is three kernels: delta = rowsum(dout * out); dk and dv, one block per
// (head, key tile) looping over the query rows that see it; dq, one block per (head, query tile)
// looping over the keys. Every gradient element is summed by one thread in a fixed order: no
// atomics, the same bits on every run. Against the CPU: the same sums in another order and the
// device's expf, so within a few ulp per term (tests/emulated/attention_test.cpp).
#include <cmath>

#include "kernels/cuda/attention_kernels.h"
#include "kernels/cuda/common.cuh"

namespace cumulus::kernels {

namespace {

using cuda_common::blocks_for;
using cuda_common::kThreads;
using cuda_common::launch;

constexpr int kRowsPerBlock = 64;  // threads of the forward, dq and dk/dv kernels: one row each
constexpr int kTile = 32;          // rows of the other side staged in shared memory per step
constexpr int kMaxD = static_cast<int>(kAttentionMaxHeadDimCuda);

// Rows [r0, r0 + n) of a strided head (row t at base + t * stride) into tile [kTile][kMaxD], by the
// whole block.
template <typename T>
__device__ void stage_rows(const T* base, int64_t stride, int64_t r0, int64_t n, int64_t d, float* tile) {
  for (int64_t e = threadIdx.x; e < n * d; e += blockDim.x) {
    const int64_t r = e / d, c = e % d;
    tile[r * kMaxD + c] = to_f32(base[(r0 + r) * stride + c]);
  }
}

__device__ __forceinline__ float dot(const float* a, const float* b, int64_t d) {
  float s = 0.0f;
  for (int64_t c = 0; c < d; ++c) s += a[c] * b[c];
  return s;
}

template <typename T>
__global__ void attention_forward_kernel(AttentionGeometry g, const T* q, const T* k, const T* v, T* out, float* lse,
                                         int64_t tiles) {
  __shared__ float ks[kTile * kMaxD];
  __shared__ float vs[kTile * kMaxD];
  const int64_t bh = blockIdx.x / tiles, i0 = (blockIdx.x % tiles) * kRowsPerBlock, i = i0 + threadIdx.x;
  const int64_t d = g.d;
  const bool active = i < g.tq;
  float qf[kMaxD], acc[kMaxD];
  for (int64_t c = 0; c < d; ++c) {
    qf[c] = active ? to_f32(q[g.q_row(bh, i) + c]) : 0.0f;
    acc[c] = 0.0f;
  }
  float m = -INFINITY;
  double l = 0.0;
  const int64_t i_last = (i0 + kRowsPerBlock < g.tq ? i0 + kRowsPerBlock : g.tq) - 1;
  const int64_t block_end = g.key_end(i_last), my_end = active ? g.key_end(i) : 0;
  const T* kh = k + g.k_row(bh, 0);
  const T* vh = v + g.v_row(bh, 0);
  for (int64_t j0 = 0; j0 < block_end; j0 += kTile) {
    const int64_t nk = block_end - j0 < kTile ? block_end - j0 : kTile;
    __syncthreads();  // the previous tile is consumed
    stage_rows(kh, g.k_stride[2], j0, nk, d, ks);
    stage_rows(vh, g.v_stride[2], j0, nk, d, vs);
    __syncthreads();
    const int64_t n = my_end - j0 < nk ? my_end - j0 : nk;
    if (n <= 0) continue;
    float s[kTile];
    float tile_max = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      s[j] = dot(qf, ks + j * kMaxD, d) * g.scale;
      tile_max = fmaxf(tile_max, s[j]);
    }
    const float m_new = fmaxf(m, tile_max);
    const float alpha = expf(m - m_new);  // 0 on the first tile (m = -inf)
    float tile_sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) tile_sum += (s[j] = expf(s[j] - m_new));
    l = l * alpha + tile_sum;
    for (int64_t c = 0; c < d; ++c) {
      float a = acc[c] * alpha;
      for (int64_t j = 0; j < n; ++j) a += s[j] * vs[j * kMaxD + c];
      acc[c] = a;
    }
    m = m_new;
  }
  if (!active) return;
  const float inv = static_cast<float>(1.0 / l);
  T* o = out + g.o_row(bh, i);
  for (int64_t c = 0; c < d; ++c) o[c] = from_f32<T>(acc[c] * inv);
  lse[bh * g.tq + i] = m + static_cast<float>(::log(l));
}

template <typename T>
__global__ void attention_delta_kernel(AttentionGeometry g, const T* out, const T* dout, float* delta, int64_t rows) {
  const int64_t d = g.d;
  CUMULUS_GRID_STRIDE_LOOP(r, rows) {
    const T* o = out + g.o_row(r / g.tq, r % g.tq);  // the output at its strides; dout dense
    double s = 0.0;
    for (int64_t c = 0; c < d; ++c) s += static_cast<double>(to_f32(dout[r * d + c])) * to_f32(o[c]);
    delta[r] = static_cast<float>(s);
  }
}

// One thread per key j of the block's tile: dv_j = sum_i p_ij do_i, dk_j = scale sum_i ds_ij q_i
// over the query rows that see j, staged kTile at a time.
template <typename T>
__global__ void attention_dkdv_kernel(AttentionGeometry g, const T* q, const T* k, const T* v, const float* lse,
                                      const T* dout, const float* delta, T* dk, T* dv, int64_t tiles) {
  __shared__ float qs[kTile * kMaxD];
  __shared__ float dos[kTile * kMaxD];
  __shared__ float lse_s[kTile];
  __shared__ float delta_s[kTile];
  const int64_t bh = blockIdx.x / tiles, j0 = (blockIdx.x % tiles) * kRowsPerBlock, j = j0 + threadIdx.x;
  const int64_t d = g.d;
  const bool active = j < g.tk;
  float kf[kMaxD], vf[kMaxD], dka[kMaxD], dva[kMaxD];
  for (int64_t c = 0; c < d; ++c) {
    kf[c] = active ? to_f32(k[g.k_row(bh, j) + c]) : 0.0f;
    vf[c] = active ? to_f32(v[g.v_row(bh, j) + c]) : 0.0f;
    dka[c] = 0.0f;
    dva[c] = 0.0f;
  }
  const T* qh = q + g.q_row(bh, 0);
  for (int64_t i0 = g.causal ? j0 : 0; i0 < g.tq; i0 += kTile) {
    const int64_t nq = g.tq - i0 < kTile ? g.tq - i0 : kTile;
    __syncthreads();
    stage_rows(qh, g.q_stride[2], i0, nq, d, qs);
    stage_rows(dout + bh * g.tq * d, d, i0, nq, d, dos);
    for (int64_t r = threadIdx.x; r < nq; r += blockDim.x) {
      lse_s[r] = lse[bh * g.tq + i0 + r];
      delta_s[r] = delta[bh * g.tq + i0 + r];
    }
    __syncthreads();
    if (!active) continue;
    for (int64_t r = 0; r < nq; ++r) {
      if (j >= g.key_end(i0 + r)) continue;
      const float* qi = qs + r * kMaxD;
      const float* doi = dos + r * kMaxD;
      const float p = expf(dot(qi, kf, d) * g.scale - lse_s[r]);
      const float ds = p * (dot(doi, vf, d) - delta_s[r]) * g.scale;
      for (int64_t c = 0; c < d; ++c) {
        dva[c] += p * doi[c];
        dka[c] += ds * qi[c];
      }
    }
  }
  if (!active) return;
  for (int64_t c = 0; c < d; ++c) {
    if (dk != nullptr) dk[(bh * g.tk + j) * d + c] = from_f32<T>(dka[c]);
    if (dv != nullptr) dv[(bh * g.tk + j) * d + c] = from_f32<T>(dva[c]);
  }
}

// One thread per query row i: dq_i = scale sum_j ds_ij k_j over the keys i sees.
template <typename T>
__global__ void attention_dq_kernel(AttentionGeometry g, const T* q, const T* k, const T* v, const float* lse,
                                    const T* dout, const float* delta, T* dq, int64_t tiles) {
  __shared__ float ks[kTile * kMaxD];
  __shared__ float vs[kTile * kMaxD];
  const int64_t bh = blockIdx.x / tiles, i0 = (blockIdx.x % tiles) * kRowsPerBlock, i = i0 + threadIdx.x;
  const int64_t d = g.d;
  const bool active = i < g.tq;
  float qf[kMaxD], dof[kMaxD], dqa[kMaxD];
  for (int64_t c = 0; c < d; ++c) {
    qf[c] = active ? to_f32(q[g.q_row(bh, i) + c]) : 0.0f;
    dof[c] = active ? to_f32(dout[(bh * g.tq + i) * d + c]) : 0.0f;
    dqa[c] = 0.0f;
  }
  const float row_lse = active ? lse[bh * g.tq + i] : 0.0f, row_delta = active ? delta[bh * g.tq + i] : 0.0f;
  const int64_t i_last = (i0 + kRowsPerBlock < g.tq ? i0 + kRowsPerBlock : g.tq) - 1;
  const int64_t block_end = g.key_end(i_last), my_end = active ? g.key_end(i) : 0;
  const T* kh = k + g.k_row(bh, 0);
  const T* vh = v + g.v_row(bh, 0);
  for (int64_t j0 = 0; j0 < block_end; j0 += kTile) {
    const int64_t nk = block_end - j0 < kTile ? block_end - j0 : kTile;
    __syncthreads();
    stage_rows(kh, g.k_stride[2], j0, nk, d, ks);
    stage_rows(vh, g.v_stride[2], j0, nk, d, vs);
    __syncthreads();
    const int64_t n = my_end - j0 < nk ? my_end - j0 : nk;
    for (int64_t j = 0; j < n; ++j) {
      const float p = expf(dot(qf, ks + j * kMaxD, d) * g.scale - row_lse);
      const float ds = p * (dot(dof, vs + j * kMaxD, d) - row_delta) * g.scale;
      for (int64_t c = 0; c < d; ++c) dqa[c] += ds * ks[j * kMaxD + c];
    }
  }
  if (!active) return;
  for (int64_t c = 0; c < d; ++c) dq[(bh * g.tq + i) * d + c] = from_f32<T>(dqa[c]);
}

int64_t tiles_of(int64_t n) { return (n + kRowsPerBlock - 1) / kRowsPerBlock; }

}  // namespace

template <typename T>
void attention_forward_cuda(const AttentionGeometry& g, const T* q, const T* k, const T* v, T* out, float* lse,
                            cudaStream_t stream) {
  const int64_t tiles = tiles_of(g.tq);
  if (g.bh() == 0 || tiles == 0 || g.tk == 0) return;
  launch<attention_forward_kernel<T>>(static_cast<unsigned>(g.bh() * tiles), kRowsPerBlock, stream, g, q, k, v, out,
                                      lse, tiles);
}

template <typename T>
void attention_backward_cuda(const AttentionGeometry& g, const T* q, const T* k, const T* v, const T* out,
                             const float* lse, const T* dout, float* delta, T* dq, T* dk, T* dv, cudaStream_t stream) {
  if (g.bh() == 0 || g.tk == 0) return;
  const int64_t rows = g.bh() * g.tq;
  if (rows > 0) launch<attention_delta_kernel<T>>(blocks_for(rows), kThreads, stream, g, out, dout, delta, rows);
  if (dk != nullptr || dv != nullptr) {
    const int64_t tiles = tiles_of(g.tk);
    launch<attention_dkdv_kernel<T>>(static_cast<unsigned>(g.bh() * tiles), kRowsPerBlock, stream, g, q, k, v, lse,
                                     dout, delta, dk, dv, tiles);
  }
  if (dq != nullptr && rows > 0) {
    const int64_t tiles = tiles_of(g.tq);
    launch<attention_dq_kernel<T>>(static_cast<unsigned>(g.bh() * tiles), kRowsPerBlock, stream, g, q, k, v, lse, dout,
                                   delta, dq, tiles);
  }
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
