// max_pool2d on the CPU: plain loops over each output's window. Padding is skipped (as -inf would
// be: every window holds an input element), a NaN wins its window, ties go to the
// first element in row-major window order. Backward recomputes each window's argmax from x with
// the same rule instead of keeping an index tensor: x is alive anyway (the ReLU before the pool
// saves it), and cuDNN's pooling backward reads it too.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/conv_kernels.h"

namespace cumulus::kernels {

namespace {

// Index into the plane [h, w] of the window maximum of output (oi, oj): the first NaN, else the
// first largest value. The op's checks (padding at most half the kernel) guarantee every window
// covers at least one input element.
inline int64_t window_argmax(const Pool2dGeometry& g, const float* plane, int64_t oi, int64_t oj) {
  const int64_t i0 = oi * g.stride_h - g.pad_h, j0 = oj * g.stride_w - g.pad_w;
  const int64_t i_begin = std::max<int64_t>(i0, 0), i_end = std::min(i0 + g.kernel_h, g.h);
  const int64_t j_begin = std::max<int64_t>(j0, 0), j_end = std::min(j0 + g.kernel_w, g.w);
  int64_t best = i_begin * g.w + j_begin;
  float best_value = plane[best];
  if (best_value != best_value) return best;  // NaN
  for (int64_t i = i_begin; i < i_end; ++i) {
    const float* row = plane + i * g.w;
    for (int64_t j = j_begin; j < j_end; ++j) {
      const float v = row[j];
      if (!(v <= best_value)) {  // larger, or NaN
        best = i * g.w + j;
        best_value = v;
        if (v != v) return best;
      }
    }
  }
  return best;
}

}  // namespace

namespace {

// The common case (kernel 2, stride 2, no padding): each output reads two pairs of neighbours.
bool is_2x2_stride_2(const Pool2dGeometry& g) {
  return g.kernel_h == 2 && g.kernel_w == 2 && g.stride_h == 2 && g.stride_w == 2 && g.pad_h == 0 && g.pad_w == 0;
}

// Index (0..3) of the maximum of a, b, c, d under the same rule as window_argmax.
inline int argmax4(float a, float b, float c, float d) {
  const float v[4] = {a, b, c, d};
  int best = 0;
  float best_value = a;
  if (best_value != best_value) return 0;
  for (int k = 1; k < 4; ++k)
    if (!(v[k] <= best_value)) {
      best = k;
      best_value = v[k];
      if (v[k] != v[k]) return k;
    }
  return best;
}

}  // namespace

void max_pool2d_forward_cpu(const Pool2dGeometry& g, const float* x, float* y) {
  const int64_t planes = g.n * g.c, hw = g.h * g.w, ohw = g.out_h * g.out_w;
  if (is_2x2_stride_2(g)) {
    for (int64_t p = 0; p < planes; ++p)
      for (int64_t oi = 0; oi < g.out_h; ++oi) {
        const float* r0 = x + p * hw + 2 * oi * g.w;
        const float* r1 = r0 + g.w;
        float* out = y + p * ohw + oi * g.out_w;
        for (int64_t oj = 0; oj < g.out_w; ++oj) {
          const float a = r0[2 * oj], b = r0[2 * oj + 1], c = r1[2 * oj], d = r1[2 * oj + 1];
          const float m = std::max(std::max(a, b), std::max(c, d));
          const bool nan = (a != a) | (b != b) | (c != c) | (d != d);
          out[oj] = nan ? a + b + c + d : m;  // the sum is NaN
        }
      }
    return;
  }
  for (int64_t p = 0; p < planes; ++p) {
    const float* plane = x + p * hw;
    float* out = y + p * ohw;
    for (int64_t oi = 0; oi < g.out_h; ++oi)
      for (int64_t oj = 0; oj < g.out_w; ++oj) out[oi * g.out_w + oj] = plane[window_argmax(g, plane, oi, oj)];
  }
}

void max_pool2d_backward_cpu(const Pool2dGeometry& g, const float* x, const float* dy, float beta, float* dx) {
  const int64_t planes = g.n * g.c, hw = g.h * g.w, ohw = g.out_h * g.out_w;
  // The 2x2 windows tile an even-sized plane: with beta 0 each window writes its four elements
  // (the gradient or 0) and nothing needs clearing first.
  const bool tiled = is_2x2_stride_2(g) && g.h % 2 == 0 && g.w % 2 == 0;
  if (beta == 0.0f && !tiled) std::memset(dx, 0, static_cast<std::size_t>(planes * hw) * sizeof(float));
  else if (beta != 0.0f && beta != 1.0f) for (int64_t i = 0; i < planes * hw; ++i) dx[i] *= beta;
  if (is_2x2_stride_2(g)) {
    const bool overwrite = beta == 0.0f && tiled;
    for (int64_t p = 0; p < planes; ++p)
      for (int64_t oi = 0; oi < g.out_h; ++oi) {
        const int64_t row0 = p * hw + 2 * oi * g.w;
        const float* g_out = dy + p * ohw + oi * g.out_w;
        for (int64_t oj = 0; oj < g.out_w; ++oj) {
          const int64_t i0 = row0 + 2 * oj, i1 = i0 + g.w;
          const int k = argmax4(x[i0], x[i0 + 1], x[i1], x[i1 + 1]);
          const float v = g_out[oj];
          if (overwrite) {
            dx[i0] = k == 0 ? v : 0.0f;
            dx[i0 + 1] = k == 1 ? v : 0.0f;
            dx[i1] = k == 2 ? v : 0.0f;
            dx[i1 + 1] = k == 3 ? v : 0.0f;
          } else {
            dx[(k < 2 ? i0 : i1) + (k & 1)] += v;
          }
        }
      }
    return;
  }
  for (int64_t p = 0; p < planes; ++p) {
    const float* plane = x + p * hw;
    const float* g_out = dy + p * ohw;
    float* d = dx + p * hw;
    for (int64_t oi = 0; oi < g.out_h; ++oi)
      for (int64_t oj = 0; oj < g.out_w; ++oj) d[window_argmax(g, plane, oi, oj)] += g_out[oi * g.out_w + oj];
  }
}

}  // namespace cumulus::kernels
