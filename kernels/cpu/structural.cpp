// CPU kernels of the structural ops (kernels/cpu/structural_kernels.h): layer norm, slab copies for
// cat / split / narrow, and gathers with their scatter-add for index_select and embedding.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/structural_kernels.h"
#include "kernels/cpu/vec_math.h"

namespace cumulus::kernels {

namespace {

float blend(float value, float beta, float old) { return beta == 0.0f ? value : value + beta * old; }

}  // namespace

// Two passes per row (the mean, then sum (x - mean)^2), both in double: no cancellation when the
// mean is large against the spread, no drift over wide rows, and no overflow of the squares (a
// float sum of squares past 3.4e38 would make rstd 0 and the output the bias). The same formulas as
// kernels/cuda/structural.cu, whose sums run in another order.
template <typename T>
void layer_norm_forward_cpu(const T* x, const float* weight, const float* bias, int64_t rows, int64_t cols, float eps,
                            T* y, float* mean, float* rstd) {
  if constexpr (vec::kBuilt && std::is_same_v<T, float>) {
    if (vec::available()) {
      const auto row = vec512::available() ? vec512::layer_norm_row_f32 : vec::layer_norm_row_f32;
      parallel_for(rows, grain_for(cols), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) row(x + r * cols, weight, bias, cols, eps, y + r * cols, mean + r, rstd + r);
      });
      return;
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    double s = 0.0;
    for (int64_t c = 0; c < cols; ++c) s += to_f32(xr[c]);
    const double m = s / static_cast<double>(cols);
    double ss = 0.0;
    for (int64_t c = 0; c < cols; ++c) ss += (to_f32(xr[c]) - m) * (to_f32(xr[c]) - m);
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(cols) + eps);
    mean[r] = static_cast<float>(m);
    rstd[r] = static_cast<float>(inv);
    for (int64_t c = 0; c < cols; ++c) {
      float v = static_cast<float>((to_f32(xr[c]) - m) * inv);
      if (weight != nullptr) v *= weight[c];
      if (bias != nullptr) v += bias[c];
      y[r * cols + c] = from_f32<T>(v);
    }
  }
}

// The row sums in double, as the forward's (vectorized: in float blocks, then double, Note [Blocked
// float sums] in vec_math_avx512.cpp).
// Rows of one element take the scalar loop: there g - mean(g) and x - mean are exactly 0, so dx
// is exactly 0 (PyTorch's), where the vector row's folded form a g + (b t + c) leaves a rounding
// of rstd g (3e-5 at eps 1e-5).
template <typename T>
void layer_norm_backward_dx_cpu(const T* x, const T* dy, const float* weight, const float* mean, const float* rstd,
                                int64_t rows, int64_t cols, float beta, T* dx) {
  if constexpr (vec::kBuilt && std::is_same_v<T, float>) {
    if (vec::available() && cols > 1) {
      const auto row = vec512::available() ? vec512::layer_norm_grad_row_f32 : vec::layer_norm_grad_row_f32;
      parallel_for(rows, grain_for(cols), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
          row(x + r * cols, dy + r * cols, weight, mean[r], rstd[r], cols, beta, dx + r * cols, nullptr, nullptr);
      });
      return;
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    const T* dyr = dy + r * cols;
    const float m = mean[r], inv = rstd[r];
    double sum_g = 0.0, sum_g_xhat = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      const double g = to_f32(dyr[c]) * (weight != nullptr ? weight[c] : 1.0f);
      sum_g += g;
      sum_g_xhat += g * ((static_cast<double>(to_f32(xr[c])) - m) * inv);
    }
    const auto mean_g = static_cast<float>(sum_g / static_cast<double>(cols));
    const auto mean_g_xhat = static_cast<float>(sum_g_xhat / static_cast<double>(cols));
    for (int64_t c = 0; c < cols; ++c) {
      const float g = to_f32(dyr[c]) * (weight != nullptr ? weight[c] : 1.0f);
      const auto xhat = static_cast<float>((static_cast<double>(to_f32(xr[c])) - m) * inv);
      T& out = dx[r * cols + c];
      out = from_f32<T>(blend(inv * (g - mean_g - xhat * mean_g_xhat), beta, to_f32(out)));
    }
  }
}

// Row by row into a double per column, so x and dy are read in order (a column at a time strided
// through both), the columns split across threads; each column still adds its rows in order, so the
// bits are those of a column loop.
template <typename T>
void layer_norm_param_grads_cpu(const T* x, const T* dy, const float* mean, const float* rstd, int64_t rows,
                                int64_t cols, float beta_dw, float* dweight, float beta_db, float* dbias) {
  constexpr int64_t kColumns = 256;  // a block's sums stay in the L1 cache
  auto block = [&](int64_t c0, int64_t c1) {
    double sw[kColumns] = {}, sb[kColumns] = {};  // in double, as the forward's sums
    bool summed = false;
    if constexpr (vec::kBuilt && std::is_same_v<T, float>) {
      if (vec512::available()) {
        for (int64_t r = 0; r < rows; ++r)
          vec512::layer_norm_param_grads_row_f32(x + r * cols + c0, dy + r * cols + c0, mean[r], rstd[r], c1 - c0, sw,
                                                 sb);
        summed = true;
      }
    }
    for (int64_t r = 0; r < rows && !summed; ++r) {
      const T *xr = x + r * cols, *dyr = dy + r * cols;
      const double m = mean[r], inv = rstd[r];
      for (int64_t c = c0; c < c1; ++c) {
        const float g = to_f32(dyr[c]);
        sw[c - c0] += g * ((static_cast<double>(to_f32(xr[c])) - m) * inv);
        sb[c - c0] += g;
      }
    }
    for (int64_t c = c0; c < c1; ++c) {
      if (dweight != nullptr) dweight[c] = blend(static_cast<float>(sw[c - c0]), beta_dw, dweight[c]);
      if (dbias != nullptr) dbias[c] = blend(static_cast<float>(sb[c - c0]), beta_db, dbias[c]);
    }
  };
  parallel_for(cols, kColumns, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; c += kColumns) block(c, std::min(c1, c + kColumns));
  });
}

// Note [Layer norm's backward in one pass]
// dx reads each row of x and dy; the parameter gradients read them all again, column blocks down
// the rows. With AVX2 or AVX-512 the row kernel adds the parameter sums on its way instead, in float over
// groups of kRowGroup rows, each group's partial sums then in double into a sum per block of whole
// rows, and the blocks' sums in order at the end (Note [Blocked float sums] in vec_math_avx512.cpp:
// the double read-modify-write of two sums a column every row cost as much as the rest of the
// backward). x and dy are read from memory once, and the bits do not depend on the thread count
// (the groups and blocks follow from the shape alone: at most 64 blocks, and at most kSumsBytes
// of sums, a workspace of this kernel's own outside the memory tracker, as OpenBLAS's packing
// buffers are). Against layer_norm_param_grads_cpu's double sums row by row: within a few
// roundings of a group's terms' magnitudes.
template <typename T>
void layer_norm_backward_cpu(const T* x, const T* dy, const float* weight, const float* mean, const float* rstd,
                             int64_t rows, int64_t cols, float beta, T* dx, float beta_dw, float* dweight,
                             float beta_db, float* dbias) {
  const bool params = dweight != nullptr || dbias != nullptr;
  if constexpr (vec::kBuilt && std::is_same_v<T, float>) {
    // Rows of one element: the scalar loops, as layer_norm_backward_dx_cpu says.
    if (dx != nullptr && params && rows > 0 && cols > 1 && vec::available()) {
      const bool wide = vec512::available();
      const auto row = wide ? vec512::layer_norm_grad_row_f32 : vec::layer_norm_grad_row_f32;
      const auto add_sums = wide ? vec512::add_float_sums : vec::add_float_sums;
      constexpr int64_t kSumsBytes = int64_t{4} << 20, kRowGroup = 8;
      const int64_t max_blocks = std::clamp<int64_t>(kSumsBytes / (2 * cols * int64_t{sizeof(double)}), 1, 64);
      const int64_t block_rows = std::max<int64_t>(grain_for(cols), (rows + max_blocks - 1) / max_blocks);
      const int64_t blocks = (rows + block_rows - 1) / block_rows;
      std::vector<double> sums(static_cast<std::size_t>(blocks * 2 * cols), 0.0);  // per block: sw, then sb
      parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) {
        std::vector<float> partial(static_cast<std::size_t>(2 * cols), 0.0f);  // a group's sw, then sb
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t first = b * block_rows, end = std::min(rows, first + block_rows);
          for (int64_t r = first; r < end; ++r) {
            row(x + r * cols, dy + r * cols, weight, mean[r], rstd[r], cols, beta, dx + r * cols, partial.data(),
                partial.data() + cols);
            if ((r - first) % kRowGroup == kRowGroup - 1 || r == end - 1)
              add_sums(partial.data(), 2 * cols, sums.data() + b * 2 * cols);
          }
        }
      });
      for (int64_t b = 1; b < blocks; ++b)  // the blocks in order into the first, a row of sums at a time
        for (int64_t c = 0; c < 2 * cols; ++c)
          sums[static_cast<std::size_t>(c)] += sums[static_cast<std::size_t>(b * 2 * cols + c)];
      for (int64_t c = 0; c < cols; ++c) {
        if (dweight != nullptr)
          dweight[c] = blend(static_cast<float>(sums[static_cast<std::size_t>(c)]), beta_dw, dweight[c]);
        if (dbias != nullptr)
          dbias[c] = blend(static_cast<float>(sums[static_cast<std::size_t>(cols + c)]), beta_db, dbias[c]);
      }
      return;
    }
  }
  if (dx != nullptr) layer_norm_backward_dx_cpu(x, dy, weight, mean, rstd, rows, cols, beta, dx);
  if (params) layer_norm_param_grads_cpu(x, dy, mean, rstd, rows, cols, beta_dw, dweight, beta_db, dbias);
}

template <typename T>
void copy_slab_cpu(const T* src, int64_t src_dim, int64_t src_start, T* dst, int64_t dst_dim, int64_t dst_start,
                   int64_t outer, int64_t length, int64_t inner, float beta) {
  const int64_t span = length * inner;
  for (int64_t o = 0; o < outer; ++o) {
    const T* s = src + (o * src_dim + src_start) * inner;
    T* d = dst + (o * dst_dim + dst_start) * inner;
    for (int64_t k = 0; k < span; ++k) d[k] = beta == 0.0f ? s[k] : from_f32<T>(to_f32(s[k]) + beta * to_f32(d[k]));
  }
}

template <typename T>
void narrow_backward_cpu(const T* dy, int64_t outer, int64_t dim, int64_t start, int64_t length, int64_t inner,
                         float beta, T* dx) {
  // Per outer index the slab is one run of length * inner elements (a split of the last dimension:
  // a run of a row), so the work is runs of copies or adds, not a test per element.
  const int64_t run = length * inner, before = start * inner, after = (dim - start - length) * inner;
  for (int64_t o = 0; o < outer; ++o) {
    T* out = dx + o * dim * inner;
    const T* in = dy + o * run;
    if (beta == 0.0f) {
      std::fill(out, out + before, from_f32<T>(0.0f));
      std::copy(in, in + run, out + before);
      std::fill(out + before + run, out + before + run + after, from_f32<T>(0.0f));
    } else {
      for (int64_t i = 0; i < run; ++i)
        out[before + i] = from_f32<T>(blend(to_f32(in[i]), beta, to_f32(out[before + i])));
    }
  }
}

// Whether any index is out of range first, in one pass without an exit (an unsigned compare: a
// negative index is above every limit), which the compiler vectorizes; then where, only if so.
int64_t first_index_out_of_range_cpu(const int32_t* indices, int64_t count, int64_t dim) {
  const uint32_t limit = static_cast<uint32_t>(std::min<int64_t>(dim, int64_t{1} << 31));
  bool any = false;
  for (int64_t j = 0; j < count; ++j) any |= static_cast<uint32_t>(indices[j]) >= limit;
  if (!any) return -1;
  for (int64_t j = 0; j < count; ++j)
    if (indices[j] < 0 || indices[j] >= dim) return j;
  return -1;
}

// Each gathered row is one memcpy: the element loop compiled to 16-byte SSE copies behind an
// overlap check per row (an embedding's [8, 64] ids into [65, 128] rows: 10.5 us, PyTorch 10.1).
template <typename T>
void index_gather_cpu(const T* x, int64_t outer, int64_t dim, const int32_t* indices, int64_t count, int64_t inner,
                      T* y) {
  static_assert(std::is_trivially_copyable_v<T>);
  const std::size_t bytes = static_cast<std::size_t>(inner) * sizeof(T);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < count; ++j)
      std::memcpy(y + (o * count + j) * inner, x + (o * dim + indices[j]) * inner, bytes);
}

// Each destination row's sum starts from beta * dx (0 for beta 0) and adds its contributions in the
// order of j, in f32, rounded once: the order kernels/cuda/structural.cu takes, so both give the same
// bits. The chain of positions holding each index (first[d], next[j]) visits them in that order.
template <typename T>
void index_scatter_add_cpu(const T* dy, int64_t outer, int64_t count, const int32_t* indices, int64_t dim,
                           int64_t inner, float beta, T* dx) {
  std::vector<int64_t> first(static_cast<std::size_t>(dim), -1), next(static_cast<std::size_t>(count), -1);
  for (int64_t j = count - 1; j >= 0; --j) {
    next[j] = first[indices[j]];
    first[indices[j]] = j;
  }
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t d = 0; d < dim; ++d) {
      T* out = dx + (o * dim + d) * inner;
      for (int64_t i = 0; i < inner; ++i) {
        float acc = beta == 0.0f ? 0.0f : beta * to_f32(out[i]);
        for (int64_t j = first[d]; j >= 0; j = next[j]) acc += to_f32(dy[(o * count + j) * inner + i]);
        if (beta == 0.0f || first[d] >= 0) out[i] = from_f32<T>(acc);
      }
    }
}

#define CUMULUS_INSTANTIATE(T)                                                                                      \
  template void layer_norm_forward_cpu(const T*, const float*, const float*, int64_t, int64_t, float, T*, float*,   \
                                       float*);                                                                     \
  template void layer_norm_backward_dx_cpu(const T*, const T*, const float*, const float*, const float*, int64_t,   \
                                           int64_t, float, T*);                                                     \
  template void layer_norm_param_grads_cpu(const T*, const T*, const float*, const float*, int64_t, int64_t, float, \
                                           float*, float, float*);                                                  \
  template void layer_norm_backward_cpu(const T*, const T*, const float*, const float*, const float*, int64_t,      \
                                        int64_t, float, T*, float, float*, float, float*);                          \
  template void copy_slab_cpu(const T*, int64_t, int64_t, T*, int64_t, int64_t, int64_t, int64_t, int64_t, float);  \
  template void narrow_backward_cpu(const T*, int64_t, int64_t, int64_t, int64_t, int64_t, float, T*);              \
  template void index_gather_cpu(const T*, int64_t, int64_t, const int32_t*, int64_t, int64_t, T*);                 \
  template void index_scatter_add_cpu(const T*, int64_t, int64_t, const int32_t*, int64_t, int64_t, float, T*);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
