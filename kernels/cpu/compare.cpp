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

// Calls fn(o, off) for every output element o in row-major order, off[k] its offset into operand k:
// the innermost dimension steps the offsets by their strides, an odometer moves the others.
template <typename Fn>
void for_each_element(const NaryGeometry& g, Fn fn) {
  const int64_t n = g.numel(0);
  const int last = g.ndim - 1, m = g.noperands;
  int64_t base[NaryGeometry::kMaxOperands] = {}, off[NaryGeometry::kMaxOperands] = {};
  int64_t count[NaryGeometry::kMaxDims] = {};
  for (int64_t o = 0; o < n;) {
    for (int64_t c = 0; c < g.dims[last]; ++c, ++o) {
      for (int k = 0; k < m; ++k) off[k] = base[k] + c * g.strides[1 + k][last];
      fn(o, off);
    }
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
  for_each_element(g, [&](int64_t i, const int64_t* o) {
    y[i] = compare_apply(op, compare_value(a[o[0]]), compare_value(b[o[1]]));
  });
}

template <typename T>
void compare_scalar_cpu(CompareOp op, const T* x, CompareScalar s, uint8_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = compare_scalar_apply(op, x[i], s);
}

template <typename E>
void where_forward_cpu(const NaryGeometry& g, const uint8_t* cond, const E* a, const E* b, E fill, E* y) {
  for_each_element(g, [&](int64_t i, const int64_t* o) {
    y[i] = cond[o[0]] != 0 ? (a != nullptr ? a[o[1]] : fill) : (b != nullptr ? b[o[2]] : fill);
  });
}

// An operand read by one output element each takes its term in the output's order (a sum of one
// term: where_grad_element's bits); a broadcast one sums per element as where_grad_element does.
template <typename T>
void where_backward_cpu(const NaryGeometry& g, int operand, const uint8_t* cond, const T* dy, float beta, T* dx) {
  const int64_t n = g.numel(1 + operand);
  if (n == g.numel(0)) {
    const bool selected_when = operand == 1;
    for_each_element(g, [&](int64_t i, const int64_t* o) {
      // 0 + dy as the sum from 0 has it (-0 becomes +0)
      store_blend(dx + o[operand], (cond[o[0]] != 0) == selected_when ? 0.0f + to_f32(dy[i]) : 0.0f, beta);
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

}  // namespace cumulus::kernels
