// The pointwise ops on the CPU: plain loops over kernels/pointwise_rules.h. Where beta is 0 the
// destination is never read.
#include <cmath>

#include "kernels/cpu/pointwise_kernels.h"

namespace cumulus::kernels {

namespace {
inline float blend(float value, float beta, float old) { return beta == 0.0f ? value : value + beta * old; }
}  // namespace

template <typename T>
void binary_forward_cpu(const BroadcastGeometry& g, BinaryOp op, const T* a, const T* b, T* y) {
  const int64_t n = g.numel(0);
  if (g.ndim == 1 && g.strides[1][0] == 1 && g.strides[2][0] == 1) {  // same shapes: no index arithmetic
    for (int64_t i = 0; i < n; ++i) y[i] = from_f32<T>(binary_apply(op, to_f32(a[i]), to_f32(b[i])));
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    int64_t ia, ib;
    broadcast_offsets(g, i, ia, ib);
    y[i] = from_f32<T>(binary_apply(op, to_f32(a[ia]), to_f32(b[ib])));
  }
}

template <typename T>
void binary_backward_cpu(const BroadcastGeometry& g, BinaryOp op, int operand, const T* a, const T* b, const T* dy,
                         float beta, T* dx) {
  const int64_t n = g.numel(1 + operand);
  for (int64_t j = 0; j < n; ++j)
    dx[j] = from_f32<T>(blend(broadcast_grad_element(g, op, operand, j, a, b, dy), beta, to_f32(dx[j])));
}

template <typename T>
void scalar_forward_cpu(BinaryOp op, bool reversed, float s, const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = from_f32<T>(scalar_apply(op, reversed, to_f32(x[i]), s));
}

template <typename T>
void scalar_backward_cpu(BinaryOp op, bool reversed, float s, const T* x, const T* dy, float beta, T* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float xv = x != nullptr ? to_f32(x[i]) : 0.0f;
    dx[i] = from_f32<T>(blend(scalar_grad(op, reversed, to_f32(dy[i]), xv, s), beta, to_f32(dx[i])));
  }
}

template <typename T>
void unary_forward_cpu(UnaryOp op, const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = from_f32<T>(unary_apply(op, to_f32(x[i])));
}

template <typename T>
void unary_backward_cpu(UnaryOp op, const T* saved, const T* dy, float beta, T* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    dx[i] = from_f32<T>(blend(unary_grad(op, to_f32(dy[i]), to_f32(saved[i])), beta, to_f32(dx[i])));
}

template <typename T>
void softmax_forward_cpu(bool log, const T* x, T* y, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    float m = -INFINITY;
    for (int64_t j = 0; j < cols; ++j) m = std::fmax(m, to_f32(xr[j]));
    float s = 0.0f;
    for (int64_t j = 0; j < cols; ++j) s += std::exp(to_f32(xr[j]) - m);
    if (log) {
      const float log_s = std::log(s);
      for (int64_t j = 0; j < cols; ++j) yr[j] = from_f32<T>((to_f32(xr[j]) - m) - log_s);
    } else {
      const float inv = 1.0f / s;
      for (int64_t j = 0; j < cols; ++j) yr[j] = from_f32<T>(std::exp(to_f32(xr[j]) - m) * inv);
    }
  }
}

template <typename T>
void softmax_backward_cpu(bool log, const T* y, const T* dy, float beta, T* dx, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const T *yr = y + r * cols, *dyr = dy + r * cols;
    T* dxr = dx + r * cols;
    float s = 0.0f;  // log_softmax: sum(dy); softmax: sum(dy y)
    for (int64_t j = 0; j < cols; ++j) s += log ? to_f32(dyr[j]) : to_f32(dyr[j]) * to_f32(yr[j]);
    for (int64_t j = 0; j < cols; ++j) {
      const float yv = to_f32(yr[j]), g = to_f32(dyr[j]);
      const float v = log ? g - std::exp(yv) * s : yv * (g - s);
      dxr[j] = from_f32<T>(blend(v, beta, to_f32(dxr[j])));
    }
  }
}

template <typename T>
void dropout_forward_cpu(uint64_t seed, uint64_t offset, float p, float scale, const T* x, T* y, int64_t n) {
  const uint64_t key = dropout_key(seed, offset);
  for (int64_t i = 0; i < n; ++i) y[i] = from_f32<T>(dropout_keep(key, i, p) ? to_f32(x[i]) * scale : 0.0f);
}

template <typename T>
void dropout_backward_cpu(uint64_t seed, uint64_t offset, float p, float scale, const T* dy, float beta, T* dx,
                          int64_t n) {
  const uint64_t key = dropout_key(seed, offset);
  for (int64_t i = 0; i < n; ++i) {
    const float v = dropout_keep(key, i, p) ? to_f32(dy[i]) * scale : 0.0f;
    dx[i] = from_f32<T>(blend(v, beta, to_f32(dx[i])));
  }
}

#define CUMULUS_INSTANTIATE(T)                                                                                         \
  template void binary_forward_cpu(const BroadcastGeometry&, BinaryOp, const T*, const T*, T*);                        \
  template void binary_backward_cpu(const BroadcastGeometry&, BinaryOp, int, const T*, const T*, const T*, float, T*); \
  template void scalar_forward_cpu(BinaryOp, bool, float, const T*, T*, int64_t);                                      \
  template void scalar_backward_cpu(BinaryOp, bool, float, const T*, const T*, float, T*, int64_t);                    \
  template void unary_forward_cpu(UnaryOp, const T*, T*, int64_t);                                                     \
  template void unary_backward_cpu(UnaryOp, const T*, const T*, float, T*, int64_t);                                   \
  template void softmax_forward_cpu(bool, const T*, T*, int64_t, int64_t);                                             \
  template void softmax_backward_cpu(bool, const T*, const T*, float, T*, int64_t, int64_t);                           \
  template void dropout_forward_cpu(uint64_t, uint64_t, float, float, const T*, T*, int64_t);                          \
  template void dropout_backward_cpu(uint64_t, uint64_t, float, float, const T*, float, T*, int64_t);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
