// The comparison and mask ops on the CPU: plain loops over kernels/compare_rules.h. Broadcast
// operands are walked with an odometer rather than an offset computed (with divisions) per element;
// the sums of a broadcast gradient are where_grad_element's, so the bits are the CUDA kernel's.
#include "kernels/cpu/compare_kernels.h"

namespace cumulus::kernels {

namespace {
template <typename T>
void store_blend(T* dst, float value, float beta) {
  *dst = from_f32<T>(beta == 0.0f ? value : value + beta * to_f32(*dst));
}

// Calls fn(o, o0, o1, o2) for every output element o in row-major order with its offsets into the
// operands (0 for an operand the geometry does not have): the innermost dimension steps the offsets
// by their strides (held in locals, so the loop keeps them in registers), an odometer moves the others.
template <typename Fn>
void for_each_element(const NaryGeometry& g, Fn fn) {
  static_assert(NaryGeometry::kMaxOperands == 3, "three offsets");
  const int64_t n = g.numel(0);
  const int last = g.ndim - 1, m = g.noperands;
  const int64_t inner = g.dims[last];
  const int64_t s0 = g.strides[1][last], s1 = g.strides[2][last], s2 = g.strides[3][last];
  int64_t base[NaryGeometry::kMaxOperands] = {};
  int64_t count[NaryGeometry::kMaxDims] = {};
  for (int64_t o = 0; o < n; o += inner) {
    const int64_t b0 = base[0], b1 = base[1], b2 = base[2];
    for (int64_t c = 0; c < inner; ++c) fn(o + c, b0 + c * s0, b1 + c * s1, b2 + c * s2);
    for (int d = last - 1; d >= 0; --d) {
      for (int k = 0; k < m; ++k) base[k] += g.strides[1 + k][d];
      if (++count[d] < g.dims[d]) break;
      for (int k = 0; k < m; ++k) base[k] -= count[d] * g.strides[1 + k][d];
      count[d] = 0;
    }
  }
}
}  // namespace

template <typename T>
void compare_forward_cpu(const NaryGeometry& g, CompareOp op, const T* a, const T* b, uint8_t* y) {
  const int64_t n = g.numel(0);
  if (g.dense()) {
    for (int64_t i = 0; i < n; ++i) y[i] = compare_apply(op, compare_value(a[i]), compare_value(b[i]));
    return;
  }
  for_each_element(g, [&](int64_t i, int64_t ia, int64_t ib, int64_t) {
    y[i] = compare_apply(op, compare_value(a[ia]), compare_value(b[ib]));
  });
}

template <typename T>
void compare_scalar_cpu(CompareOp op, const T* x, CompareScalar s, uint8_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = compare_scalar_apply(op, x[i], s);
}

// A scalar operand reads `fill` through a pointer like a tensor's, at offset 0 (its strides zeroed);
// both values are loaded and selected without a branch (a mask's bits are unpredictable).
template <typename E>
void where_forward_cpu(const NaryGeometry& g, const uint8_t* cond, const E* a, const E* b, E fill, E* y) {
  NaryGeometry h = g;
  for (int k = 0; k < 2; ++k)
    if ((k == 0 ? a : b) == nullptr)
      for (int d = 0; d < h.ndim; ++d) h.strides[2 + k][d] = 0;
  const E* ap = a != nullptr ? a : &fill;
  const E* bp = b != nullptr ? b : &fill;
  if (h.dense()) {
    for (int64_t i = 0; i < h.numel(0); ++i) y[i] = cond[i] != 0 ? ap[i] : bp[i];
    return;
  }
  for_each_element(h, [&](int64_t i, int64_t ic, int64_t ia, int64_t ib) {
    const E va = ap[ia], vb = bp[ib];
    y[i] = cond[ic] != 0 ? va : vb;
  });
}

// An operand read by one output element each takes its term in the output's order (a sum of one
// term: where_grad_element's bits); a broadcast one sums per element as where_grad_element does.
template <typename T>
void where_backward_cpu(const NaryGeometry& g, int operand, const uint8_t* cond, const T* dy, float beta, T* dx) {
  const int64_t n = g.numel(1 + operand);
  if (n == g.numel(0)) {
    const bool selected_when = operand == 1;
    for_each_element(g, [&](int64_t i, int64_t ic, int64_t ia, int64_t ib) {
      // 0 + dy as the sum from 0 has it (-0 becomes +0)
      const float v = 0.0f + to_f32(dy[i]);
      store_blend(dx + (operand == 1 ? ia : ib), (cond[ic] != 0) == selected_when ? v : 0.0f, beta);
    });
    return;
  }
  for (int64_t j = 0; j < n; ++j) store_blend(dx + j, where_grad_element(g, operand, j, cond, dy), beta);
}

template <typename E>
void triangle_forward_cpu(const Triangle& t, const E* x, E* y) {
  for (int64_t m = 0, i = 0; m < t.batch; ++m)
    for (int64_t r = 0; r < t.rows; ++r)
      for (int64_t c = 0; c < t.cols; ++c, ++i) y[i] = triangle_keeps(t, r, c) ? x[i] : E(0);
}

template <typename T>
void triangle_backward_cpu(const Triangle& t, const T* dy, float beta, T* dx) {
  for (int64_t m = 0, i = 0; m < t.batch; ++m)
    for (int64_t r = 0; r < t.rows; ++r)
      for (int64_t c = 0; c < t.cols; ++c, ++i)
        store_blend(dx + i, triangle_keeps(t, r, c) ? to_f32(dy[i]) : 0.0f, beta);
}

template <typename T>
void arange_cpu(const Arange& a, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = arange_value<T>(a, i);
}

template <typename T>
void bool_to_cpu(const uint8_t* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bool_value<T>(x[i]);
}

#define CUMULUS_COMPARE_TYPES(X) X(float) X(BFloat16) X(Half) X(int32_t) X(int64_t) X(uint8_t)
#define CUMULUS_FLOAT_TYPES(X) X(float) X(BFloat16) X(Half)
#define CUMULUS_BITS_TYPES(X) X(uint8_t) X(uint16_t) X(uint32_t) X(uint64_t)
#define INSTANTIATE_ANY(T)                                                                            \
  template void compare_forward_cpu<T>(const NaryGeometry&, CompareOp, const T*, const T*, uint8_t*); \
  template void compare_scalar_cpu<T>(CompareOp, const T*, CompareScalar, uint8_t*, int64_t);         \
  template void bool_to_cpu<T>(const uint8_t*, T*, int64_t);
#define INSTANTIATE_FLOAT(T)                                                                          \
  template void where_backward_cpu<T>(const NaryGeometry&, int, const uint8_t*, const T*, float, T*); \
  template void triangle_backward_cpu<T>(const Triangle&, const T*, float, T*);
#define INSTANTIATE_BITS(T)                                                                           \
  template void where_forward_cpu<T>(const NaryGeometry&, const uint8_t*, const T*, const T*, T, T*); \
  template void triangle_forward_cpu<T>(const Triangle&, const T*, T*);
#define INSTANTIATE_ARANGE(T) template void arange_cpu<T>(const Arange&, T*, int64_t);
CUMULUS_COMPARE_TYPES(INSTANTIATE_ANY)
CUMULUS_FLOAT_TYPES(INSTANTIATE_FLOAT)
CUMULUS_BITS_TYPES(INSTANTIATE_BITS)
CUMULUS_FLOAT_TYPES(INSTANTIATE_ARANGE)
INSTANTIATE_ARANGE(int32_t)
INSTANTIATE_ARANGE(int64_t)
INSTANTIATE_ARANGE(uint8_t)  // refused by ops::arange, but its dispatch names it: an -O0 build links it

}  // namespace cumulus::kernels
