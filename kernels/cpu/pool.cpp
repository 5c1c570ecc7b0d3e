// max_pool2d on the CPU: loops over each output's window, planes across the kernel threads (a
// plane's windows in order, so the same bits at any thread count); 2x2 windows of stride 2 in f32
// 8 at a time on the vector paths (kernels/cpu/pool_rows.h). Padding is skipped (as -inf would
// be: every window holds an input element), the last NaN wins its window, else the first largest
// element in row-major window order (pool_window_argmax in kernels/pool_rules.h, shared with CUDA). Backward
// recomputes each window's argmax from x with the same rule instead of keeping an index tensor: x is
// alive anyway (the ReLU before the pool saves it), and cuDNN's pooling backward reads it too. x, y,
// dy, dx are stored as T (float, BFloat16, Half): a maximum is one of its inputs, so a 16-bit forward
// rounds nothing; backward adds in f32.
#include <algorithm>
#include <cstring>
#include <functional>
#include <type_traits>

#include "kernels/cpu/conv_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/pool_rows.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/pool_rules.h"

namespace cumulus::kernels {

namespace {

// The common case (kernel 2, stride 2, no padding): each output reads two pairs of neighbours.
bool is_2x2_stride_2(const Pool2dGeometry& g) {
  return g.kernel_h == 2 && g.kernel_w == 2 && g.stride_h == 2 && g.stride_w == 2 && g.pad_h == 0 && g.pad_w == 0;
}

// Index (0..3) of the maximum of a, b, c, d under the same rule as pool_window_argmax.
inline int argmax4(float a, float b, float c, float d) {
  const float v[4] = {a, b, c, d};
  int best = 0;
  for (int k = 1; k < 4; ++k)
    if (v[k] > v[best] || v[k] != v[k]) best = k;
  return best;
}

// Planes [0, planes) of hw elements each across the kernel threads: fn(first, last).
void for_planes(int64_t planes, int64_t hw, const std::function<void(int64_t, int64_t)>& fn) {
  parallel_for(planes, grain_for(hw), fn);
}

// Whether the 2x2 rows of pool_rows.h run for T.
template <typename T>
bool vector_rows() {
  if constexpr (vec::kBuilt && std::is_same_v<T, float>) return vec::available();
  return false;
}

}  // namespace

template <typename T>
void max_pool2d_forward_cpu(const Pool2dGeometry& g, const T* x, T* y) {
  const int64_t planes = g.n * g.c, hw = g.h * g.w, ohw = g.out_h * g.out_w;
  if (is_2x2_stride_2(g)) {
    const bool vector = vector_rows<T>();
    for_planes(planes, hw, [&](int64_t first, int64_t last) {
      for (int64_t p = first; p < last; ++p)
        for (int64_t oi = 0; oi < g.out_h; ++oi) {
          const T* r0 = x + p * hw + 2 * oi * g.w;
          const T* r1 = r0 + g.w;
          T* out = y + p * ohw + oi * g.out_w;
          if constexpr (vec::kBuilt && std::is_same_v<T, float>) {
            if (vector) {
              vec::max_pool_2x2_row_f32(r0, r1, g.out_w, out);
              continue;
            }
          }
          for (int64_t oj = 0; oj < g.out_w; ++oj) {
            const float a = to_f32(r0[2 * oj]), b = to_f32(r0[2 * oj + 1]), c = to_f32(r1[2 * oj]),
                        d = to_f32(r1[2 * oj + 1]);
            const float window[4] = {a, b, c, d};
            out[oj] = from_f32<T>(window[argmax4(a, b, c, d)]);
          }
        }
    });
    return;
  }
  for_planes(planes, hw, [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      const T* plane = x + p * hw;
      T* out = y + p * ohw;
      for (int64_t oi = 0; oi < g.out_h; ++oi)
        for (int64_t oj = 0; oj < g.out_w; ++oj) out[oi * g.out_w + oj] = plane[pool_window_argmax(g, plane, oi, oj)];
    }
  });
}

template <typename T>
void max_pool2d_backward_cpu(const Pool2dGeometry& g, const T* x, const T* dy, float beta, T* dx) {
  const int64_t planes = g.n * g.c, hw = g.h * g.w, ohw = g.out_h * g.out_w;
  // The 2x2 windows tile an even-sized plane: with beta 0 each window writes its four elements
  // (the gradient or 0) and nothing needs clearing first.
  const bool tiled = is_2x2_stride_2(g) && g.h % 2 == 0 && g.w % 2 == 0;
  // All-zero bits are +0 in each T.
  if (beta == 0.0f && !tiled) std::memset(static_cast<void*>(dx), 0, static_cast<std::size_t>(planes * hw) * sizeof(T));
  else if (beta != 0.0f && beta != 1.0f)
    for (int64_t i = 0; i < planes * hw; ++i) dx[i] = from_f32<T>(to_f32(dx[i]) * beta);
  const T zero = from_f32<T>(0.0f);
  if (is_2x2_stride_2(g)) {
    const bool overwrite = beta == 0.0f && tiled;
    const bool vector = overwrite && vector_rows<T>();
    for_planes(planes, hw, [&](int64_t first, int64_t last) {
      for (int64_t p = first; p < last; ++p)
        for (int64_t oi = 0; oi < g.out_h; ++oi) {
          const int64_t row0 = p * hw + 2 * oi * g.w;
          const T* g_out = dy + p * ohw + oi * g.out_w;
          if constexpr (vec::kBuilt && std::is_same_v<T, float>) {
            if (vector) {
              vec::max_pool_2x2_row_grad_f32(x + row0, x + row0 + g.w, g_out, g.out_w, dx + row0, dx + row0 + g.w);
              continue;
            }
          }
          for (int64_t oj = 0; oj < g.out_w; ++oj) {
            const int64_t i0 = row0 + 2 * oj, i1 = i0 + g.w;
            const int k = argmax4(to_f32(x[i0]), to_f32(x[i0 + 1]), to_f32(x[i1]), to_f32(x[i1 + 1]));
            const T v = g_out[oj];
            if (overwrite) {
              dx[i0] = k == 0 ? v : zero;
              dx[i0 + 1] = k == 1 ? v : zero;
              dx[i1] = k == 2 ? v : zero;
              dx[i1 + 1] = k == 3 ? v : zero;
            } else {
              T& d = dx[(k < 2 ? i0 : i1) + (k & 1)];
              d = from_f32<T>(to_f32(d) + to_f32(v));
            }
          }
        }
    });
    return;
  }
  for_planes(planes, hw, [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      const T* plane = x + p * hw;
      const T* g_out = dy + p * ohw;
      T* d = dx + p * hw;
      for (int64_t oi = 0; oi < g.out_h; ++oi)
        for (int64_t oj = 0; oj < g.out_w; ++oj) {
          T& target = d[pool_window_argmax(g, plane, oi, oj)];
          target = from_f32<T>(to_f32(target) + to_f32(g_out[oi * g.out_w + oj]));
        }
    }
  });
}

#define CUMULUS_INSTANTIATE(T)                                               \
  template void max_pool2d_forward_cpu(const Pool2dGeometry&, const T*, T*); \
  template void max_pool2d_backward_cpu(const Pool2dGeometry&, const T*, const T*, float, T*);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
