// kernels/cpu/math_kernels.h: plain loops over kernels/math_rules.h.
#include "kernels/cpu/math_kernels.h"

namespace cumulus::kernels {

template <typename T>
void clamp_forward_cpu(float lo, float hi, const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = from_f32<T>(clamp_apply(to_f32(x[i]), lo, hi));
}

template <typename T>
void clamp_backward_cpu(float lo, float hi, const T* x, const T* dy, float beta, T* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = clamp_grad(to_f32(dy[i]), to_f32(x[i]), lo, hi);
    dx[i] = from_f32<T>(beta == 0.0f ? g : g + beta * to_f32(dx[i]));
  }
}

// Same shapes: one flat loop; otherwise each element's offsets from its index (integer tensors are
// indices and counts, rarely large enough for the divisions to matter).
template <typename I>
void int_binary_forward_cpu(const BroadcastGeometry& g, BinaryOp op, const I* a, const I* b, I* y) {
  const int64_t n = g.numel(0);
  if (g.ndim == 1 && g.strides[1][0] == 1 && g.strides[2][0] == 1) {
    for (int64_t i = 0; i < n; ++i) y[i] = int_binary_apply(op, a[i], b[i]);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    int64_t ia, ib;
    broadcast_offsets(g, i, ia, ib);
    y[i] = int_binary_apply(op, a[ia], b[ib]);
  }
}

template <typename From, typename To>
void int_convert_cpu(const From* x, To* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = int_convert<To>(x[i]);
}

#define CUMULUS_INSTANTIATE(T)                                          \
  template void clamp_forward_cpu(float, float, const T*, T*, int64_t); \
  template void clamp_backward_cpu(float, float, const T*, const T*, float, T*, int64_t);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

template void int_binary_forward_cpu(const BroadcastGeometry&, BinaryOp, const int32_t*, const int32_t*, int32_t*);
template void int_binary_forward_cpu(const BroadcastGeometry&, BinaryOp, const int64_t*, const int64_t*, int64_t*);

#define CUMULUS_INSTANTIATE(From)                                 \
  template void int_convert_cpu(const From*, int64_t*, int64_t);  \
  template void int_convert_cpu(const From*, float*, int64_t);    \
  template void int_convert_cpu(const From*, BFloat16*, int64_t); \
  template void int_convert_cpu(const From*, Half*, int64_t);
CUMULUS_INSTANTIATE(int32_t)
CUMULUS_INSTANTIATE(int64_t)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
