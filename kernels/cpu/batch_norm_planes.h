// The per-plane loops of batch_norm2d on the CPU (kernels/cpu/batch_norm.cpp), one source for two
// builds: included by batch_norm.cpp (the library's baseline instructions, every T) and by
// batch_norm_avx2.cpp (f32, AVX2 without contraction: CMakeLists.txt), whose vec:: functions the
// kernels call when vec::available(). The same operations in the same order either way, so both
// give the same bits; only the width the compiler vectorizes them at differs. Everything sits in an
// anonymous namespace, so no function gets a copy with wider instructions that the baseline shares.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/float16.h"

namespace cumulus::kernels {
namespace {

// float16.h's conversions for 16-bit T; for f32 none is called, so the AVX2 build (f32 only) makes
// no copy of an inline function the baseline shares.
template <typename T>
float as_f32(T v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return to_f32(v);
}
template <typename T>
T from_float(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return from_f32<T>(v);
}

// Sums over one plane of `n` values in 8 float lanes (a single double accumulator would serialize
// the loop), returned in double: planes are short (H*W), and the sum over planes is taken in double
// by the callers. The lanes are one GCC vector (the compiler left to itself shuffled the lanes of
// two accumulators through the stack); each lane adds the same terms in the same order on every
// path.
constexpr int kLanes = 8;
typedef float Lanes8 __attribute__((vector_size(32)));

// v = the 8 floats from p + j, widened from T. (Vectors go by reference: a 32-byte vector by value
// would change the calling convention between the baseline build and the AVX2 one.)
template <typename T>
void load_at(const T* p, int64_t j, Lanes8& v) {
  if constexpr (std::is_same_v<T, float>) {
    __builtin_memcpy(&v, p + j, sizeof v);
  } else {
    for (int l = 0; l < kLanes; ++l) v[l] = as_f32(p[j + l]);
  }
}

inline double lane_sum(const Lanes8& acc) {
  double s = 0.0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

template <typename T>
double plane_sum(const T* p, int64_t n) {
  Lanes8 acc = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    Lanes8 v;
    load_at(p, j, v);
    acc += v;
  }
  double s = lane_sum(acc);
  for (; j < n; ++j) s += as_f32(p[j]);
  return s;
}

// sum (p - mean)^2
template <typename T>
double plane_squared_deviation(const T* p, int64_t n, float mean) {
  Lanes8 acc = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    Lanes8 v;
    load_at(p, j, v);
    const Lanes8 d = v - mean;
    acc += d * d;
  }
  double s = lane_sum(acc);
  for (; j < n; ++j) s += static_cast<double>(as_f32(p[j]) - mean) * (as_f32(p[j]) - mean);
  return s;
}

// q = (p - mean) * scale + beta over one plane: centred first, so that a channel near its mean
// keeps its precision (x * scale + (beta - mean * scale) cancels when the mean is large against
// beta, and a constant channel would not come out as beta).
template <typename T>
void normalize_plane(const T* p, int64_t n, float mean, float scale, float beta, T* q) {
  for (int64_t j = 0; j < n; ++j) q[j] = from_float<T>((as_f32(p[j]) - mean) * scale + beta);
}

// sum g and sum g * (p - mean), added to *sum_g and *sum_gd.
template <typename T>
void plane_grad_sums(const T* p, const T* g, int64_t n, float mean, double* sum_g, double* sum_gd) {
  Lanes8 a = {}, b = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    Lanes8 gv, pv;
    load_at(g, j, gv);
    load_at(p, j, pv);
    a += gv;
    b += gv * (pv - mean);
  }
  double sa = lane_sum(a), sb = lane_sum(b);
  for (; j < n; ++j) sa += as_f32(g[j]), sb += static_cast<double>(as_f32(g[j])) * (as_f32(p[j]) - mean);
  *sum_g += sa;
  *sum_gd += sb;
}

// One plane's dx = scale * (dy - mean_dy - x_hat * mean_dy_xhat) blended into q with beta.
// Evaluation mode's dx is scale * dy whatever x is: x_hat * 0 would make a NaN or an infinite x a
// NaN dx (CUDA's inference_dx_kernel, and PyTorch, never read x). The cases are separate loops so
// that each vectorizes.
template <bool kTraining, bool kBlend, typename T>
void plane_dx(const T* p, const T* g, int64_t n, float mean, float invstd, float scale, float mean_dy,
              float mean_dy_xhat, float beta, T* q) {
  for (int64_t j = 0; j < n; ++j) {
    const float xhat = kTraining ? (as_f32(p[j]) - mean) * invstd : 0.0f;
    const float v = scale * (as_f32(g[j]) - mean_dy - xhat * mean_dy_xhat);
    q[j] = from_float<T>(kBlend ? v + beta * as_f32(q[j]) : v);
  }
}

template <typename T>
void plane_dx_of(const T* p, const T* g, int64_t n, bool training, float mean, float invstd, float scale, float mean_dy,
                 float mean_dy_xhat, float beta, T* q) {
  if (training && beta == 0.0f) plane_dx<true, false>(p, g, n, mean, invstd, scale, mean_dy, mean_dy_xhat, beta, q);
  else if (training) plane_dx<true, true>(p, g, n, mean, invstd, scale, mean_dy, mean_dy_xhat, beta, q);
  else if (beta == 0.0f) plane_dx<false, false>(p, g, n, mean, invstd, scale, mean_dy, mean_dy_xhat, beta, q);
  else plane_dx<false, true>(p, g, n, mean, invstd, scale, mean_dy, mean_dy_xhat, beta, q);
}

}  // namespace
}  // namespace cumulus::kernels
