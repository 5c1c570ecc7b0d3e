// The pointwise ops on the CPU: plain loops over kernels/pointwise_rules.h, the activations through
// SLEEF's vector functions where the CPU has AVX2 (kernels/cpu/vec_math.h). Where beta is 0 the
// destination is never read.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/pointwise_kernels.h"
#include "kernels/cpu/vec_math.h"

namespace cumulus::kernels {

namespace {
// Calls fn(o, ia, ib) for the output rows [r0, r1) (a row: the innermost dimension), with the
// offsets of each row's first element into the output, a and b: an odometer over the outer
// dimensions, started from r0 by divisions once.
template <typename Fn>
void for_each_row(const BroadcastGeometry& g, int64_t r0, int64_t r1, Fn fn) {
  const int last = g.ndim - 1;
  int64_t index[BroadcastGeometry::kMaxDims] = {};
  int64_t a0 = 0, b0 = 0;
  for (int64_t r = r0, d = last - 1; d >= 0; --d) {
    index[d] = r % g.dims[d];
    r /= g.dims[d];
    a0 += index[d] * g.strides[1][d];
    b0 += index[d] * g.strides[2][d];
  }
  for (int64_t r = r0; r < r1; ++r) {
    fn(r * g.dims[last], a0, b0);
    for (int d = last - 1; d >= 0; --d) {  // the next row: the odometer's carry
      a0 += g.strides[1][d];
      b0 += g.strides[2][d];
      if (++index[d] < g.dims[d]) break;
      a0 -= index[d] * g.strides[1][d];
      b0 -= index[d] * g.strides[2][d];
      index[d] = 0;
    }
  }
}

// row(o, ia, ib, m) over every output element, m elements from offsets (o, ia, ib), across
// threads (Note [CPU kernel threads]: each element computed by one thread, so the same bits): a
// one-dimensional geometry in chunks of elements, any other in chunks of whole rows.
template <typename Row>
void for_rows(const BroadcastGeometry& g, Row row) {
  const int last = g.ndim - 1;
  const int64_t n = g.dims[last], total = g.numel(0);
  if (total == 0) return;
  if (g.ndim == 1) {
    const int64_t sa = g.strides[1][0], sb = g.strides[2][0];
    return parallel_for(n, kParallelGrain, [&](int64_t b, int64_t e) { row(b, b * sa, b * sb, e - b); });
  }
  parallel_for(total / n, std::max<int64_t>(1, kParallelGrain / n), [&](int64_t r0, int64_t r1) {
    for_each_row(g, r0, r1, [&](int64_t o, int64_t ia, int64_t ib) { row(o, ia, ib, n); });
  });
}

// fn(sa, sb) with a's and b's innermost strides as constants: each is 1, or 0 where that operand
// is broadcast along the innermost dimension (broadcast_geometry merges the dimensions so), so
// that the loops over a row inside fn are plain contiguous loops the compiler vectorizes.
template <typename Fn>
void with_unit_strides(const BroadcastGeometry& g, Fn fn) {
  using Zero = std::integral_constant<int64_t, 0>;
  using One = std::integral_constant<int64_t, 1>;
  const int last = g.ndim - 1;
  const bool a1 = g.strides[1][last] != 0, b1 = g.strides[2][last] != 0;
  if (a1) return b1 ? fn(One(), One()) : fn(One(), Zero());
  return b1 ? fn(Zero(), One()) : fn(Zero(), Zero());
}

// One operand's values along a row at a constant stride: element i (stride 1), or one value for
// the whole row (stride 0), read once before the loop, which would otherwise reload it after every
// store (the output might alias it) and stay scalar.
template <int64_t kStride, typename T>
class RowOperand {
 public:
  RowOperand(const T* base, int64_t offset) : p_(base + offset), v_(kStride == 0 ? to_f32(*p_) : 0.0f) {}
  float operator[](int64_t i) const {
    if constexpr (kStride == 0) return v_;
    else return to_f32(p_[i]);
  }

 private:
  const T* p_;
  float v_;
};

// fn(std::integral_constant<BinaryOp, op>()): a loop inside fn sees the op as a constant, so the
// compiler vectorizes it (with the op's switch inside, it stays scalar).
template <typename Fn>
void with_constant_op(BinaryOp op, Fn fn) {
  using Op = BinaryOp;
  switch (op) {
    case Op::add: return fn(std::integral_constant<Op, Op::add>());
    case Op::sub: return fn(std::integral_constant<Op, Op::sub>());
    case Op::mul: return fn(std::integral_constant<Op, Op::mul>());
    case Op::div: return fn(std::integral_constant<Op, Op::div>());
    case Op::pow: return fn(std::integral_constant<Op, Op::pow>());
    case Op::maximum: return fn(std::integral_constant<Op, Op::maximum>());
    default: return fn(std::integral_constant<Op, Op::minimum>());
  }
}
}  // namespace

// The forward with the op a template argument and the rows' strides constants: every loop is a
// plain one over a row (a same-shape op, a row times one scalar, a row plus a row vector), so the
// compiler vectorizes it and drops the other ops' cases (pow's call among them). In f32, add, sub,
// mul and div take the AVX2 or AVX-512 rows where the CPU has them: the baseline's 4 lanes left a
// 1 MiB bias add 1.3x behind PyTorch's (one IEEE operation an element either way: the same bits).
template <BinaryOp kOp, typename T>
void binary_forward_op(const BroadcastGeometry& g, const T* a, const T* b, T* y) {
  if constexpr (std::is_same_v<T, float> && vec::kBuilt && kOp <= BinaryOp::div) {
    if (vec::available()) {
      const auto rows = vec512::available() ? vec512::binary_f32 : vec::binary_f32;
      const int last = g.ndim - 1;
      const int64_t sa = g.strides[1][last] != 0, sb = g.strides[2][last] != 0;
      return for_rows(g, [&](int64_t o, int64_t ia, int64_t ib, int64_t m) {
        rows(static_cast<int>(kOp), a + ia, sa, b + ib, sb, y + o, m);
      });
    }
  }
  with_unit_strides(g, [&](auto sa, auto sb) {
    for_rows(g, [&](int64_t o, int64_t ia, int64_t ib, int64_t m) {
      const RowOperand<sa, T> ar(a, ia);
      const RowOperand<sb, T> br(b, ib);
      T* yr = y + o;
      for (int64_t i = 0; i < m; ++i) yr[i] = from_f32<T>(binary_apply(kOp, ar[i], br[i]));
    });
  });
}

template <typename T>
void binary_forward_cpu(const BroadcastGeometry& g, BinaryOp op, const T* a, const T* b, T* y) {
  with_constant_op(op, [&](auto k) { binary_forward_op<decltype(k)::value>(g, a, b, y); });
}

namespace {
// The gradient of an operand that is not broadcast (its offsets are the output's): one term per
// element, no sum, so the bits are broadcast_grad_element's; the op, the operand, the strides and
// beta's form fixed outside the row loops, so that they vectorize.
// A null operand (one the op's gradient does not read) reads dy instead, so that the loops need no
// test: every offset into either operand lies within the output, and the values are never used.
template <BinaryOp kOp, int kOperand, typename T>
void elementwise_grad(const BroadcastGeometry& g, const T* a_in, const T* b_in, const T* dy, float beta, T* dx) {
  const T* a = a_in != nullptr ? a_in : dy;
  const T* b = b_in != nullptr ? b_in : dy;
  with_unit_strides(g, [&](auto sa, auto sb) {
    for_rows(g, [&](int64_t o, int64_t ia, int64_t ib, int64_t m) {
      const RowOperand<sa, T> ar(a, ia);
      const RowOperand<sb, T> br(b, ib);
      const T* dyr = dy + o;
      T* dxr = dx + o;
      if (beta == 0.0f) {
        for (int64_t i = 0; i < m; ++i) dxr[i] = from_f32<T>(binary_grad(kOp, kOperand, to_f32(dyr[i]), ar[i], br[i]));
        return;
      }
      for (int64_t i = 0; i < m; ++i)
        dxr[i] = blend_gradient<T>(binary_grad(kOp, kOperand, to_f32(dyr[i]), ar[i], br[i]), beta, dxr[i]);
    });
  });
}

// The gradient sums of the two common broadcasts of an f32 operand in two dimensions, [R, n] with
// [R, 1] (one sum per row) or with [n] (one per column), for add, sub and mul, through
// vec::ordered_row_sums_f32 and ordered_column_sums_f32: each sum adds broadcast_grad_element's
// terms in its order, in double, so the bits are the same. sub's b takes 0 - sum(dy): the sum of
// the negated terms is the negated sum (rounding to nearest is symmetric), except that a sum from
// +0 is never -0 (an exact cancellation or +0 + -0 is +0), which 0 - s keeps. False where it does
// not apply.
template <BinaryOp kOp, typename T>
bool ordered_sums_grad(const BroadcastGeometry& g, int operand, const T* a, const T* b, const T* dy, float beta,
                       T* dx) {
  if constexpr (!std::is_same_v<T, float> || !vec::kBuilt) {
    return false;
  } else {
    if (!(kOp == BinaryOp::add || kOp == BinaryOp::sub || kOp == BinaryOp::mul) || g.ndim != 2 || !vec::available())
      return false;
    const int64_t* own = g.strides[1 + operand];
    const int64_t* other = g.strides[2 - operand];
    const int64_t rows = g.dims[0], cols = g.dims[1];
    if (other[0] != cols || other[1] != 1) return false;  // the other operand is [R, n] too
    const bool per_row = own[0] == 1 && own[1] == 0, per_column = own[0] == 0 && own[1] == 1;
    if (!per_row && !per_column) return false;
    const float* w = kOp == BinaryOp::mul ? (operand == 0 ? b : a) : nullptr;  // mul: dy times the other
    std::vector<float> sums(static_cast<std::size_t>(per_row ? rows : cols));
    if (per_row) {
      parallel_for(rows, grain_for(cols), [&](int64_t r0, int64_t r1) {
        vec::ordered_row_sums_f32(dy + r0 * cols, w != nullptr ? w + r0 * cols : nullptr, r1 - r0, cols,
                                  sums.data() + r0);
      });
    } else {
      constexpr int64_t kColumns = 32;  // ordered_column_sums_f32's block
      const int64_t blocks = (cols + kColumns - 1) / kColumns;
      parallel_for(blocks, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(rows * kColumns, 1)),
                   [&](int64_t c0, int64_t c1) {
                     const int64_t begin = c0 * kColumns, end = std::min(cols, c1 * kColumns);
                     vec::ordered_column_sums_f32(dy + begin, w != nullptr ? w + begin : nullptr, rows, end - begin,
                                                  cols, sums.data() + begin);
                   });
    }
    const bool negate = kOp == BinaryOp::sub && operand == 1;
    for (std::size_t j = 0; j < sums.size(); ++j)
      dx[j] = blend_gradient<T>(negate ? 0.0f - sums[j] : sums[j], beta, dx[j]);
    return true;
  }
}
}  // namespace

// An operand that is not broadcast gets one term per element (elementwise_grad). A broadcast one
// sums per element in the order Note [Broadcast geometry] fixes: the common two-dimensional cases
// vectorized across the sums (ordered_sums_grad), the others below. The op is a template argument,
// as the forward's.
template <BinaryOp op, typename T>
void binary_backward_op(const BroadcastGeometry& g, int operand, const T* a, const T* b, const T* dy, float beta,
                        T* dx) {
  const int64_t n = g.numel(1 + operand);
  if (n == g.numel(0)) {
    if (operand == 0) return elementwise_grad<op, 0>(g, a, b, dy, beta, dx);
    return elementwise_grad<op, 1>(g, a, b, dy, beta, dx);
  }
  if (ordered_sums_grad<op>(g, operand, a, b, dy, beta, dx)) return;
  if (g.strides[1 + operand][g.ndim - 1] == 0) {  // a broadcast innermost dimension: one element at a time
    for (int64_t j = 0; j < n; ++j)
      dx[j] = blend_gradient<T>(broadcast_grad_element(g, op, operand, j, a, b, dy), beta, dx[j]);
    return;
  }
  // The operand keeps the innermost dimension ([B, n] -> [n]): up to kBlock neighbours walk together,
  // so each output row is read in order rather than one element per row; each element's sum still
  // starts at 0 and adds in broadcast_grad_element's order (in double), so the bits are the same.
  constexpr int64_t kBlock = 64;
  const int last = g.ndim - 1;
  const int64_t so = g.strides[0][last], sa = g.strides[1][last], sb = g.strides[2][last];
  for (int64_t j0 = 0; j0 < n;) {
    const int64_t count = std::min({kBlock, g.dims[last] - j0 % g.dims[last], n - j0});
    double acc[kBlock] = {};
    GradWalk w = grad_walk_start(g, operand, j0);
    if (!w.empty) do {
        for (int64_t k = 0; k < count; ++k)
          acc[k] += binary_grad_at(op, operand, a, b, dy, w.base[0] + k * so, w.base[1] + k * sa, w.base[2] + k * sb);
      } while (grad_walk_next(g, w));
    for (int64_t k = 0; k < count; ++k) dx[j0 + k] = blend_gradient<T>(static_cast<float>(acc[k]), beta, dx[j0 + k]);
    j0 += count;
  }
}

template <typename T>
void binary_backward_cpu(const BroadcastGeometry& g, BinaryOp op, int operand, const T* a, const T* b, const T* dy,
                         float beta, T* dx) {
  with_constant_op(op, [&](auto k) { binary_backward_op<decltype(k)::value>(g, operand, a, b, dy, beta, dx); });
}

namespace {
// fn(e) with e() returning s: a constant for pow_scalar's special exponents, so that a loop inside
// fn reduces pow_scalar to its one case and vectorizes (its tests of s inside kept it scalar).
template <typename Fn>
void with_constant_exponent(float s, Fn fn) {
  if (s == 1.0f) return fn([] { return 1.0f; });
  if (s == 2.0f) return fn([] { return 2.0f; });
  if (s == 3.0f) return fn([] { return 3.0f; });
  if (s == -2.0f) return fn([] { return -2.0f; });
  if (s == 0.5f) return fn([] { return 0.5f; });
  if (s == -0.5f) return fn([] { return -0.5f; });
  if (s == -1.0f) return fn([] { return -1.0f; });
  fn([s] { return s; });
}
}  // namespace

template <typename T>
void scalar_forward_cpu(BinaryOp op, bool reversed, float s, const T* x, T* y, int64_t n) {
  if (op == BinaryOp::pow && !reversed) {
    return with_constant_exponent(s, [&](auto e) {
      for (int64_t i = 0; i < n; ++i) y[i] = from_f32<T>(scalar_apply(BinaryOp::pow, false, to_f32(x[i]), e()));
    });
  }
  with_constant_op(op, [&](auto k) {
    for (int64_t i = 0; i < n; ++i) y[i] = from_f32<T>(scalar_apply(k, reversed, to_f32(x[i]), s));
  });
}

template <typename T>
void scalar_backward_cpu(BinaryOp op, bool reversed, float s, const T* x, const T* dy, float beta, T* dx, int64_t n) {
  auto loop = [&](auto k, auto e) {
    for (int64_t i = 0; i < n; ++i) {
      const float xv = x != nullptr ? to_f32(x[i]) : 0.0f;
      dx[i] = blend_gradient<T>(scalar_grad(k, reversed, to_f32(dy[i]), xv, e()), beta, dx[i]);
    }
  };
  if (op == BinaryOp::pow && !reversed) {
    // pow's gradient reads x^(s - 1): s a constant where s - 1 is one of pow_scalar's special exponents.
    const auto pow_loop = [&](auto e) { loop(std::integral_constant<BinaryOp, BinaryOp::pow>(), e); };
    if (s == 2.0f) return pow_loop([] { return 2.0f; });
    if (s == 3.0f) return pow_loop([] { return 3.0f; });
    if (s == 4.0f) return pow_loop([] { return 4.0f; });
    if (s == -1.0f) return pow_loop([] { return -1.0f; });
    if (s == 1.5f) return pow_loop([] { return 1.5f; });
    if (s == 0.5f) return pow_loop([] { return 0.5f; });
    return pow_loop([s] { return s; });
  }
  with_constant_op(op, [&](auto k) { loop(k, [s] { return s; }); });
}

namespace {
// The vector function computing op over n floats (kernels/cpu/vec_math.h), or null for the ops
// without a transcendental (sqrt, rsqrt, abs), whose plain loops the compiler vectorizes.
using VecUnary = void (*)(const float*, float*, int64_t);
VecUnary unary_forward_vec(UnaryOp op) {
  switch (op) {
    case UnaryOp::tanh: return vec::tanh_f32;
    case UnaryOp::sigmoid: return vec512::available() ? vec512::sigmoid_f32 : vec::sigmoid_f32;
    case UnaryOp::silu: return vec512::available() ? vec512::silu_f32 : vec::silu_f32;
    case UnaryOp::gelu: return vec512::available() ? vec512::gelu_f32 : vec::gelu_f32;
    case UnaryOp::gelu_tanh: return vec512::available() ? vec512::gelu_tanh_f32 : vec::gelu_tanh_f32;
    case UnaryOp::exp: return vec::exp_f32;
    case UnaryOp::log: return vec::log_f32;
    default: return nullptr;
  }
}

// y = f(x) by the scalar rule, with the op fixed outside the loop so that the compiler vectorizes it.
template <UnaryOp kOp, typename T>
void unary_forward_loop(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = from_f32<T>(unary_apply(kOp, to_f32(x[i])));
}

// 16-bit types are widened to f32 a block at a time, into buffers that stay in the L1 cache.
constexpr int64_t kVecBlock = 1024;

template <typename T>
const float* widen(const T* x, int64_t n, float* buffer) {
  if constexpr (std::is_same_v<T, float>) return x;
  for (int64_t i = 0; i < n; ++i) buffer[i] = to_f32(x[i]);
  return buffer;
}

// dx = blend_gradient(grad(dy, saved)) with one op's rule and beta's form fixed outside the loop, so that
// the compiler vectorizes it (the op's switch and beta's test inside kept it scalar).
template <UnaryOp kOp, typename T>
void unary_grad_loop(const T* saved, const T* dy, float beta, T* dx, int64_t n) {
  if (beta == 0.0f) {
    for (int64_t i = 0; i < n; ++i) dx[i] = from_f32<T>(unary_grad(kOp, to_f32(dy[i]), to_f32(saved[i])));
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    dx[i] = blend_gradient<T>(unary_grad(kOp, to_f32(dy[i]), to_f32(saved[i])), beta, dx[i]);
}

template <typename T>
void unary_forward_serial(UnaryOp op, const T* x, T* y, int64_t n) {
  if (op == UnaryOp::sqrt) return unary_forward_loop<UnaryOp::sqrt>(x, y, n);
  if (op == UnaryOp::rsqrt) return unary_forward_loop<UnaryOp::rsqrt>(x, y, n);
  if (op == UnaryOp::abs) return unary_forward_loop<UnaryOp::abs>(x, y, n);
  if constexpr (vec::kBuilt) {
    if (vec::available()) {
      const VecUnary f = unary_forward_vec(op);
      if constexpr (std::is_same_v<T, float>) return f(x, y, n);
      float xb[kVecBlock];
      for (int64_t i = 0; i < n; i += kVecBlock) {
        const int64_t m = std::min(kVecBlock, n - i);
        f(widen(x + i, m, xb), xb, m);
        for (int64_t k = 0; k < m; ++k) y[i + k] = from_f32<T>(xb[k]);
      }
      return;
    }
  }
  for (int64_t i = 0; i < n; ++i) y[i] = from_f32<T>(unary_apply(op, to_f32(x[i])));
}

// The gelus' and silu's backward: dy * f'(x) through the vector functions a block at a time, then
// blended into dx. The other ops' need no transcendental: the scalar rules, in loops per op.
template <typename T>
void unary_backward_serial(UnaryOp op, const T* saved, const T* dy, float beta, T* dx, int64_t n) {
  switch (op) {
    case UnaryOp::tanh: return unary_grad_loop<UnaryOp::tanh>(saved, dy, beta, dx, n);
    case UnaryOp::sigmoid: return unary_grad_loop<UnaryOp::sigmoid>(saved, dy, beta, dx, n);
    case UnaryOp::exp: return unary_grad_loop<UnaryOp::exp>(saved, dy, beta, dx, n);
    case UnaryOp::log: return unary_grad_loop<UnaryOp::log>(saved, dy, beta, dx, n);
    case UnaryOp::sqrt: return unary_grad_loop<UnaryOp::sqrt>(saved, dy, beta, dx, n);
    case UnaryOp::rsqrt: return unary_grad_loop<UnaryOp::rsqrt>(saved, dy, beta, dx, n);
    case UnaryOp::abs: return unary_grad_loop<UnaryOp::abs>(saved, dy, beta, dx, n);
    default: break;
  }
  if constexpr (vec::kBuilt) {
    if (vec::available()) {
      const bool wide = vec512::available();
      const auto grad = op == UnaryOp::silu   ? (wide ? vec512::silu_grad_f32 : vec::silu_grad_f32)
                        : op == UnaryOp::gelu ? (wide ? vec512::gelu_grad_f32 : vec::gelu_grad_f32)
                                              : (wide ? vec512::gelu_tanh_grad_f32 : vec::gelu_tanh_grad_f32);
      if constexpr (std::is_same_v<T, float>)
        if (beta == 0.0f) return grad(saved, dy, dx, n);
      float xb[kVecBlock], gb[kVecBlock];
      for (int64_t i = 0; i < n; i += kVecBlock) {
        const int64_t m = std::min(kVecBlock, n - i);
        grad(widen(saved + i, m, xb), widen(dy + i, m, gb), gb, m);
        for (int64_t k = 0; k < m; ++k) dx[i + k] = blend_gradient<T>(gb[k], beta, dx[i + k]);
      }
      return;
    }
  }
  for (int64_t i = 0; i < n; ++i)
    dx[i] = blend_gradient<T>(unary_grad(op, to_f32(dy[i]), to_f32(saved[i])), beta, dx[i]);
}

}  // namespace

// Elementwise, so across threads in chunks (Note [CPU kernel threads]) with the same bits.
template <typename T>
void unary_forward_cpu(UnaryOp op, const T* x, T* y, int64_t n) {
  parallel_for(n, kParallelGrain, [&](int64_t b, int64_t e) { unary_forward_serial(op, x + b, y + b, e - b); });
}

template <typename T>
void unary_backward_cpu(UnaryOp op, const T* saved, const T* dy, float beta, T* dx, int64_t n) {
  parallel_for(n, kParallelGrain,
               [&](int64_t b, int64_t e) { unary_backward_serial(op, saved + b, dy + b, beta, dx + b, e - b); });
}

template <typename T>
void softmax_forward_cpu(bool log, const T* x, T* y, int64_t rows, int64_t cols) {
  if constexpr (vec::kBuilt && std::is_same_v<T, float>) {
    if (vec::available()) {
      const auto row = vec512::available() ? vec512::softmax_row_f32 : vec::softmax_row_f32;
      parallel_for(rows, grain_for(cols), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) row(log, x + r * cols, y + r * cols, cols);
      });
      return;
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    float m = -INFINITY;
    for (int64_t j = 0; j < cols; ++j) m = std::fmax(m, to_f32(xr[j]));
    double s = 0.0;  // in double: a float sum over a wide row (a vocabulary) drifts by about cols ulp
    for (int64_t j = 0; j < cols; ++j) s += std::exp(to_f32(xr[j]) - m);
    if (log) {
      const float log_s = static_cast<float>(std::log(s));
      for (int64_t j = 0; j < cols; ++j) yr[j] = from_f32<T>((to_f32(xr[j]) - m) - log_s);
    } else {
      const float inv = static_cast<float>(1.0 / s);
      for (int64_t j = 0; j < cols; ++j) yr[j] = from_f32<T>(std::exp(to_f32(xr[j]) - m) * inv);
    }
  }
}

template <typename T>
void softmax_backward_cpu(bool log, const T* y, const T* dy, float beta, T* dx, int64_t rows, int64_t cols) {
  if constexpr (vec::kBuilt && std::is_same_v<T, float>) {
    if (vec::available()) {
      const auto row = vec512::available() ? vec512::softmax_grad_row_f32 : vec::softmax_grad_row_f32;
      parallel_for(rows, grain_for(cols), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) row(log, y + r * cols, dy + r * cols, beta, dx + r * cols, cols);
      });
      return;
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const T *yr = y + r * cols, *dyr = dy + r * cols;
    T* dxr = dx + r * cols;
    double sum = 0.0;  // log_softmax: sum(dy); softmax: sum(dy y); in double, as the forward's
    for (int64_t j = 0; j < cols; ++j)
      sum += log ? to_f32(dyr[j]) : static_cast<double>(to_f32(dyr[j])) * to_f32(yr[j]);
    const float s = static_cast<float>(sum);
    for (int64_t j = 0; j < cols; ++j) {
      const float yv = to_f32(yr[j]), g = to_f32(dyr[j]);
      const float v = log ? g - std::exp(yv) * s : yv * (g - s);
      dxr[j] = blend_gradient<T>(v, beta, dxr[j]);
    }
  }
}

template <typename T>
void dropout_forward_cpu(uint64_t seed, const int64_t* offset, float p, float scale, const T* x, T* y, int64_t n) {
  const uint64_t key = dropout_key(seed, static_cast<uint64_t>(*offset));
  for (int64_t i = 0; i < n; ++i) y[i] = from_f32<T>(to_f32(x[i]) * dropout_factor(key, i, p, scale));
}

template <typename T>
void dropout_backward_cpu(uint64_t seed, const int64_t* offset, float p, float scale, const T* dy, float beta, T* dx,
                          int64_t n) {
  const uint64_t key = dropout_key(seed, static_cast<uint64_t>(*offset));
  for (int64_t i = 0; i < n; ++i) {
    const float v = to_f32(dy[i]) * dropout_factor(key, i, p, scale);
    dx[i] = blend_gradient<T>(v, beta, dx[i]);
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
  template void dropout_forward_cpu(uint64_t, const int64_t*, float, float, const T*, T*, int64_t);                    \
  template void dropout_backward_cpu(uint64_t, const int64_t*, float, float, const T*, float, T*, int64_t);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

void dropout_take_offset_cpu(int64_t* counter, int64_t* taken) {
  *taken = *counter;
  *counter += 1;
}

}  // namespace cumulus::kernels
