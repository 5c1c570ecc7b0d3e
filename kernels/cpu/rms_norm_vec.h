// The arithmetic of kernels/cpu/rms_norm_rows.h's functions at W float lanes, in GCC's vector
// extensions: included only by rms_norm_avx2.cpp (W = 8) and rms_norm_avx512.cpp (W = 16), each
// compiled for its instruction set without contraction (CMakeLists.txt), so the same source gives
// both widths. Everything here sits in an anonymous namespace and calls only builtins or
// lane_access.h's (anonymous too), so no inline function the rest of the library shares gets a
// copy with wider instructions.
#pragma once

#include <cstdint>

#include "kernels/cpu/lane_access.h"

namespace cumulus::kernels {
namespace {

// W floats and W doubles as vectors (GCC takes no vector_size that depends on a template parameter).
template <int W>
struct Lanes;
template <>
struct Lanes<8> {
  typedef float F __attribute__((vector_size(32)));
  typedef double D __attribute__((vector_size(64)));
};
template <>
struct Lanes<16> {
  typedef float F __attribute__((vector_size(64)));
  typedef double D __attribute__((vector_size(128)));
};

template <int W>
struct RmsNormRows {
  using F = typename Lanes<W>::F;
  using D = typename Lanes<W>::D;
  // Vectors per float block of a sum (Note [Blocked float sums] in vec_math_avx512.cpp): a lane
  // adds at most this many terms in float before the block goes into double.
  static constexpr int64_t kSumBlock = 8;
  // Rows up to this width ask for the next row ahead (Note [Prefetching the next row] there).
  static constexpr int64_t kPrefetchRow = 4096;

  static F load(const float* p) { return load_lanes<F>(p); }
  static void store(float* p, F v) { store_lanes(p, v); }
  static F splat(float s) { return F{} + s; }
  // Element i of the row after `row` (n floats on): past the tensor's end the address names memory
  // the program may not own, which a prefetch never faults on; computed as an integer, since a
  // pointer past the array would be undefined.
  // kWrite: 1 for a row about to be written.
  template <int kWrite>
  static void prefetch_next_row(const float* row, int64_t n, int64_t i) {
    const auto line = reinterpret_cast<__UINTPTR_TYPE__>(row) + static_cast<__UINTPTR_TYPE__>(n + i) * sizeof(float);
    __builtin_prefetch(reinterpret_cast<const void*>(line), kWrite, 3);
  }

  // sum over the row of term(i): a vector of terms for the lanes [i, i + W) of the whole vectors,
  // in float over blocks (two accumulators, so the adds' latency overlaps), each block into double
  // lanes; the tail's terms tail_term(i) in double.
  template <typename Term, typename TailTerm>
  static double blocked_sum(int64_t n, Term term, TailTerm tail_term) {
    const int64_t whole = n - n % W;
    D total = D{};
    for (int64_t b = 0; b < whole; b += W * kSumBlock) {
      const int64_t end = whole - b < W * kSumBlock ? whole : b + W * kSumBlock;
      F even = F{}, odd = F{};
      int64_t i = b;
      for (; i + 2 * W <= end; i += 2 * W) {
        even += term(i);
        odd += term(i + W);
      }
      if (i < end) even += term(i);
      total += __builtin_convertvector(even + odd, D);
    }
    double sum = 0.0;
    for (int k = 0; k < W; ++k) sum += total[k];
    for (int64_t i = whole; i < n; ++i) sum += tail_term(i);
    return sum;
  }

  static void forward(const float* x, const float* weight, int64_t n, float eps, float* y, float* rstd) {
    const double squares = blocked_sum(
        n,
        [&](int64_t i) {
          const F v = load(x + i);
          return v * v;
        },
        [&](int64_t i) { return static_cast<double>(x[i] * x[i]); });
    const auto r = static_cast<float>(1.0 / __builtin_sqrt(squares / static_cast<double>(n) + eps));
    *rstd = r;
    const F rv = splat(r);
    const int64_t whole = n - n % W;
    for (int64_t i = 0; i < whole; i += W) {
      F v = load(x + i) * rv;
      if (weight != nullptr) v *= load(weight + i);
      store(y + i, v);
    }
    for (int64_t i = whole; i < n; ++i) y[i] = weight != nullptr ? x[i] * r * weight[i] : x[i] * r;
  }

  // dx = a g + b x with a = rstd and b = -rstd^3 mean(g x): two operations a vector for dx where
  // rstd (g - x_hat mean(g x_hat)) as written takes five. The tail takes the same float operations.
  static void grad(const float* x, const float* dy, const float* weight, float rstd, int64_t n, float beta, float* dx,
                   float* pw) {
    const double gx = blocked_sum(
        n,
        [&](int64_t i) {
          const F g = weight != nullptr ? load(dy + i) * load(weight + i) : load(dy + i);
          return g * load(x + i);
        },
        [&](int64_t i) { return static_cast<double>((weight != nullptr ? dy[i] * weight[i] : dy[i]) * x[i]); });
    const double r = rstd;
    const float a = rstd, b = static_cast<float>(-r * r * r * gx / static_cast<double>(n));
    const F av = splat(a), bv = splat(b), betav = splat(beta);
    const bool ahead = n <= kPrefetchRow;
    const int64_t whole = n - n % W;
    for (int64_t i = 0; i < whole; i += W) {
      if (ahead) {
        prefetch_next_row<0>(x, n, i);
        prefetch_next_row<0>(dy, n, i);
        prefetch_next_row<1>(dx, n, i);
      }
      const F d = load(dy + i), xv = load(x + i);
      const F g = weight != nullptr ? d * load(weight + i) : d;
      F out = av * g + bv * xv;
      if (beta != 0.0f) out += betav * load(dx + i);
      store(dx + i, out);
      if (pw != nullptr) store(pw + i, load(pw + i) + d * (xv * av));
    }
    for (int64_t i = whole; i < n; ++i) {
      const float g = weight != nullptr ? dy[i] * weight[i] : dy[i];
      float out = a * g + b * x[i];
      if (beta != 0.0f) out += beta * dx[i];
      dx[i] = out;
      if (pw != nullptr) pw[i] += dy[i] * (x[i] * a);
    }
  }
};

}  // namespace
}  // namespace cumulus::kernels
