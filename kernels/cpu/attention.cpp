// CPU kernels of fused attention (engine/ops/attention.cpp).
//
// Note [Fused attention]
// softmax(scale q k^T) v without the [tq, tk] matrix, as FlashAttention-2 computes it:
// - Forward: a block of query rows meets the keys one tile at a time. Each row keeps a running
//   maximum m and sum l of exp(score - m) and its output accumulator; a tile that raises the
//   maximum rescales both by exp(m_old - m_new) (the online softmax), so no score is ever stored
//   beyond the tile. The output is acc / l, and the row's log-sum-exp lse = m + log(l) is saved.
//   Causal rows stop at their own position, so key tiles wholly above the diagonal are skipped.
// - Backward: from q, k, v, the output o, its lse and the upstream gradient do, with
//   delta_i = rowsum(do_i * o_i): the probabilities are recomputed tile by tile as
//   p_ij = exp(scale q_i k_j - lse_i), then dv_j += p_ij do_i, ds_ij = p_ij (do_i . v_j - delta_i),
//   dq_i += scale ds_ij k_j, dk_j += scale ds_ij q_i.
// - Saved for backward: q, k and v themselves (the caller's views, sharing the projection's
//   storage), the output and the lse ([.., tq] f32): bytes per token independent of T, where the
//   composition (matmul, mask, softmax, matmul) keeps [T, T] scores and probabilities per head.
// The CPU forward splits (head, block of query rows) across threads; the backward gives each
// thread whole heads, so dk and dv are summed by one thread in a fixed order (no races, the same
// bits at any thread count: Note [CPU kernel threads]). The row sums l are kept in double across
// tiles. Tiles: 16 query rows share each key tile's conversion and transpose; 64 keys keep a tile
// of k and v in L1/L2 for D up to 64. With AVX2 or AVX-512 the tiles are small matrix products
// (Note [Fused attention as tile products]); plain loops, row by row, otherwise.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <new>
#include <type_traits>
#include <vector>

#include "kernels/cpu/attention_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace cumulus::kernels {

namespace {

constexpr int64_t kRows = 16;
constexpr int64_t kKeys = 64;

// Scratch on 64-byte boundaries: a vector load that straddles two cache lines costs two, and the
// tiles' rows (kKeys floats) and blocks of 16 rows of d floats keep every row start aligned.
template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(std::size_t n) {
    void* p = std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64);
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) noexcept { std::free(p); }
  friend bool operator==(const CacheLineAllocator&, const CacheLineAllocator&) { return true; }
  friend bool operator!=(const CacheLineAllocator&, const CacheLineAllocator&) { return false; }
};
using Scratch = std::vector<float, CacheLineAllocator<float>>;

// Note [Attention prefetch]
// q is a view of the projection's output, whose rows lie 3C elements apart, and in a training step
// those rows have left the core's near caches since the forward wrote them; the tile products read
// a block's rows of q one scalar at a time and stalled on them, as the forward's finish_rows did on
// the output rows it writes. So the rows are asked for ahead: the forward's next block of query and
// output rows while one block runs, the backward's whole head of q before its row sums and
// transposes (the small GPT's step: finish_rows 0.6% -> 0.3% of the samples). Asking a whole head
// ahead of its turn (40 KB of q, k, v and the output) did not help: too far, and k's and v's
// transposes prefetch their own rows (transpose_f32). A prefetch changes no value.
template <typename T>
void prefetch_rows(const T* base, int64_t stride, int64_t rows, int64_t d) {
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(T));
  for (int64_t j = 0; j < rows; ++j)
    for (int64_t c = 0; c < d; c += kLine) __builtin_prefetch(base + j * stride + c, 0, 3);
}

// Without AVX2: e^x for n floats in place, s[j] = sum_c x[c] t[c][j] over a tile of kKeys (t
// transposed, zero past its keys), and y[c] += sum_{j < n} a[j] rows[j][c].
void exp_in_place(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = std::exp(x[i]);
}

void tile_dots(const float* x, const float* t, int64_t d, float* s) {
  for (int64_t j = 0; j < kKeys; ++j) s[j] = 0.0f;
  for (int64_t c = 0; c < d; ++c) {
    const float xc = x[c];
    const float* tc = t + c * kKeys;
    for (int64_t j = 0; j < kKeys; ++j) s[j] += xc * tc[j];
  }
}

void add_weighted_rows(const float* a, const float* rows, int64_t n, int64_t d, float* y) {
  for (int64_t j = 0; j < n; ++j) {
    const float aj = a[j];
    const float* r = rows + j * d;
    for (int64_t c = 0; c < d; ++c) y[c] += aj * r[c];
  }
}

template <typename T>
void load_row(const T* src, float* dst, int64_t d) {
  for (int64_t c = 0; c < d; ++c) dst[c] = to_f32(src[c]);
}

// Rows [j0, j0 + n) of a strided head as the tile's transpose t [d][kKeys] (zero past n) and, when
// `rows` is not null, as rows [n][d].
template <typename T>
void load_tile(const T* base, int64_t row_stride, int64_t j0, int64_t n, int64_t d, float* t, float* rows) {
  if (n < kKeys)
    for (int64_t c = 0; c < d; ++c) std::fill(t + c * kKeys + n, t + (c + 1) * kKeys, 0.0f);
  for (int64_t j = 0; j < n; ++j) {
    const T* r = base + (j0 + j) * row_stride;
    for (int64_t c = 0; c < d; ++c) t[c * kKeys + j] = to_f32(r[c]);
    if (rows != nullptr) load_row(r, rows + j * d, d);
  }
}

// A block's rows done: out = acc / sum, lse = m + log(sum).
template <typename T>
void finish_rows(const AttentionGeometry& g, T* out, float* lse, int64_t bh, int64_t i0, int64_t nq, const float* acc,
                 const float* m, const std::vector<double>& sums) {
  const int64_t d = g.d;
  for (int64_t r = 0; r < nq; ++r) {
    const float inv = static_cast<float>(1.0 / sums[r]);
    T* o = out + g.o_row(bh, i0 + r);
    for (int64_t c = 0; c < d; ++c) o[c] = from_f32<T>(acc[r * d + c] * inv);
    lse[bh * g.tq + i0 + r] = m[r] + static_cast<float>(std::log(sums[r]));
  }
}

template <typename T>
void forward_block(const AttentionGeometry& g, const T* q, const T* k, const T* v, T* out, float* lse, int64_t bh,
                   int64_t i0, Scratch& scratch, std::vector<double>& sums) {
  const int64_t d = g.d, i1 = std::min(i0 + kRows, g.tq), nq = i1 - i0;
  // Scratch kept across a thread's blocks: only the accumulators need zeros.
  scratch.resize(std::max(scratch.size(), static_cast<std::size_t>(2 * kRows * d + 2 * kKeys * d + kKeys + kRows)));
  float* qf = scratch.data();   // [kRows][d]
  float* acc = qf + kRows * d;  // [kRows][d]
  float* kt = acc + kRows * d;  // [d][kKeys]
  float* vf = kt + kKeys * d;   // [kKeys][d]
  float* s = vf + kKeys * d;    // [kKeys]
  float* m = s + kKeys;         // [kRows]
  std::fill(acc, acc + kRows * d, 0.0f);
  sums.assign(static_cast<std::size_t>(kRows), 0.0);
  for (int64_t r = 0; r < nq; ++r) {
    load_row(q + g.q_row(bh, i0 + r), qf + r * d, d);
    m[r] = -std::numeric_limits<float>::infinity();
  }
  const int64_t key_end = g.key_end(i1 - 1);
  const T* kh = k + g.k_row(bh, 0);
  for (int64_t j0 = 0; j0 < key_end; j0 += kKeys) {
    const int64_t nk = std::min(kKeys, key_end - j0);
    load_tile(kh, g.k_stride[2], j0, nk, d, kt, nullptr);
    for (int64_t j = 0; j < nk; ++j) load_row(v + g.v_row(bh, j0 + j), vf + j * d, d);
    for (int64_t r = 0; r < nq; ++r) {
      const int64_t n = std::min(nk, g.key_end(i0 + r) - j0);
      if (n <= 0) continue;
      tile_dots(qf + r * d, kt, d, s);
      float tile_max = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < n; ++j) tile_max = std::max(tile_max, s[j] *= g.scale);
      const float m_new = std::max(m[r], tile_max);
      for (int64_t j = 0; j < n; ++j) s[j] -= m_new;
      exp_in_place(s, n);
      float tile_sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) tile_sum += s[j];
      float* a = acc + r * d;
      if (m_new != m[r]) {
        // The first tile finds m = -inf: alpha 0 (acc and the sum are still 0).
        const float alpha = std::exp(m[r] - m_new);
        sums[r] *= alpha;
        for (int64_t c = 0; c < d; ++c) a[c] *= alpha;
      }
      sums[r] += tile_sum;
      add_weighted_rows(s, vf, n, d, a);
      m[r] = m_new;
    }
  }
  finish_rows(g, out, lse, bh, i0, nq, acc, m, sums);
}

// delta_i = sum_c do[i][c] out[i][c] for each query row of head bh (do as [tq][d] f32, summed in
// double): the softmax backward's row term.
template <typename T>
void row_deltas(const AttentionGeometry& g, const T* out, int64_t bh, const float* dout_rows, float* delta_h) {
  const int64_t d = g.d;
  for (int64_t i = 0; i < g.tq; ++i) {
    const T* o = out + g.o_row(bh, i);
    double sum = 0.0;
    for (int64_t c = 0; c < d; ++c) sum += static_cast<double>(dout_rows[i * d + c]) * to_f32(o[c]);
    delta_h[i] = static_cast<float>(sum);
  }
}

template <typename T>
void store_row(const float* src, int64_t d, T* dst) {
  for (int64_t c = 0; c < d; ++c) dst[c] = from_f32<T>(src[c]);
}

// Keys [j0, j0 + n) of head bh's dk and dv (either may be null) from their f32 sums [n][d].
template <typename T>
void store_rows(const AttentionGeometry& g, T* dk, T* dv, int64_t bh, int64_t j0, int64_t n, const float* dka,
                const float* dva) {
  for (int64_t j = 0; j < n; ++j) {
    if (dk != nullptr) store_row(dka + j * g.d, g.d, dk + g.dk_row(bh, j0 + j));
    if (dv != nullptr) store_row(dva + j * g.d, g.d, dv + g.dv_row(bh, j0 + j));
  }
}

// A head's backward scratch, carved from a thread's buffer (kept across its heads).
struct HeadGradScratch {
  float* qf;   // [tq][d]
  float* dof;  // [tq][d]
  float* dqa;  // [tq][d]
  float* kf;   // [kKeys][d]
  float* kt;   // [d][kKeys]
  float* vt;   // [d][kKeys]
  float* dka;  // [kKeys][d]
  float* dva;  // [kKeys][d]
  float* p;    // [kRows][kKeys]
  float* ds;   // [kRows][kKeys]
  float* pt;   // [kKeys][kRows]
  float* dst;  // [kKeys][kRows]
  float* dp;   // [kKeys]

  static HeadGradScratch carve(Scratch& scratch, int64_t tq, int64_t d) {
    scratch.resize(
        std::max(scratch.size(), static_cast<std::size_t>(3 * tq * d + 5 * kKeys * d + 4 * kRows * kKeys + kKeys)));
    HeadGradScratch s;
    s.qf = scratch.data();
    s.dof = s.qf + tq * d;
    s.dqa = s.dof + tq * d;
    s.kf = s.dqa + tq * d;
    s.kt = s.kf + kKeys * d;
    s.vt = s.kt + kKeys * d;
    s.dka = s.vt + kKeys * d;
    s.dva = s.dka + kKeys * d;
    s.p = s.dva + kKeys * d;
    s.ds = s.p + kRows * kKeys;
    s.pt = s.ds + kRows * kKeys;
    s.dst = s.pt + kRows * kKeys;
    s.dp = s.dst + kRows * kKeys;
    return s;
  }
};

// Query rows [i0, i0 + nr) against keys [j0, j0 + nk): their probabilities p and ds (zero where
// masked), dq of each row from ds and the tile's keys, then dv_j and dk_j from the block's columns
// of p and ds (transposed), so every sum runs in the order of the query rows.
void backward_row_block(const AttentionGeometry& g, const HeadGradScratch& s, const float* lse_h, const float* delta_h,
                        int64_t i0, int64_t nr, int64_t j0, int64_t nk) {
  const int64_t d = g.d;
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t i = i0 + r;
    const int64_t n = std::max<int64_t>(0, std::min(nk, g.key_end(i) - j0));
    float* pr = s.p + r * kKeys;
    float* dsr = s.ds + r * kKeys;
    if (n > 0) {
      tile_dots(s.qf + i * d, s.kt, d, pr);
      for (int64_t j = 0; j < n; ++j) pr[j] = pr[j] * g.scale - lse_h[i];
      exp_in_place(pr, n);
      tile_dots(s.dof + i * d, s.vt, d, s.dp);
      for (int64_t j = 0; j < n; ++j) dsr[j] = pr[j] * (s.dp[j] - delta_h[i]) * g.scale;
      add_weighted_rows(dsr, s.kf, n, d, s.dqa + i * d);
    }
    std::fill(pr + n, pr + kKeys, 0.0f);
    std::fill(dsr + n, dsr + kKeys, 0.0f);
  }
  for (int64_t j = 0; j < nk; ++j)
    for (int64_t r = 0; r < nr; ++r) {
      s.pt[j * kRows + r] = s.p[r * kKeys + j];
      s.dst[j * kRows + r] = s.ds[r * kKeys + j];
    }
  for (int64_t j = 0; j < nk; ++j) {
    add_weighted_rows(s.pt + j * kRows, s.dof + i0 * d, nr, d, s.dva + j * d);
    add_weighted_rows(s.dst + j * kRows, s.qf + i0 * d, nr, d, s.dka + j * d);
  }
}

// One head's gradients: per key tile, its blocks of kRows query rows (backward_row_block), then the
// tile's dk and dv stored.
template <typename T>
void backward_head(const AttentionGeometry& g, const T* q, const T* k, const T* v, const T* out, const float* lse,
                   const T* dout, float* delta, T* dq, T* dk, T* dv, int64_t bh, Scratch& scratch) {
  const int64_t d = g.d, tq = g.tq, tk = g.tk;
  const HeadGradScratch s = HeadGradScratch::carve(scratch, tq, d);
  std::fill(s.dqa, s.dqa + tq * d, 0.0f);  // the only scratch that needs zeros
  const float* lse_h = lse + bh * tq;
  float* delta_h = delta + bh * tq;
  for (int64_t i = 0; i < tq; ++i) {
    load_row(q + g.q_row(bh, i), s.qf + i * d, d);
    load_row(dout + g.do_row(bh, i), s.dof + i * d, d);
  }
  row_deltas(g, out, bh, s.dof, delta_h);
  const T* kh = k + g.k_row(bh, 0);
  const T* vh = v + g.v_row(bh, 0);
  for (int64_t j0 = 0; j0 < tk; j0 += kKeys) {
    const int64_t nk = std::min(kKeys, tk - j0);
    load_tile(kh, g.k_stride[2], j0, nk, d, s.kt, s.kf);
    load_tile(vh, g.v_stride[2], j0, nk, d, s.vt, nullptr);
    std::fill(s.dka, s.dka + 2 * kKeys * d, 0.0f);  // dka and dva
    for (int64_t i0 = g.causal ? j0 : 0; i0 < tq; i0 += kRows)
      backward_row_block(g, s, lse_h, delta_h, i0, std::min(kRows, tq - i0), j0, nk);
    store_rows(g, dk, dv, bh, j0, nk, s.dka, s.dva);
  }
  if (dq != nullptr)
    for (int64_t i = 0; i < tq; ++i) store_row(s.dqa + i * d, d, dq + g.dq_row(bh, i));
}

// Note [Fused attention as tile products]
// Where the CPU has AVX2 or AVX-512F, a block's tiles go through kernels/cpu/vec_math.h's gemm_f32
// and attention tile functions (vec512's, or vec's 8 lanes at a time: TileKernels) as small matrix
// products rather than row by row: the scores of all kRows query rows against the key tile (q
// [rows][d] times the transposed tile), the online softmax over those rows, then acc += p v; in the
// backward (blocks of kRowsWide rows), p and dp = do v^T for the block, ds from both, dq += ds k,
// dv += p^T do and dk += ds^T q (the transposed operands read in place). Each product keeps a block
// of outputs in registers over its whole inner sum, and stops at the block's last visible key
// (causal blocks on the diagonal see only part of a tile): a register block reuses each load across
// its rows and columns. f32 q, k, v and do are read where they lie and the gradients summed in
// place; only the keys (and the values in the backward) are transposed, once per head in the
// forward (HeadTiles), 8 x 8 in registers, and the scratch tiles start on cache lines. Each output
// is still summed in a fixed order that depends only on the shapes, so the bits are the same at any
// thread count; the two widths' products give the same bits, their softmax tiles differ by the
// roundings of their lane sums.
struct TileKernels {
  decltype(&vec512::gemm_f32) gemm;
  decltype(&vec512::attention_softmax_tile_f32) softmax_tile;
  decltype(&vec512::attention_grad_tile_f32) grad_tile;
  decltype(&vec::transpose_f32) transpose;  // AVX2's at both widths
  decltype(&vec::row_dots_f64) row_dots;
};

// The tile functions this CPU runs, or null for the plain loops.
const TileKernels* tile_kernels() {
  if constexpr (vec::kBuilt) {
    static const TileKernels wide{vec512::gemm_f32, vec512::attention_softmax_tile_f32, vec512::attention_grad_tile_f32,
                                  vec::transpose_f32, vec::row_dots_f64};
    static const TileKernels narrow{vec::gemm_f32, vec::attention_softmax_tile_f32, vec::attention_grad_tile_f32,
                                    vec::transpose_f32, vec::row_dots_f64};
    if (vec512::available()) return &wide;
    if (vec::available()) return &narrow;
  }
  return nullptr;
}

// The tiled backward's blocks of query rows: 32, so that dv += p^T do and dk += ds^T q sum over 32
// rows a call, but 16 where the rows meet the key tile's diagonal. A causal block's products stop
// at its last row's key, so smaller blocks there skip more of the masked triangle: at T = 64, 2,560
// of a head's 4,096 (row, key) pairs against 3,072 (the small GPT's backward 5-8% faster alone;
// blocks of 8 were slower, the products' k too short). The bits do not depend on the blocks: each
// product adds its terms to c in order, one fused multiply-add each, and a block only drops terms
// that are exact zeros (masked p and ds), which leave a sum that never holds -0 unchanged.
constexpr int64_t kRowsWide = 32;
constexpr int64_t kRowsDiagonal = 16;

// A head's keys, transposed (kt [d][ldk]), and values (f32 storage: read in place at their row
// stride; other types: converted into v [tk][d]), loaded once for all the blocks of query rows a
// thread takes from that head.
struct HeadTiles {
  Scratch data;
  int64_t bh = -1, ldk = 0, ldv = 0;
  const float* v = nullptr;
  const float* kt() const { return data.data(); }
};

template <typename T>
void load_head(const TileKernels& t, const AttentionGeometry& g, const T* k, const T* v, int64_t bh, HeadTiles& h) {
  if (h.bh == bh) return;
  const int64_t d = g.d, tk = g.tk;
  h.ldk = (tk + 15) / 16 * 16;
  h.data.resize(static_cast<std::size_t>(d * h.ldk + tk * d));
  float* kt = h.data.data();
  const T* kh = k + g.k_row(bh, 0);
  const int64_t ks = g.k_stride[2];
  if constexpr (std::is_same_v<T, float>) {
    t.transpose(kh, ks, tk, d, kt, h.ldk);
    h.v = v + g.v_row(bh, 0);
    h.ldv = g.v_stride[2];
  } else {
    for (int64_t c = 0; c < d; ++c)
      for (int64_t j = 0; j < tk; ++j) kt[c * h.ldk + j] = to_f32(kh[j * ks + c]);
    float* vf = kt + d * h.ldk;
    for (int64_t j = 0; j < tk; ++j) load_row(v + g.v_row(bh, j), vf + j * d, d);
    h.v = vf;
    h.ldv = d;
  }
  h.bh = bh;
}

template <typename T>
void forward_block_tiled(const TileKernels& t, const AttentionGeometry& g, const T* q, const T* k, const T* v, T* out,
                         float* lse, int64_t bh, int64_t i0, Scratch& scratch, std::vector<double>& sums,
                         HeadTiles& head) {
  const int64_t d = g.d, i1 = std::min(i0 + kRows, g.tq), nq = i1 - i0;
  scratch.resize(std::max(scratch.size(), static_cast<std::size_t>(2 * kRows * d + kRows * kKeys + kRows)));
  float* qf = scratch.data();    // [kRows][d]
  float* acc = qf + kRows * d;   // [kRows][d]
  float* s = acc + kRows * d;    // [kRows][kKeys]
  float* m = s + kRows * kKeys;  // [kRows]
  int64_t valid[kRows];
  std::fill(acc, acc + kRows * d, 0.0f);
  sums.assign(static_cast<std::size_t>(kRows), 0.0);
  const float* qs = qf;
  int64_t q_ld = d;
  if constexpr (std::is_same_v<T, float>) {
    qs = q + g.q_row(bh, i0);
    q_ld = g.q_stride[2];
  } else {
    for (int64_t r = 0; r < nq; ++r) load_row(q + g.q_row(bh, i0 + r), qf + r * d, d);
  }
  for (int64_t r = 0; r < nq; ++r) m[r] = -std::numeric_limits<float>::infinity();
  load_head(t, g, k, v, bh, head);
  const float* kt = head.kt();
  const float* vf = head.v;
  const int64_t key_end = g.key_end(i1 - 1);
  for (int64_t j0 = 0; j0 < key_end; j0 += kKeys) {
    const int64_t nk = std::min(kKeys, key_end - j0);
    for (int64_t r = 0; r < nq; ++r) valid[r] = std::min(nk, g.key_end(i0 + r) - j0);
    t.gemm(nq, nk, d, qs, q_ld, 1, kt + j0, head.ldk, s, kKeys, false);
    t.softmax_tile(s, kKeys, nq, valid, nk, g.scale, m, sums.data(), acc, d);
    t.gemm(nq, d, nk, s, kKeys, 1, vf + j0 * head.ldv, head.ldv, acc, d, true);
  }
  finish_rows(g, out, lse, bh, i0, nq, acc, m, sums);
}

// load_tile's transpose of f32 rows [j0, j0 + n) into tile [d][kKeys] (zero past n), vectorized.
void transposed_tile(const TileKernels& t, const float* base, int64_t row_stride, int64_t j0, int64_t n, int64_t d,
                     float* tile) {
  if (n < kKeys)
    for (int64_t c = 0; c < d; ++c) std::fill(tile + c * kKeys + n, tile + (c + 1) * kKeys, 0.0f);
  t.transpose(base + j0 * row_stride, row_stride, n, d, tile, kKeys);
}

// One key tile's share of a head's tiled backward: where it reads q, do and the tile's keys (rows
// at their leading dimensions), where it sums dq, dk and dv (null: not asked), its scratch tiles.
struct KeyTileWork {
  const float *q = nullptr, *dout = nullptr, *k = nullptr;
  int64_t q_ld = 0, do_ld = 0, k_ld = 0;
  float *dq = nullptr, *dk = nullptr, *dv = nullptr;
  int64_t dq_ld = 0, dk_ld = 0, dv_ld = 0;
  const float *kt = nullptr, *vt = nullptr;  // the tile's keys and values transposed, [d][kKeys]
  float *p = nullptr, *ds = nullptr;         // [kRowsWide][kKeys]
  const float *lse = nullptr, *delta = nullptr;
};

void zero_rows(float* x, int64_t ld, int64_t rows, int64_t d) {
  if (x == nullptr) return;
  for (int64_t r = 0; r < rows; ++r) std::fill(x + r * ld, x + r * ld + d, 0.0f);
}

// The blocks of query rows that see keys [j0, j0 + nk): p and dp = do v^T for the block, ds from
// both, dq += ds k, dv += p^T do and dk += ds^T q (the transposed operands read in place).
void backward_key_tile(const TileKernels& t, const AttentionGeometry& g, const KeyTileWork& w, int64_t j0, int64_t nk) {
  const int64_t d = g.d;
  int64_t valid[kRowsWide];
  for (int64_t i0 = g.causal ? j0 : 0, nr = 0; i0 < g.tq; i0 += nr) {
    nr = std::min(g.causal && i0 < j0 + nk ? kRowsDiagonal : kRowsWide, g.tq - i0);
    int64_t width = 0;  // the keys of the tile any of the block's rows sees
    for (int64_t r = 0; r < nr; ++r) {
      valid[r] = std::max<int64_t>(0, std::min(nk, g.key_end(i0 + r) - j0));
      width = std::max(width, valid[r]);
    }
    if (width == 0) continue;
    const float* qb = w.q + i0 * w.q_ld;
    const float* dob = w.dout + i0 * w.do_ld;
    t.gemm(nr, width, d, qb, w.q_ld, 1, w.kt, kKeys, w.p, kKeys, false);
    t.gemm(nr, width, d, dob, w.do_ld, 1, w.vt, kKeys, w.ds, kKeys, false);
    t.grad_tile(w.p, w.ds, kKeys, nr, valid, width, g.scale, w.lse + i0, w.delta + i0);
    if (w.dq != nullptr) t.gemm(nr, d, width, w.ds, kKeys, 1, w.k, w.k_ld, w.dq + i0 * w.dq_ld, w.dq_ld, true);
    if (w.dv != nullptr) t.gemm(width, d, nr, w.p, 1, kKeys, dob, w.do_ld, w.dv, w.dv_ld, true);
    if (w.dk != nullptr) t.gemm(width, d, nr, w.ds, 1, kKeys, qb, w.q_ld, w.dk, w.dk_ld, true);
  }
}

template <typename T>
void backward_head_tiled(const TileKernels& t, const AttentionGeometry& g, const T* q, const T* k, const T* v,
                         const T* out, const float* lse, const T* dout, float* delta, T* dq, T* dk, T* dv, int64_t bh,
                         Scratch& scratch) {
  const int64_t d = g.d, tq = g.tq, tk = g.tk;
  // f32 storage is read where it lies (q, k and do at their row strides) and the gradients summed
  // straight into dq, dk and dv at theirs; other types go through f32 copies.
  constexpr bool kF32 = std::is_same_v<T, float>;
  scratch.resize(
      std::max(scratch.size(), static_cast<std::size_t>(3 * tq * d + 5 * kKeys * d + 2 * kRowsWide * kKeys)));
  float* kt = scratch.data();          // [d][kKeys], first: the products' operands aligned
  float* vt = kt + kKeys * d;          // [d][kKeys]
  float* p = vt + kKeys * d;           // [kRowsWide][kKeys]
  float* ds = p + kRowsWide * kKeys;   // [kRowsWide][kKeys]
  float* kf = ds + kRowsWide * kKeys;  // [kKeys][d]
  float* dka = kf + kKeys * d;         // [kKeys][d]
  float* dva = dka + kKeys * d;        // [kKeys][d]
  float* qf = dva + kKeys * d;         // [tq][d]
  float* dof = qf + tq * d;            // [tq][d]
  float* dqa = dof + tq * d;           // [tq][d]
  KeyTileWork w;
  w.kt = kt, w.vt = vt, w.p = p, w.ds = ds, w.lse = lse + bh * tq, w.delta = delta + bh * tq;
  if constexpr (kF32) {
    w.q = q + g.q_row(bh, 0), w.q_ld = g.q_stride[2];
    w.dout = dout + g.do_row(bh, 0), w.do_ld = g.do_stride[2];
    w.dq = dq != nullptr ? dq + g.dq_row(bh, 0) : nullptr, w.dq_ld = g.dq_stride[2];
    t.row_dots(w.dout, w.do_ld, out + g.o_row(bh, 0), g.o_stride[2], tq, d, delta + bh * tq);
  } else {
    for (int64_t i = 0; i < tq; ++i) {
      load_row(q + g.q_row(bh, i), qf + i * d, d);
      load_row(dout + g.do_row(bh, i), dof + i * d, d);
    }
    w.q = qf, w.q_ld = d, w.dout = dof, w.do_ld = d, w.dq = dq != nullptr ? dqa : nullptr, w.dq_ld = d;
    row_deltas(g, out, bh, dof, delta + bh * tq);
  }
  zero_rows(w.dq, w.dq_ld, tq, d);
  const T* kh = k + g.k_row(bh, 0);
  const T* vh = v + g.v_row(bh, 0);
  for (int64_t j0 = 0; j0 < tk; j0 += kKeys) {
    const int64_t nk = std::min(kKeys, tk - j0);
    if constexpr (kF32) {
      transposed_tile(t, kh, g.k_stride[2], j0, nk, d, kt);
      transposed_tile(t, vh, g.v_stride[2], j0, nk, d, vt);
      w.k = kh + j0 * g.k_stride[2], w.k_ld = g.k_stride[2];
      w.dk = dk != nullptr ? dk + g.dk_row(bh, j0) : nullptr, w.dk_ld = g.dk_stride[2];
      w.dv = dv != nullptr ? dv + g.dv_row(bh, j0) : nullptr, w.dv_ld = g.dv_stride[2];
    } else {
      load_tile(kh, g.k_stride[2], j0, nk, d, kt, kf);
      load_tile(vh, g.v_stride[2], j0, nk, d, vt, nullptr);
      w.k = kf, w.k_ld = d, w.dk = dk != nullptr ? dka : nullptr, w.dv = dv != nullptr ? dva : nullptr;
      w.dk_ld = w.dv_ld = d;
    }
    zero_rows(w.dk, w.dk_ld, nk, d);
    zero_rows(w.dv, w.dv_ld, nk, d);
    backward_key_tile(t, g, w, j0, nk);
    if constexpr (!kF32) store_rows(g, dk, dv, bh, j0, nk, dka, dva);
  }
  if constexpr (!kF32)
    if (dq != nullptr)
      for (int64_t i = 0; i < tq; ++i) store_row(dqa + i * d, d, dq + g.dq_row(bh, i));
}

}  // namespace

template <typename T>
void attention_forward_cpu(const AttentionGeometry& g, const T* q, const T* k, const T* v, T* out, float* lse) {
  const int64_t blocks = (g.tq + kRows - 1) / kRows;
  if (g.bh() == 0 || blocks == 0 || g.tk == 0) return;
  const TileKernels* tiles = tile_kernels();
  // The tiled blocks share their head's loaded keys and values within a chunk: whole heads a chunk
  // where there are enough of them to go round.
  const int64_t grain = tiles != nullptr && g.bh() >= 8 ? blocks : 1;
  parallel_for(g.bh() * blocks, grain, [&](int64_t u0, int64_t u1) {
    Scratch scratch;
    std::vector<double> sums;
    HeadTiles head;
    for (int64_t u = u0; u < u1; ++u) {
      if (tiles != nullptr && u + 1 < u1) {
        const int64_t i_next = ((u + 1) % blocks) * kRows;
        prefetch_rows(q + g.q_row((u + 1) / blocks, i_next), g.q_stride[2], std::min(kRows, g.tq - i_next), g.d);
        prefetch_rows(out + g.o_row((u + 1) / blocks, i_next), g.o_stride[2], std::min(kRows, g.tq - i_next), g.d);
      }
      if (tiles != nullptr)
        forward_block_tiled(*tiles, g, q, k, v, out, lse, u / blocks, (u % blocks) * kRows, scratch, sums, head);
      else forward_block(g, q, k, v, out, lse, u / blocks, (u % blocks) * kRows, scratch, sums);
    }
  });
}

template <typename T>
void attention_backward_cpu(const AttentionGeometry& g, const T* q, const T* k, const T* v, const T* out,
                            const float* lse, const T* dout, float* delta, T* dq, T* dk, T* dv) {
  if (g.bh() == 0 || g.tk == 0) return;  // no query rows: dk and dv are still written (zeros)
  const TileKernels* tiles = tile_kernels();
  parallel_for(g.bh(), 1, [&](int64_t h0, int64_t h1) {
    Scratch scratch;
    for (int64_t bh = h0; bh < h1; ++bh) {
      if (tiles != nullptr) prefetch_rows(q + g.q_row(bh, 0), g.q_stride[2], g.tq, g.d);
      if (tiles != nullptr) backward_head_tiled(*tiles, g, q, k, v, out, lse, dout, delta, dq, dk, dv, bh, scratch);
      else backward_head(g, q, k, v, out, lse, dout, delta, dq, dk, dv, bh, scratch);
    }
  });
}

#define CUMULUS_INSTANTIATE(T)                                                                                         \
  template void attention_forward_cpu(const AttentionGeometry&, const T*, const T*, const T*, T*, float*);             \
  template void attention_backward_cpu(const AttentionGeometry&, const T*, const T*, const T*, const T*, const float*, \
                                       const T*, float*, T*, T*, T*);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
