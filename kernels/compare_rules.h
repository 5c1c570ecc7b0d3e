// The rules of the comparison and mask ops (engine/ops/compare.cpp), shared by the CPU loops
// (kernels/cpu/compare.cpp) and the CUDA kernels (kernels/cuda/compare.cu) through
// CUMULUS_HOST_DEVICE: comparisons and logical ops, the broadcasting of up to three operands (where),
// the triangle of tril / triu and arange's values. One definition, so both devices give the same
// bits: every rule here is exact (a comparison, a selection, a copy) except arange's float values
// and where's broadcast gradient sums, which add in the same order on both.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/float16.h"
#include "kernels/host_device.h"

namespace cumulus::kernels {

// The floating storage types (computed in f32); the others are integers and bool.
template <typename T>
constexpr bool kFloatStorage =
    std::is_same<T, float>::value || std::is_same<T, BFloat16>::value || std::is_same<T, Half>::value;

// ---- comparisons and logical ops: a bool (0 or 1) per element ----
enum class CompareOp : uint8_t { eq, ne, lt, le, gt, ge, logical_and, logical_or, logical_xor };

// a op b. Floating values compare in f32 as IEEE 754 does (a NaN is unequal to everything, itself
// included, and neither less nor greater: only ne is true); the logical ops take any nonzero value,
// NaN included, as true (as PyTorch).
template <typename V>
CUMULUS_HOST_DEVICE bool compare_apply(CompareOp op, V a, V b) {
  switch (op) {
    case CompareOp::eq: return a == b;
    case CompareOp::ne: return a != b;
    case CompareOp::lt: return a < b;
    case CompareOp::le: return a <= b;
    case CompareOp::gt: return a > b;
    case CompareOp::ge: return a >= b;
    case CompareOp::logical_and: return a != V(0) && b != V(0);
    case CompareOp::logical_or: return a != V(0) || b != V(0);
    default: return (a != V(0)) != (b != V(0));
  }
}

// The value a stored element compares as: floating types in f32 (exact), integers and bool in int64.
CUMULUS_HOST_DEVICE float compare_value(float x) { return x; }
CUMULUS_HOST_DEVICE float compare_value(BFloat16 x) { return to_f32(x); }
CUMULUS_HOST_DEVICE float compare_value(Half x) { return to_f32(x); }
CUMULUS_HOST_DEVICE int64_t compare_value(int32_t x) { return x; }
CUMULUS_HOST_DEVICE int64_t compare_value(int64_t x) { return x; }
CUMULUS_HOST_DEVICE int64_t compare_value(uint8_t x) { return x; }

// The scalar of a tensor-scalar comparison, prepared on the host for the tensor's dtype (as
// PyTorch, whose scalar takes the tensor's type): a floating tensor compares with `f`, the scalar
// rounded to its type; an integer tensor with `i` when the scalar is an integer in int64's range,
// else in double with `d` (PyTorch would promote both to f32; double is exact for |x| <= 2^53).
struct CompareScalar {
  float f = 0;
  int64_t i = 0;
  double d = 0;
  bool integral = false;
};

template <typename T>
CUMULUS_HOST_DEVICE bool compare_scalar_apply(CompareOp op, T x, const CompareScalar& s) {
  const auto v = compare_value(x);
  if constexpr (kFloatStorage<T>) {
    return compare_apply(op, v, s.f);
  } else {
    return s.integral ? compare_apply(op, v, s.i) : compare_apply(op, static_cast<double>(v), s.d);
  }
}

// ---- broadcasting over up to three operands ----
// Note [Nary geometry]
// The output and up to three operands (a comparison's a and b; where's cond, a and b) in up to 8
// dimensions after the output's dimensions of size 1 are dropped and adjacent ones merged where every
// operand has both or broadcasts along both (so same shapes are one dimension, a [T, T] mask over
// [B, H, T, T] scores two). strides[0] are the output's (contiguous), strides[1 + k] operand k's,
// 0 along a dimension it broadcasts over. The gradient of a broadcast operand (where's a and b)
// sums, for each of its elements, the output elements that read it, visiting the dimensions it
// broadcasts over in row-major order from 0, in double: both devices add in the same order.
struct NaryGeometry {
  static constexpr int kMaxDims = 8;
  static constexpr int kMaxOperands = 3;
  int ndim = 1;
  int noperands = 0;
  int64_t dims[kMaxDims] = {1, 1, 1, 1, 1, 1, 1, 1};
  int64_t strides[1 + kMaxOperands][kMaxDims] = {};
  // which: 0 the output, 1 + k operand k.
  int64_t numel(int which) const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= (which == 0 || strides[which][d] != 0) ? dims[d] : 1;
    return n;
  }
  // Every operand has the output's shape: element i of each is element i of the output.
  bool dense() const {
    for (int k = 1; k <= noperands; ++k)
      if (ndim != 1 || strides[k][0] != 1) return false;
    return true;
  }
};

// The geometry of `n` operands of shapes shapes[k] (ndims[k] dimensions, at most kMaxDims) that
// broadcast under numpy's rules to `out` (out_ndim dimensions; the caller checks).
inline NaryGeometry nary_geometry(const int64_t* out, int out_ndim, int n, const int64_t* const* shapes,
                                  const int* ndims) {
  NaryGeometry g;
  g.noperands = n;
  g.ndim = 0;
  for (int d = 0; d < out_ndim; ++d) {
    if (out[d] == 1) continue;
    bool has[NaryGeometry::kMaxOperands] = {};
    for (int k = 0; k < n; ++k) {
      const int kd = d - (out_ndim - ndims[k]);
      has[k] = kd >= 0 && shapes[k][kd] != 1;
    }
    bool same = g.ndim > 0;
    for (int k = 0; k < n && same; ++k) same = has[k] == (g.strides[1 + k][g.ndim - 1] != 0);
    if (same) {
      g.dims[g.ndim - 1] *= out[d];
      continue;
    }
    g.dims[g.ndim] = out[d];
    for (int k = 0; k < n; ++k) g.strides[1 + k][g.ndim] = has[k] ? 1 : 0;  // markers; strides below
    ++g.ndim;
  }
  if (g.ndim == 0) {  // one element
    g.ndim = 1;
    for (int k = 0; k < n; ++k) g.strides[1 + k][0] = 1;
  }
  int64_t running[1 + NaryGeometry::kMaxOperands] = {1, 1, 1, 1};
  for (int d = g.ndim - 1; d >= 0; --d) {
    g.strides[0][d] = running[0];
    running[0] *= g.dims[d];
    for (int k = 1; k <= n; ++k) {
      if (g.strides[k][d] == 0) continue;
      g.strides[k][d] = running[k];
      running[k] *= g.dims[d];
    }
  }
  return g;
}

// The offsets into every operand of output element i.
// Every operand slot is computed (an absent operand's strides are 0): a loop of constant length
// unrolls, so a kernel's offsets stay in registers instead of a stack frame.
CUMULUS_HOST_DEVICE void nary_offsets(const NaryGeometry& g, int64_t i, int64_t* offsets) {
  for (int k = 0; k < NaryGeometry::kMaxOperands; ++k) offsets[k] = 0;
  for (int d = g.ndim - 1; d >= 0; --d) {
    const int64_t c = d > 0 ? i % g.dims[d] : i;
    i /= g.dims[d];
    for (int k = 0; k < NaryGeometry::kMaxOperands; ++k) offsets[k] += c * g.strides[1 + k][d];
  }
}

// ---- where(cond, a, b) ----
// Element bits E (uint8_t to uint64_t: where copies, whatever the dtype). A null a or b reads `fill`
// instead (where with a scalar, masked_fill).
template <typename E>
CUMULUS_HOST_DEVICE E where_element(const NaryGeometry& g, int64_t i, const uint8_t* cond, const E* a, const E* b,
                                    E fill) {
  int64_t o[NaryGeometry::kMaxOperands];
  nary_offsets(g, i, o);
  if (cond[o[0]] != 0) return a != nullptr ? a[o[1]] : fill;
  return b != nullptr ? b[o[2]] : fill;
}

// The gradient of element j of where's a (operand 1) or b (operand 2): the sum of dy over the output
// elements that read it and select it (Note [Nary geometry]).
template <typename T>
CUMULUS_HOST_DEVICE float where_grad_element(const NaryGeometry& g, int operand, int64_t j, const uint8_t* cond,
                                             const T* dy) {
  const int64_t* own = g.strides[1 + operand];
  int64_t base_out = 0, base_cond = 0, readers = 1;  // readers: output elements that read element j
  for (int d = g.ndim - 1; d >= 0; --d) {
    if (own[d] == 0) {
      readers *= g.dims[d];  // an empty output: no readers, a zero gradient
      continue;
    }
    const int64_t c = j % g.dims[d];
    j /= g.dims[d];
    base_out += c * g.strides[0][d];
    base_cond += c * g.strides[1][d];
  }
  const bool selects_a = operand == 1;
  double sum = 0.0;
  // Reader k's position over the broadcast dimensions, the innermost fastest: a fixed order (the
  // same bits on both devices), and no per-dimension counters (no stack frame on the GPU).
  for (int64_t k = 0; k < readers; ++k) {
    int64_t rest = k, at_out = base_out, at_cond = base_cond;
    for (int d = g.ndim - 1; d >= 0 && rest > 0; --d) {
      if (own[d] != 0) continue;
      const int64_t c = rest % g.dims[d];
      rest /= g.dims[d];
      at_out += c * g.strides[0][d];
      at_cond += c * g.strides[1][d];
    }
    if ((cond[at_cond] != 0) == selects_a) sum += to_f32(dy[at_out]);
  }
  return static_cast<float>(sum);
}

// ---- tril / triu over the last two dimensions ----
struct Triangle {
  int64_t batch = 1, rows = 0, cols = 0;
  int64_t diagonal = 0;
  bool upper = false;  // triu
};

// Whether element (r, c) of a matrix is kept: tril keeps c - r <= diagonal, triu c - r >= diagonal.
CUMULUS_HOST_DEVICE bool triangle_keeps(const Triangle& t, int64_t r, int64_t c) {
  return t.upper ? c - r >= t.diagonal : c - r <= t.diagonal;
}
// The same for element i of the whole tensor (rows * cols > 0).
CUMULUS_HOST_DEVICE bool triangle_keeps(const Triangle& t, int64_t i) {
  return triangle_keeps(t, (i / t.cols) % t.rows, i % t.cols);
}

// ---- arange ----
// Value i of arange: start + i * step, in double for the floating types (rounded once to f32, then
// to 16 bits), in int64 for the integer ones (exact).
struct Arange {
  double start = 0, step = 1;
  int64_t istart = 0, istep = 1;
};

// i * step rounded by itself: never fused with the add into an FMA (nvcc contracts by default, a
// host compiler may), so that both devices round the same way.
CUMULUS_HOST_DEVICE double arange_product(double i, double step) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(i, step);
#else
  volatile double p = i * step;
  return p;
#endif
}

template <typename T>
CUMULUS_HOST_DEVICE T arange_value(const Arange& a, int64_t i) {
  if constexpr (kFloatStorage<T>) {
    return from_f32<T>(static_cast<float>(a.start + arange_product(static_cast<double>(i), a.step)));
  } else {
    return static_cast<T>(a.istart + i * a.istep);
  }
}

// The value of `true` or `false` in T (bool to a numeric type: 1 or 0).
template <typename T>
CUMULUS_HOST_DEVICE T bool_value(uint8_t b) {
  if constexpr (kFloatStorage<T>) {
    return from_f32<T>(b != 0 ? 1.0f : 0.0f);
  } else {
    return static_cast<T>(b != 0 ? 1 : 0);
  }
}

}  // namespace cumulus::kernels
