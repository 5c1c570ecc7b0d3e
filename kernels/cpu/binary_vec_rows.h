// The rows of add, sub, mul and div (kernels/cpu/vec_math.h's binary_f32) at either width, as
// BinaryRows<Lanes>: included only by vec_math_avx2.cpp and vec_math_avx512.cpp, each compiled for
// its instruction set, whose Lanes type gives V, kWidth, load, store, splat and the four operations.
// Each element is one IEEE operation on the same two floats as the scalar rule's (binary_apply in
// kernels/pointwise_rules.h), so any width gives its bits; the tail under a vector is that operation
// one element at a time. The column sums of a bias gradient (column_sums) take the same lanes, one
// add a row in row order, as the scalar loop. Everything sits in an anonymous namespace and calls no
// std:: template, so no inline function the library shares gets a copy with wider instructions.
#pragma once

#include <cstdint>

namespace cumulus::kernels {
namespace {

// The scalar operations of the tail.
struct ScalarOps {
  static float add(float a, float b) { return a + b; }
  static float sub(float a, float b) { return a - b; }
  static float mul(float a, float b) { return a * b; }
  static float div(float a, float b) { return a / b; }
};

template <typename Lanes>
struct BinaryRows {
  using V = typename Lanes::V;

  // a op b for BinaryOp's first four values (add, sub, mul, div).
  template <int kOp, typename Ops, typename X>
  static X apply(X a, X b) {
    if constexpr (kOp == 0) return Ops::add(a, b);
    else if constexpr (kOp == 1) return Ops::sub(a, b);
    else if constexpr (kOp == 2) return Ops::mul(a, b);
    else return Ops::div(a, b);
  }

  // y[i] = a[i kA] op b[i kB] for i < n, kA and kB 0 (one value for the row) or 1.
  template <int kOp, int kA, int kB>
  static void row(const float* a, const float* b, float* y, int64_t n) {
    const V a0 = Lanes::splat(*a), b0 = Lanes::splat(*b);
    int64_t i = 0;
    for (; i + Lanes::kWidth <= n; i += Lanes::kWidth) {
      const V av = kA ? Lanes::load(a + i) : a0, bv = kB ? Lanes::load(b + i) : b0;
      Lanes::store(y + i, apply<kOp, Lanes>(av, bv));
    }
    for (; i < n; ++i) y[i] = apply<kOp, ScalarOps>(a[i * kA], b[i * kB]);
  }

  template <int kOp>
  static void row_of(const float* a, int64_t a_step, const float* b, int64_t b_step, float* y, int64_t n) {
    if (a_step != 0) return b_step != 0 ? row<kOp, 1, 1>(a, b, y, n) : row<kOp, 1, 0>(a, b, y, n);
    return b_step != 0 ? row<kOp, 0, 1>(a, b, y, n) : row<kOp, 0, 0>(a, b, y, n);
  }

  static void run(int op, const float* a, int64_t a_step, const float* b, int64_t b_step, float* y, int64_t n) {
    switch (op) {
      case 0: return row_of<0>(a, a_step, b, b_step, y, n);
      case 1: return row_of<1>(a, a_step, b, b_step, y, n);
      case 2: return row_of<2>(a, a_step, b, b_step, y, n);
      default: return row_of<3>(a, a_step, b, b_step, y, n);
    }
  }

  // out[c] += x[r ld + c] over the rows r < rows in order, for c < n: each column summed in float,
  // one add a row, as the scalar loop of sum_rows_cpu, so the same bits. kBlock vectors of columns
  // stay in registers over all the rows: the scalar loop loaded and stored out[c] for every row.
  static void column_sums(const float* x, int64_t rows, int64_t ld, float* out, int64_t n) {
    constexpr int kBlock = 8;
    int64_t c = 0;
    for (; c + kBlock * Lanes::kWidth <= n; c += kBlock * Lanes::kWidth) column_block<kBlock>(x + c, rows, ld, out + c);
    for (; c + Lanes::kWidth <= n; c += Lanes::kWidth) column_block<1>(x + c, rows, ld, out + c);
    for (; c < n; ++c) {
      float sum = out[c];
      for (int64_t r = 0; r < rows; ++r) sum = ScalarOps::add(sum, x[r * ld + c]);
      out[c] = sum;
    }
  }

  template <int kVectors>
  static void column_block(const float* x, int64_t rows, int64_t ld, float* out) {
    V acc[kVectors];
    for (int v = 0; v < kVectors; ++v) acc[v] = Lanes::load(out + v * Lanes::kWidth);
    for (int64_t r = 0; r < rows; ++r)
      for (int v = 0; v < kVectors; ++v) acc[v] = Lanes::add(acc[v], Lanes::load(x + r * ld + v * Lanes::kWidth));
    for (int v = 0; v < kVectors; ++v) Lanes::store(out + v * Lanes::kWidth, acc[v]);
  }
};

}  // namespace
}  // namespace cumulus::kernels
