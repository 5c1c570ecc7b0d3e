// conv2d on the CPU: im2col over a chunk of samples, then one OpenBLAS GEMM per chunk.
//   x_n: [c, h, w] -> columns [c*r*s, oh*ow] (row (ci, ki, kj), column (oi, oj) holds
//   x_n[ci, oi*stride_h - pad_h + ki, oj*stride_w - pad_w + kj], 0 in the padding). A chunk of m
//   samples lays its columns side by side: cols [c*r*s, m*oh*ow], sample j at column j*oh*ow.
//   forward          out  [k, m*oh*ow] = W [k, c*r*s] cols, then y_n[k, :] = out[k, n's part] + b[k]
//   backward data    dcols [c*r*s, m*oh*ow] = W^T dy_t, dx_n (+)= col2im(dcols, n's part)
//   backward filter  dW [k, c*r*s] (+)= dy_t cols^T, one GEMM per chunk
// where dy_t [k, m*oh*ow] is the chunk's dy regrouped by channel. The weight gradient accumulates
// inside the GEMMs: the sink's beta for the first chunk, 1 for the others (Note [Gradient
// sinks]), as Linear does. Backward keeps only x (saved by the op) and rebuilds the columns chunk
// by chunk, so no [n, c*r*s, oh*ow] tensor exists. Chunks are sized so the scratch stays within
// kScratchFloats: large enough for GEMMs that run near OpenBLAS's speed (a per-sample GEMM of the
// CNN's second conv is 64 x 196 x 288: too small to keep two cores busy). The copies around the
// GEMMs (im2col, the regrouping, col2im) run sample by sample across the kernel threads: each
// sample writes only its own part, so the bits do not depend on the thread count.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/conv_kernels.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/parallel.h"

namespace cumulus::kernels {

namespace {

constexpr int64_t kScratchFloats = int64_t{1} << 20;  // 4 MiB per scratch part

// Samples per chunk.
int64_t chunk_of(const Conv2dGeometry& g) {
  const int64_t ohw = g.col_cols();
  const int64_t per_sample = std::max(g.col_rows(), g.k) * ohw;
  return std::max<int64_t>(1, std::min(g.n, kScratchFloats / std::max<int64_t>(per_sample, 1)));
}

// The output columns oj whose input column oj*stride_w - pad_w + kj lies inside [0, w):
// [lo, hi). Outside it a row of columns is padding.
struct ColumnRange {
  int64_t lo, hi;
};
ColumnRange valid_columns(const Conv2dGeometry& g, int64_t kj) {
  const int64_t first = g.pad_w - kj, end = g.w + g.pad_w - kj;  // oj*stride_w in [first, end)
  const int64_t lo = first > 0 ? (first + g.stride_w - 1) / g.stride_w : 0;
  const int64_t hi = end > 0 ? (end + g.stride_w - 1) / g.stride_w : 0;
  return {std::min(lo, g.out_w), std::max(std::min(lo, g.out_w), std::min(hi, g.out_w))};
}

// Whether the output plane is the input's (stride 1, "same" padding, as a 3x3 kernel with padding
// 1): a row of columns is then the plane shifted by (ki - pad_h) rows and (kj - pad_w) columns.
bool same_plane(const Conv2dGeometry& g) {
  return g.stride_h == 1 && g.stride_w == 1 && g.out_h == g.h && g.out_w == g.w;
}

// One row of columns of a "same" plane xc: row[p] = xc[p + shift] where that element lies in the
// plane's row and column, else 0. One copy of the rows' span (a short row is shorter than a copy's
// call pays for), then the columns that wrapped into a neighbouring row are zeroed.
void shifted_plane(const Conv2dGeometry& g, const float* xc, int64_t ki, int64_t kj, float* row) {
  const int64_t w = g.w, hw = g.h * g.w, dr = ki - g.pad_h, dc = kj - g.pad_w, shift = dr * w + dc;
  const int64_t r0 = std::max<int64_t>(0, -dr), r1 = std::min(g.h, g.h - dr);  // rows read from inside
  const int64_t p0 = std::min(hw, std::max(r0 * w, -shift)), p1 = std::max(p0, std::min(r1 * w, hw - shift));
  std::fill(row, row + p0, 0.0f);
  if (p1 > p0) std::copy(xc + p0 + shift, xc + p1 + shift, row + p0);
  std::fill(row + p1, row + hw, 0.0f);
  // Columns read from inside: [c0, c1), within [0, w) even when the kernel is wider than the plane.
  const int64_t c0 = std::min(w, std::max<int64_t>(0, -dc)), c1 = std::max(c0, std::min(w, w - dc));
  for (int64_t oi = r0; oi < r1; ++oi) {
    for (int64_t oj = 0; oj < c0; ++oj) row[oi * w + oj] = 0.0f;
    for (int64_t oj = c1; oj < w; ++oj) row[oi * w + oj] = 0.0f;
  }
}

// Columns of one sample x [c, h, w] into cols (row stride ld).
void im2col(const Conv2dGeometry& g, const float* x, float* cols, int64_t ld) {
  const bool same = same_plane(g);
  for (int64_t ci = 0; ci < g.c; ++ci) {
    const float* xc = x + ci * g.h * g.w;
    for (int64_t ki = 0; ki < g.r; ++ki) {
      for (int64_t kj = 0; kj < g.s; ++kj) {
        float* row = cols + ((ci * g.r + ki) * g.s + kj) * ld;
        if (same) {
          shifted_plane(g, xc, ki, kj, row);
          continue;
        }
        const ColumnRange cr = valid_columns(g, kj);
        for (int64_t oi = 0; oi < g.out_h; ++oi) {
          float* out = row + oi * g.out_w;
          const int64_t ih = oi * g.stride_h - g.pad_h + ki;
          if (ih < 0 || ih >= g.h) {
            for (int64_t oj = 0; oj < g.out_w; ++oj) out[oj] = 0.0f;
            continue;
          }
          const float* xr = xc + ih * g.w - g.pad_w + kj;  // xr[oj * stride_w] is x[ih, iw(oj)]
          // Loops, not memcpy and memset: a row is a few dozen floats, shorter than a call pays for.
          for (int64_t oj = 0; oj < cr.lo; ++oj) out[oj] = 0.0f;
          if (g.stride_w == 1)
            for (int64_t oj = cr.lo; oj < cr.hi; ++oj) out[oj] = xr[oj];
          else
            for (int64_t oj = cr.lo; oj < cr.hi; ++oj) out[oj] = xr[oj * g.stride_w];
          for (int64_t oj = cr.hi; oj < g.out_w; ++oj) out[oj] = 0.0f;
        }
      }
    }
  }
}

// dx [c, h, w] += one sample's columns (row stride ld) scattered back to where they were read.
void col2im_add(const Conv2dGeometry& g, const float* cols, int64_t ld, float* dx) {
  for (int64_t ci = 0; ci < g.c; ++ci) {
    float* dxc = dx + ci * g.h * g.w;
    for (int64_t ki = 0; ki < g.r; ++ki) {
      for (int64_t kj = 0; kj < g.s; ++kj) {
        const float* row = cols + ((ci * g.r + ki) * g.s + kj) * ld;
        const ColumnRange cr = valid_columns(g, kj);
        for (int64_t oi = 0; oi < g.out_h; ++oi) {
          const int64_t ih = oi * g.stride_h - g.pad_h + ki;
          if (ih < 0 || ih >= g.h) continue;
          const float* in = row + oi * g.out_w;
          float* dxr = dxc + ih * g.w - g.pad_w + kj;
          if (g.stride_w == 1)
            for (int64_t oj = cr.lo; oj < cr.hi; ++oj) dxr[oj] += in[oj];
          else
            for (int64_t oj = cr.lo; oj < cr.hi; ++oj) dxr[oj * g.stride_w] += in[oj];
        }
      }
    }
  }
}

// Samples [0, m) across the kernel threads, `floats` of work each: fn(j) for each. Each sample
// writes only its own part of the outputs, so the bits do not depend on the thread count.
template <typename Fn>
void for_samples(int64_t m, int64_t floats, const Fn& fn) {
  parallel_for(m, grain_for(floats), [&](int64_t first, int64_t last) {
    for (int64_t j = first; j < last; ++j) fn(j);
  });
}

// Columns of samples [n0, n0 + m) side by side (row stride m * oh * ow).
void im2col_chunk(const Conv2dGeometry& g, const float* x, int64_t n0, int64_t m, float* cols) {
  const int64_t ohw = g.col_cols(), chw = g.c * g.h * g.w;
  for_samples(m, g.col_rows() * ohw, [&](int64_t j) { im2col(g, x + (n0 + j) * chw, cols + j * ohw, m * ohw); });
}

// dy_t [k, m * oh * ow] = dy of samples [n0, n0 + m) grouped by channel.
void group_by_channel(const Conv2dGeometry& g, const float* dy, int64_t n0, int64_t m, float* dyt) {
  const int64_t ohw = g.col_cols();
  for_samples(m, g.k * ohw, [&](int64_t j) {
    for (int64_t k = 0; k < g.k; ++k) {
      const float* src = dy + ((n0 + j) * g.k + k) * ohw;
      std::copy(src, src + ohw, dyt + k * m * ohw + j * ohw);
    }
  });
}

}  // namespace

int64_t conv2d_workspace_floats_cpu(const Conv2dGeometry& g) {
  return chunk_of(g) * (g.col_rows() + g.k) * g.col_cols();
}

void conv2d_forward_cpu(const Conv2dGeometry& g, const float* x, const float* weight, const float* bias, float* y,
                        float* workspace) {
  const int64_t crs = g.col_rows(), ohw = g.col_cols(), chunk = chunk_of(g);
  float* cols = workspace;
  float* out = workspace + chunk * crs * ohw;
  for (int64_t n0 = 0; n0 < g.n; n0 += chunk) {
    const int64_t m = std::min(chunk, g.n - n0), ld = m * ohw;
    im2col_chunk(g, x, n0, m, cols);
    gemm_cpu(false, false, g.k, ld, crs, 1.0f, weight, crs, cols, ld, 0.0f, out, ld);
    for_samples(m, g.k * ohw, [&](int64_t j) {
      for (int64_t k = 0; k < g.k; ++k) {
        const float* src = out + k * ld + j * ohw;
        float* dst = y + ((n0 + j) * g.k + k) * ohw;
        const float b = bias != nullptr ? bias[k] : 0.0f;
        for (int64_t p = 0; p < ohw; ++p) dst[p] = src[p] + b;
      }
    });
  }
}

void conv2d_backward_data_cpu(const Conv2dGeometry& g, const float* weight, const float* dy, float beta, float* dx,
                              float* workspace) {
  const int64_t crs = g.col_rows(), ohw = g.col_cols(), chw = g.c * g.h * g.w, chunk = chunk_of(g);
  float* dcols = workspace;
  float* dyt = workspace + chunk * crs * ohw;
  for (int64_t n0 = 0; n0 < g.n; n0 += chunk) {
    const int64_t m = std::min(chunk, g.n - n0), ld = m * ohw;
    group_by_channel(g, dy, n0, m, dyt);
    gemm_cpu(true, false, crs, ld, g.k, 1.0f, weight, crs, dyt, ld, 0.0f, dcols, ld);
    for_samples(m, crs * ohw, [&](int64_t j) {  // each sample's dx: its beta, then its columns added
      float* dxj = dx + (n0 + j) * chw;
      if (beta == 0.0f) std::memset(dxj, 0, static_cast<std::size_t>(chw) * sizeof(float));
      else if (beta != 1.0f)
        for (int64_t i = 0; i < chw; ++i) dxj[i] *= beta;
      col2im_add(g, dcols + j * ohw, ld, dxj);
    });
  }
}

void conv2d_backward_filter_cpu(const Conv2dGeometry& g, const float* x, const float* dy, float beta, float* dweight,
                                float* workspace) {
  const int64_t crs = g.col_rows(), ohw = g.col_cols(), chunk = chunk_of(g);
  float* cols = workspace;
  float* dyt = workspace + chunk * crs * ohw;
  for (int64_t n0 = 0; n0 < g.n; n0 += chunk) {
    const int64_t m = std::min(chunk, g.n - n0), ld = m * ohw;
    im2col_chunk(g, x, n0, m, cols);
    group_by_channel(g, dy, n0, m, dyt);
    // beta: the sink's for the first chunk (0 overwrites a stale buffer), then accumulate.
    gemm_cpu(false, true, g.k, crs, ld, 1.0f, dyt, ld, cols, ld, n0 == 0 ? beta : 1.0f, dweight, crs);
  }
}

void conv2d_backward_bias_cpu(const Conv2dGeometry& g, const float* dy, float beta, float* dbias) {
  const int64_t ohw = g.col_cols();
  // Channels across the kernel threads, each summed as the serial loop does.
  parallel_for(g.k, grain_for(g.n * ohw), [&](int64_t first, int64_t last) {
    for (int64_t k = first; k < last; ++k) {
      double s = 0.0;
      for (int64_t i = 0; i < g.n; ++i) {
        // One plane in 8 float lanes (vectorized), planes summed in double.
        const float* p = dy + (i * g.k + k) * ohw;
        float lanes[8] = {};
        int64_t j = 0;
        for (; j + 8 <= ohw; j += 8)
          for (int l = 0; l < 8; ++l) lanes[l] += p[j + l];
        for (; j < ohw; ++j) s += p[j];
        for (int l = 0; l < 8; ++l) s += lanes[l];
      }
      dbias[k] = beta == 0.0f ? static_cast<float>(s) : static_cast<float>(s) + beta * dbias[k];
    }
  });
}

}  // namespace cumulus::kernels
