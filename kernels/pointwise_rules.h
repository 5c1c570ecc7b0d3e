// The pointwise ops' arithmetic, shared by the CPU loops (kernels/cpu/pointwise.cpp) and the CUDA
// kernels (kernels/cuda/pointwise.cu) through CUMULUS_HOST_DEVICE: the element rules of add, sub,
// mul, div, pow, maximum and minimum, their broadcasting, the unary ops (activations and exp, log,
// sqrt, rsqrt, abs), and dropout's counter-based mask. One
// definition, so both devices compute every element (and every gradient sum) in the same order.
#pragma once

#include <math.h>

#include <cstdint>

#include "kernels/float16.h"
#include "kernels/host_device.h"

namespace cumulus::kernels {

enum class BinaryOp : uint8_t { add, sub, mul, div, pow, maximum, minimum };

// a op b in f32. maximum and minimum return a NaN when either operand is one (as torch.maximum).
CUMULUS_HOST_DEVICE float binary_apply(BinaryOp op, float a, float b) {
  switch (op) {
    case BinaryOp::add: return a + b;
    case BinaryOp::sub: return a - b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
    case BinaryOp::pow: return powf(a, b);
    case BinaryOp::maximum: return (a > b || a != a) ? a : b;
    default: return (a < b || a != a) ? a : b;
  }
}

// PyTorch's gradients of pow: a's is 0 where b is 0 (even at a = 0), b's is 0 where a is 0 and b >= 0
// (a^b log a is 0 * -inf there).
CUMULUS_HOST_DEVICE float pow_grad(int operand, float dy, float a, float b) {
  if (operand == 0) return b == 0.0f ? 0.0f : dy * (b * powf(a, b - 1.0f));
  return (a == 0.0f && b >= 0.0f) ? 0.0f : dy * (powf(a, b) * logf(a));
}

// PyTorch's gradient of maximum (`larger` true) and minimum: dy to the operand that was chosen, half
// to each on a tie, all of it to both where a NaN makes every comparison false.
CUMULUS_HOST_DEVICE float extremum_grad(bool larger, int operand, float dy, float a, float b) {
  if (a == b) return 0.5f * dy;
  const bool lost = operand == 0 ? (larger ? a < b : a > b) : (larger ? a > b : a < b);
  return lost ? 0.0f : dy;
}

// d(a op b)/d(operand) times dy: operand 0 is a, 1 is b (PyTorch's formulas: div's b gradient is
// -dy (a / b) / b, never b * b, which leaves the f32 range for |b| above 1.8e19 or below 2.6e-23).
CUMULUS_HOST_DEVICE float binary_grad(BinaryOp op, int operand, float dy, float a, float b) {
  switch (op) {
    case BinaryOp::add: return dy;
    case BinaryOp::sub: return operand == 0 ? dy : -dy;
    case BinaryOp::mul: return operand == 0 ? dy * b : dy * a;
    case BinaryOp::div: return operand == 0 ? dy / b : -dy * ((a / b) / b);
    case BinaryOp::pow: return pow_grad(operand, dy, a, b);
    default: return extremum_grad(op == BinaryOp::maximum, operand, dy, a, b);
  }
}

// Note [Broadcast geometry]
// A binary op's output, a and b, in up to 8 dimensions after adjacent dimensions that broadcast
// alike are merged (a same-shape op is one dimension; [B, n] + [n] is two). Each operand's stride
// is 0 along a dimension it broadcasts over, so element i of the output reads a[ia], b[ib] with the
// offsets below. The gradient of an operand sums, for each of its elements, the output elements it
// was read by: the dimensions along which its stride is 0 and the output's size is above 1, visited
// in row-major order, so both devices add in the same order.
struct BroadcastGeometry {
  static constexpr int kMaxDims = 8;
  int ndim = 1;
  int64_t dims[kMaxDims] = {1, 1, 1, 1, 1, 1, 1, 1};  // the output's
  int64_t strides[3][kMaxDims] = {};      // [0] the output's (contiguous), [1] a's, [2] b's
  int64_t numel(int which) const {        // which: 0 output, 1 a, 2 b
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= (which == 0 || strides[which][d] != 0) ? dims[d] : 1;
    return n;
  }
};

// The geometry of a op b for shapes a (na dimensions) and b (nb dimensions, at most kMaxDims each)
// that broadcast under numpy's rules (the caller checks): the output's dimensions of size 1 dropped,
// adjacent dimensions merged where each operand has both or broadcasts along both.
inline BroadcastGeometry broadcast_geometry(const int64_t* a, int na, const int64_t* b, int nb) {
  const int nd = na > nb ? na : nb;
  BroadcastGeometry g;
  g.ndim = 0;
  for (int d = 0; d < nd; ++d) {
    const int ka = d - (nd - na), kb = d - (nd - nb);  // the operands' own dimensions
    const int64_t da = ka >= 0 ? a[ka] : 1, db = kb >= 0 ? b[kb] : 1;
    const int64_t out = da == 1 ? db : da;
    if (out == 1) continue;
    const bool has_a = da != 1, has_b = db != 1;
    const int last = g.ndim - 1;
    if (last >= 0 && has_a == (g.strides[1][last] != 0) && has_b == (g.strides[2][last] != 0)) {
      g.dims[last] *= out;
      continue;
    }
    g.dims[g.ndim] = out;
    g.strides[1][g.ndim] = has_a ? 1 : 0;  // markers; the strides follow below
    g.strides[2][g.ndim] = has_b ? 1 : 0;
    ++g.ndim;
  }
  if (g.ndim == 0) {  // one element
    g.ndim = 1;
    g.strides[1][0] = g.strides[2][0] = 1;
  }
  int64_t running[3] = {1, 1, 1};
  for (int d = g.ndim - 1; d >= 0; --d) {
    g.strides[0][d] = running[0];
    running[0] *= g.dims[d];
    for (int s = 1; s < 3; ++s) {
      if (g.strides[s][d] == 0) continue;
      g.strides[s][d] = running[s];
      running[s] *= g.dims[d];
    }
  }
  return g;
}

// The offsets into a and b of output element i.
CUMULUS_HOST_DEVICE void broadcast_offsets(const BroadcastGeometry& g, int64_t i, int64_t& ia, int64_t& ib) {
  ia = 0;
  ib = 0;
  for (int d = g.ndim - 1; d > 0; --d) {
    const int64_t k = i % g.dims[d];
    i /= g.dims[d];
    ia += k * g.strides[1][d];
    ib += k * g.strides[2][d];
  }
  ia += i * g.strides[1][0];
  ib += i * g.strides[2][0];
}

// The walk over the output elements that read element j of an operand (Note [Broadcast
// geometry]): `base` holds the offsets of the current one into the output, a and b; an odometer
// over the reduced dimensions (innermost first) moves it in row-major order.
struct GradWalk {
  int64_t base[3] = {0, 0, 0};
  int reduced[BroadcastGeometry::kMaxDims] = {};
  int64_t count[BroadcastGeometry::kMaxDims] = {};
  int nreduced = 0;
  bool empty = false;  // no output element reads j (an empty output)
};

CUMULUS_HOST_DEVICE GradWalk grad_walk_start(const BroadcastGeometry& g, int operand, int64_t j) {
  const int64_t* own = g.strides[1 + operand];
  GradWalk w;
  for (int d = g.ndim - 1; d >= 0; --d) {
    if (own[d] == 0) {
      if (g.dims[d] == 0) w.empty = true;
      if (g.dims[d] > 1) w.reduced[w.nreduced++] = d;
      continue;
    }
    const int64_t k = j % g.dims[d];
    j /= g.dims[d];
    for (int s = 0; s < 3; ++s) w.base[s] += k * g.strides[s][d];
  }
  return w;
}

// Moves to the next output element reading j; false after the last.
CUMULUS_HOST_DEVICE bool grad_walk_next(const BroadcastGeometry& g, GradWalk& w) {
  for (int r = 0; r < w.nreduced; ++r) {
    const int d = w.reduced[r];
    for (int s = 0; s < 3; ++s) w.base[s] += g.strides[s][d];
    if (++w.count[r] < g.dims[d]) return true;
    for (int s = 0; s < 3; ++s) w.base[s] -= w.count[r] * g.strides[s][d];
    w.count[r] = 0;
  }
  return false;
}

// binary_grad for the output element at offsets (o, ia, ib); a or b may be null where op does not read it.
template <typename T>
CUMULUS_HOST_DEVICE float binary_grad_at(BinaryOp op, int operand, const T* a, const T* b, const T* dy, int64_t o,
                                         int64_t ia, int64_t ib) {
  const float av = a != nullptr ? to_f32(a[ia]) : 0.0f, bv = b != nullptr ? to_f32(b[ib]) : 0.0f;
  return binary_grad(op, operand, to_f32(dy[o]), av, bv);
}

// The gradient of element j of operand `operand` (0: a, 1: b): the sum of binary_grad over the
// output elements that read it, from 0 in row-major order (Note [Broadcast geometry]), in double so
// that a sum over a million terms keeps f32's precision (a float sum drifts by about n ulp).
template <typename T>
CUMULUS_HOST_DEVICE float broadcast_grad_element(const BroadcastGeometry& g, BinaryOp op, int operand, int64_t j,
                                                 const T* a, const T* b, const T* dy) {
  GradWalk w = grad_walk_start(g, operand, j);
  double sum = 0.0;
  if (w.empty) return 0.0f;
  do {
    sum += binary_grad_at(op, operand, a, b, dy, w.base[0], w.base[1], w.base[2]);
  } while (grad_walk_next(g, w));
  return static_cast<float>(sum);
}

// ---- tensor op scalar ----
// x^e for a scalar e as PyTorch's CPU kernels compute it (pow_out, pow_tensor_scalar_kernel): 1 as
// x, 2, 3 and -2 as products, 0.5, -0.5 and -1 as sqrt, rsqrt and reciprocal, powf otherwise. The same values as
// powf's but for its rounding (these are correctly rounded, or within one more rounding) and a few
// specials where PyTorch follows sqrt: pow(-0, 0.5) = -0, pow(-inf, 0.5) = NaN.
CUMULUS_HOST_DEVICE float pow_scalar(float x, float e) {
  if (e == 1.0f) return x;  // as PyTorch's pow(x, 1), a copy: the gradient of x^2 reads it
  if (e == 2.0f) return x * x;
  if (e == 3.0f) return x * x * x;
  if (e == -2.0f) return 1.0f / (x * x);
  if (e == 0.5f) return sqrtf(x);
  if (e == -0.5f) return 1.0f / sqrtf(x);
  if (e == -1.0f) return 1.0f / x;
  return powf(x, e);
}

// y = x op s, or s op x when `reversed` (s - x, s / x).
CUMULUS_HOST_DEVICE float scalar_apply(BinaryOp op, bool reversed, float x, float s) {
  if (op == BinaryOp::pow && !reversed) return pow_scalar(x, s);
  return reversed ? binary_apply(op, s, x) : binary_apply(op, x, s);
}
// pow's is PyTorch's pow_backward: dy e x^(e - 1), the power computed as the forward computes it,
// and 0 where e is 0.
CUMULUS_HOST_DEVICE float scalar_grad(BinaryOp op, bool reversed, float dy, float x, float s) {
  if (op == BinaryOp::pow && !reversed) return s == 0.0f ? 0.0f : dy * (s * pow_scalar(x, s - 1.0f));
  return reversed ? binary_grad(op, 1, dy, s, x) : binary_grad(op, 0, dy, x, s);
}

// ---- unary ops: activations and elementwise math (PyTorch's formulas) ----
enum class UnaryOp : uint8_t { tanh, sigmoid, gelu, gelu_tanh, exp, log, sqrt, rsqrt, abs, silu };

// Whether the backward of `op` reads the output (tanh, sigmoid, exp, sqrt, rsqrt) rather than the
// input (the gelus, log, abs, silu).
CUMULUS_HOST_DEVICE bool unary_grad_from_output(UnaryOp op) {
  return op == UnaryOp::tanh || op == UnaryOp::sigmoid || op == UnaryOp::exp || op == UnaryOp::sqrt ||
         op == UnaryOp::rsqrt;
}

constexpr float kSqrt1_2 = 0.70710678118654752440f;      // 1 / sqrt(2)
constexpr float kSqrt2OverPi = 0.79788456080286535588f;  // sqrt(2 / pi)
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;   // 1 / sqrt(2 pi)
constexpr float kGeluTanhCubic = 0.044715f;

CUMULUS_HOST_DEVICE float unary_apply(UnaryOp op, float x) {
  switch (op) {
    case UnaryOp::tanh: return tanhf(x);
    case UnaryOp::sigmoid: return 1.0f / (1.0f + expf(-x));
    case UnaryOp::gelu: return 0.5f * x * (1.0f + erff(x * kSqrt1_2));
    case UnaryOp::gelu_tanh: return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kGeluTanhCubic * x * x * x)));
    case UnaryOp::exp: return expf(x);
    case UnaryOp::log: return logf(x);
    case UnaryOp::sqrt: return sqrtf(x);
    case UnaryOp::rsqrt: return 1.0f / sqrtf(x);  // correctly rounded sqrt and division on both devices
    case UnaryOp::silu: return x / (1.0f + expf(-x));  // PyTorch's form: -0 for large negative x, not NaN
    default: return fabsf(x);
  }
}

// dy * f'(x), given `saved`: the output or the input, as unary_grad_from_output says. abs's is
// dy * sign(x) with sign 0 at 0 and at NaN (torch.sign's).
CUMULUS_HOST_DEVICE float unary_grad(UnaryOp op, float dy, float saved) {
  switch (op) {
    case UnaryOp::tanh: return dy * (1.0f - saved * saved);
    case UnaryOp::sigmoid: return dy * saved * (1.0f - saved);
    case UnaryOp::gelu: {
      const float cdf = 0.5f * (1.0f + erff(saved * kSqrt1_2));
      const float pdf = kInvSqrt2Pi * expf(-0.5f * saved * saved);
      return dy * (cdf + saved * pdf);
    }
    case UnaryOp::gelu_tanh: {
      const float x = saved, t = tanhf(kSqrt2OverPi * (x + kGeluTanhCubic * x * x * x));
      const float inner_grad = kSqrt2OverPi * (1.0f + 3.0f * kGeluTanhCubic * x * x);
      return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * inner_grad);
    }
    case UnaryOp::exp: return dy * saved;
    case UnaryOp::log: return dy / saved;
    case UnaryOp::sqrt: return dy / (2.0f * saved);
    case UnaryOp::rsqrt: return -0.5f * dy * (saved * saved * saved);
    case UnaryOp::silu: {  // PyTorch's silu_backward: dy s (1 + x (1 - s)), s = sigmoid(x)
      const float s = 1.0f / (1.0f + expf(-saved));
      return dy * (s * (1.0f + saved * (1.0f - s)));
    }
    default: return dy * static_cast<float>((saved > 0.0f) - (saved < 0.0f));
  }
}

// ---- dropout ----
// Note [Dropout mask]
// Element i of a dropout with (seed, offset) is kept when the top 24 bits of a 64-bit hash of
// (seed, offset, i), as a fraction in [0, 1), are >= p: a counter-based draw, so any element's
// decision is computed on its own, on either device, with the same bits, and the backward
// recomputes the mask instead of storing it. The hash is SplitMix64's finalizer (a bijection of
// 64 bits with full avalanche) applied to the seed, then to the stream key plus the offset's and
// the index's multiples of odd constants. The fraction is exact in f32 (24 bits), so `u >= p`
// is the same comparison everywhere.
CUMULUS_HOST_DEVICE uint64_t splitmix64_finalize(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The stream key of one dropout call.
CUMULUS_HOST_DEVICE uint64_t dropout_key(uint64_t seed, uint64_t offset) {
  return splitmix64_finalize(splitmix64_finalize(seed) + offset * 0xD1B54A32D192ED03ull);
}

// Whether element `index` of the call with `key` is kept at drop probability p.
CUMULUS_HOST_DEVICE bool dropout_keep(uint64_t key, int64_t index, float p) {
  const uint64_t h = splitmix64_finalize(key + static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull);
  const float u = static_cast<float>(h >> 40) * 5.9604644775390625e-08f;  // * 2^-24
  return u >= p;
}

// What element `index` is multiplied by: scale = 1 / (1 - p) when kept, else 0. A multiply rather
// than a choice of 0, as PyTorch's x * mask / (1 - p): a dropped NaN or infinity stays NaN, so the
// non-finite guard still sees it (and a dropped NaN gradient likewise).
CUMULUS_HOST_DEVICE float dropout_factor(uint64_t key, int64_t index, float p, float scale) {
  return dropout_keep(key, index, p) ? scale : 0.0f;
}

}  // namespace cumulus::kernels
