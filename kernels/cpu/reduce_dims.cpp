// CPU kernels of the reductions over dimensions (kernels/cpu/reduce_dims_kernels.h).
#include "kernels/cpu/reduce_dims_kernels.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/cpu/vec_reduce.h"

namespace cumulus::kernels {

// Note [Sums over dimensions across outputs]
// Each output of sum_dims is a double sum of its terms (Note [Reduce geometry]), divided by the
// divisor in double and rounded once to float (then to T). The order of its adds is fixed by the
// geometry alone (not by the vector path, the thread count or the split of the outputs):
//   columns: the innermost kept dimension has stride 1 (a sum over the first or middle dims), so
//            neighbouring outputs sit side by side: each output's terms are added in term order,
//            in its own lane, and each term of a row of outputs is one contiguous load;
//   rows:    otherwise (a sum over the last dims): the term at position j of its run (the
//            innermost reduced dimension) goes to partial sum j % 8, each partial adds its terms
//            in term order, and the output is ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)).
//            A contiguous run's 8 next terms are one load that widens into the output's 8 double
//            lanes, its last ones a masked load (+0.0 added to a partial that starts at +0.0 keeps
//            its bits); runs under 8 terms put 8 outputs across the lanes of 8 registers instead.
// An add in double of terms widened from f32 is one IEEE operation whatever the width of the
// register it runs in, so the vector loops (reduce_avx2.cpp and reduce_avx512.cpp, vec_reduce.h)
// and the scalar ones below give the same bits; so do the divisions and the rounding to float.
// The rows' partials are what lets a row's terms be loaded as they lie: a sum in term order needs
// the outputs across the lanes, and the 8 x 8 transposes that put them there cost about as much
// as the adds (a sum over the last dimension of [8, 64, 128] took 8.3 us on Zen 4, 5.7 with the
// partials). They are as accurate: each is a double sum of an eighth of the terms. Each output is
// computed by one thread and one call. The 16-bit types widen exactly in the vector loads as in
// to_f32 (bf16 a shift; f16 by F16C, which quiets a signalling NaN that the first double add would
// quiet anyway). The backward has no sum: each dx element is written once, from its output's dy,
// so it is a plain loop over runs in any order. tests/test_reduce_dims.cpp (SumDimsCpu) checks
// every path against the definition with terms whose double sum depends on its order, so a change
// of order would show.

namespace {

template <typename T>
constexpr ReduceStorage storage_of() {
  if constexpr (std::is_same_v<T, BFloat16>) return ReduceStorage::bf16;
  else if constexpr (std::is_same_v<T, Half>) return ReduceStorage::f16;
  else return ReduceStorage::f32;
}

// The terms of an output as runs: the innermost reduced dimension is a run of `len` elements
// `step` apart; `offsets` has the start of each run (the outer reduced dimensions, row-major, so
// runs in order and elements in order within a run are the terms in order).
struct TermRuns {
  std::vector<int64_t> offsets;
  int64_t len = 1, step = 0;
};

TermRuns term_runs(const ReduceGeometry& g) {
  TermRuns r;
  const int last = g.reduced_ndim - 1;
  if (last >= 0) {
    r.len = g.reduced_size[last];
    r.step = g.reduced_stride[last];
  }
  r.offsets.resize(static_cast<std::size_t>(g.terms / r.len));
  int64_t index[kReduceMaxDims] = {}, offset = 0;
  for (int64_t& start : r.offsets) {
    start = offset;
    for (int d = last - 1; d >= 0; --d) {  // the odometer's carry
      offset += g.reduced_stride[d];
      if (++index[d] < g.reduced_size[d]) break;
      offset -= index[d] * g.reduced_stride[d];
      index[d] = 0;
    }
  }
  return r;
}

// The offsets of consecutive outputs over the first `ndim` kept dimensions, from output `start`:
// one division per dimension at the start, a carry per step.
class KeptOdometer {
 public:
  KeptOdometer(const ReduceGeometry& g, int ndim, int64_t start) : g_(g), ndim_(ndim) {
    for (int d = ndim - 1; d >= 0; --d) {
      index_[d] = start % g.kept_size[d];
      start /= g.kept_size[d];
      offset_ += index_[d] * g.kept_stride[d];
    }
  }
  int64_t offset() const { return offset_; }
  void next() {
    for (int d = ndim_ - 1; d >= 0; --d) {
      offset_ += g_.kept_stride[d];
      if (++index_[d] < g_.kept_size[d]) return;
      offset_ -= index_[d] * g_.kept_stride[d];
      index_[d] = 0;
    }
  }

 private:
  const ReduceGeometry& g_;
  int ndim_;
  int64_t index_[kReduceMaxDims] = {}, offset_ = 0;
};

// The scalar cores, with vec_reduce.h's signatures: the same loops, one lane at a time (the
// compiler may still vectorize the columns' lanes).
template <typename T>
void columns_scalar(const void* xv, ReduceStorage, const int64_t* run_offsets, int64_t runs, int64_t run_len,
                    int64_t step, int64_t n, double divisor, float* y) {
  const T* x = static_cast<const T*>(xv);
  constexpr int64_t kLanes = 16;
  for (int64_t i0 = 0; i0 < n; i0 += kLanes) {
    const int64_t width = std::min(kLanes, n - i0);
    double acc[kLanes] = {};
    for (int64_t q = 0; q < runs; ++q)
      for (int64_t j = 0; j < run_len; ++j) {
        const T* p = x + run_offsets[q] + j * step + i0;
        for (int64_t i = 0; i < width; ++i) acc[i] += static_cast<double>(to_f32(p[i]));
      }
    for (int64_t i = 0; i < width; ++i) y[i0 + i] = static_cast<float>(acc[i] / divisor);
  }
}

// ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)): the rows' tree (Note [Sums over dimensions
// across outputs]), as the vector cores' partials_total.
double partials_total(const double (&p)[8]) {
  return ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
}

template <typename T>
void rows_scalar(const T* x, const int64_t* bases, int64_t count, const TermRuns& r, double divisor, float* y) {
  for (int64_t k = 0; k < count; ++k) {
    double partial[8] = {};
    for (int64_t start : r.offsets) {
      const T* p = x + bases[k] + start;
      for (int64_t j = 0; j < r.len; ++j) partial[j % 8] += static_cast<double>(to_f32(p[j * r.step]));
    }
    y[k] = static_cast<float>(partials_total(partial) / divisor);
  }
}

using ColumnsCore = void (*)(const void*, ReduceStorage, const int64_t*, int64_t, int64_t, int64_t, int64_t, double,
                             float*);
using RowsCore = void (*)(const void*, ReduceStorage, const int64_t*, int64_t, const int64_t*, int64_t, int64_t, double,
                          float*);

// The widest vector cores this CPU runs (CUMULUS_CPU_CAPABILITY caps them), or null for scalar.
// f16 loads need F16C, which every CPU with AVX2 and FMA we know of has; asked all the same, by
// CPUID (clang's __builtin_cpu_supports does not know "f16c").
bool cpu_has_f16c() {
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
#else
  return false;
#endif
}

template <typename T>
std::pair<ColumnsCore, RowsCore> vector_cores() {
#if defined(__x86_64__)
  static const bool f16c = cpu_has_f16c();
  if (std::is_same_v<T, Half> && !f16c) return {nullptr, nullptr};
  if (vec512::available()) return {vec512::sum_columns, vec512::sum_rows};
  if (vec::available()) return {vec::sum_columns, vec::sum_rows};
#endif
  return {nullptr, nullptr};
}

// Outputs per parallel chunk: about kParallelGrain terms, whole vector blocks (kSumRowsMax rows).
int64_t output_grain(int64_t terms) {
  const int64_t outputs = (kParallelGrain + terms - 1) / terms;
  return (outputs + kSumRowsMax - 1) / kSumRowsMax * kSumRowsMax;
}

// y[0..n) = f[0..n) as T (the identity for float).
template <typename T>
void store_outputs(const float* f, int64_t n, T* y) {
  if constexpr (!std::is_same_v<T, float>)
    for (int64_t i = 0; i < n; ++i) y[i] = from_f32<T>(f[i]);
}

// The innermost dimension kept (Note [Sums over dimensions across outputs], columns): outputs in
// pieces of one row of the innermost kept dimension.
template <typename T>
void sum_columns_mode(const ReduceGeometry& g, const T* x, const TermRuns& r, double divisor, T* y) {
  const ColumnsCore vector_core = vector_cores<T>().first;
  const ColumnsCore core = vector_core ? vector_core : columns_scalar<T>;
  const int outer_ndim = g.kept_ndim - 1;
  const int64_t inner = g.kept_size[outer_ndim];
  parallel_for(g.outputs, output_grain(g.terms), [&](int64_t begin, int64_t end) {
    constexpr int64_t kPiece = 512;  // a 16-bit type's float outputs, staged
    float staged[kPiece];
    for (int64_t o = begin; o < end;) {
      const int64_t outer = o / inner, i = o - outer * inner;
      int64_t n = std::min(inner - i, end - o);
      if (!std::is_same_v<T, float>) n = std::min(n, kPiece);
      const int64_t base = offset_of(outer, outer_ndim, g.kept_size, g.kept_stride) + i;
      float* out = std::is_same_v<T, float> ? reinterpret_cast<float*>(y + o) : staged;
      core(x + base, storage_of<T>(), r.offsets.data(), static_cast<int64_t>(r.offsets.size()), r.len, r.step, n,
           divisor, out);
      store_outputs(out, n, y + o);
      o += n;
    }
  });
}

// Otherwise (Note [Sums over dimensions across outputs], rows): kSumRowsMax outputs a call, their
// offsets from the kept dimensions' odometer. The vector rows need contiguous runs; the scalar loop
// takes any geometry.
template <typename T>
void sum_rows_mode(const ReduceGeometry& g, const T* x, const TermRuns& r, double divisor, T* y) {
  RowsCore core = vector_cores<T>().second;
  if (r.step != 1) core = nullptr;
  // Kept dimensions that nest as one (each stride the next one's times its size: a sum over the
  // last dimensions of a contiguous tensor) put output o at o times the innermost stride: no
  // odometer step per output (6% of a [8, 64, 128] sum's samples).
  bool nested = g.kept_ndim > 0;
  for (int d = 0; d + 1 < g.kept_ndim; ++d)
    nested = nested && g.kept_stride[d] == g.kept_stride[d + 1] * g.kept_size[d + 1];
  const int64_t step = nested ? g.kept_stride[g.kept_ndim - 1] : 0;
  parallel_for(g.outputs, output_grain(g.terms), [&](int64_t begin, int64_t end) {
    KeptOdometer kept(g, g.kept_ndim, begin);
    int64_t bases[kSumRowsMax];
    float staged[kSumRowsMax];  // a 16-bit type's float outputs; float ones go straight to y
    for (int64_t o = begin; o < end; o += kSumRowsMax) {
      const int64_t count = std::min(kSumRowsMax, end - o);
      if (nested)
        for (int64_t k = 0; k < count; ++k) bases[k] = (o + k) * step;
      else
        for (int64_t k = 0; k < count; ++k, kept.next()) bases[k] = kept.offset();
      float* out = std::is_same_v<T, float> ? reinterpret_cast<float*>(y + o) : staged;
      if (core)
        core(x, storage_of<T>(), bases, count, r.offsets.data(), static_cast<int64_t>(r.offsets.size()), r.len, divisor,
             out);
      else rows_scalar(x, bases, count, r, divisor, out);
      store_outputs(out, count, y + o);
    }
  });
}

}  // namespace

template <typename T>
void sum_dims_cpu(const ReduceGeometry& g, const T* x, int64_t divisor, T* y) {
  if (g.outputs == 0) return;
  const double d = static_cast<double>(divisor);
  if (g.terms == 0) {  // 0 / divisor: 0, or NaN for a mean
    std::fill_n(y, g.outputs, from_f32<T>(static_cast<float>(0.0 / d)));
    return;
  }
  const TermRuns r = term_runs(g);
  const int last = g.kept_ndim - 1;
  if (last >= 0 && g.kept_stride[last] == 1) sum_columns_mode(g, x, r, d, y);
  else sum_rows_mode(g, x, r, d, y);
}

namespace {

// dx[i] = scale dy[i] (+ beta dx[i]) for a row of n: the same float operations as one element's.
template <typename T>
void scaled_row(const T* dy, float scale, float beta, int64_t n, T* dx) {
  if (beta == 0.0f)
    for (int64_t i = 0; i < n; ++i) dx[i] = from_f32<T>(scale * to_f32(dy[i]));
  else
    for (int64_t i = 0; i < n; ++i) dx[i] = from_f32<T>(scale * to_f32(dy[i]) + beta * to_f32(dx[i]));
}

// dx[j step] = v (+ beta dx[j step]) for j < n.
template <typename T>
void filled_run(float v, float beta, int64_t n, int64_t step, T* dx) {
  if (beta == 0.0f) {
    const T value = from_f32<T>(v);
    if (step == 1) std::fill_n(dx, n, value);
    else
      for (int64_t j = 0; j < n; ++j) dx[j * step] = value;
  } else if (step == 1) {
    for (int64_t j = 0; j < n; ++j) dx[j] = from_f32<T>(v + beta * to_f32(dx[j]));
  } else {
    for (int64_t j = 0; j < n; ++j) dx[j * step] = from_f32<T>(v + beta * to_f32(dx[j * step]));
  }
}

}  // namespace

// A broadcast with no sum: each dx element is written once from its output's dy, so any loop order
// gives the same bits. The innermost dimension kept: each term of a row of outputs is a row of dx
// (scaled_row); otherwise each output fills its runs (filled_run).
template <typename T>
void sum_dims_backward_cpu(const ReduceGeometry& g, const T* dy, float scale, float beta, T* dx) {
  if (g.outputs == 0 || g.terms == 0) return;
  const TermRuns r = term_runs(g);
  const int last = g.kept_ndim - 1;
  if (last >= 0 && g.kept_stride[last] == 1) {
    const int64_t inner = g.kept_size[last];
    parallel_for(g.outputs, output_grain(g.terms), [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end;) {
        const int64_t outer = o / inner, i = o - outer * inner, n = std::min(inner - i, end - o);
        T* row = dx + offset_of(outer, last, g.kept_size, g.kept_stride) + i;
        for (int64_t start : r.offsets)
          for (int64_t j = 0; j < r.len; ++j) scaled_row(dy + o, scale, beta, n, row + start + j * r.step);
        o += n;
      }
    });
    return;
  }
  parallel_for(g.outputs, output_grain(g.terms), [&](int64_t begin, int64_t end) {
    KeptOdometer kept(g, g.kept_ndim, begin);
    for (int64_t o = begin; o < end; ++o, kept.next()) {
      const float v = scale * to_f32(dy[o]);
      for (int64_t start : r.offsets) filled_run(v, beta, r.len, r.step, dx + kept.offset() + start);
    }
  });
}

template <typename T>
void extreme_dims_cpu(const ReduceGeometry& g, const T* x, bool largest, T* y) {
  for (int64_t o = 0; o < g.outputs; ++o) y[o] = from_f32<T>(extreme_of(g, x, o, largest));
}

template <typename T>
void extreme_dims_backward_cpu(const ReduceGeometry& g, const T* x, const T* y, const T* dy, float beta, T* dx) {
  for (int64_t o = 0; o < g.outputs; ++o) extreme_backward_of(g, x, y, dy, o, beta, dx);
}

template <typename T>
void select_along_dim_cpu(const T* x, int64_t outer, int64_t dim, int64_t inner, int64_t k, bool largest,
                          bool nan_first, T* values, int64_t* indices) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t out = o * k * inner + i;
      select_row(x + o * dim * inner + i, dim, inner, k, largest, nan_first, values ? values + out : nullptr,
                 indices + out);
    }
}

template <typename T>
void scatter_along_dim_cpu(const T* dy, const int64_t* indices, int64_t outer, int64_t dim, int64_t inner, int64_t k,
                           float beta, T* dx) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t in = o * k * inner + i;
      scatter_row(dy + in, indices + in, dim, inner, k, beta, dx + o * dim * inner + i);
    }
}

template <typename T>
void multinomial_cpu(const T* w, int64_t rows, int64_t n, int64_t samples, bool replacement, uint64_t seed,
                     int64_t* out) {
  for (int64_t r = 0; r < rows; ++r) multinomial_row(w + r * n, n, samples, replacement, seed, r, out + r * samples);
}

#define CUMULUS_INSTANTIATE(T)                                                                                  \
  template void sum_dims_cpu(const ReduceGeometry&, const T*, int64_t, T*);                                     \
  template void sum_dims_backward_cpu(const ReduceGeometry&, const T*, float, float, T*);                       \
  template void extreme_dims_cpu(const ReduceGeometry&, const T*, bool, T*);                                    \
  template void extreme_dims_backward_cpu(const ReduceGeometry&, const T*, const T*, const T*, float, T*);      \
  template void select_along_dim_cpu(const T*, int64_t, int64_t, int64_t, int64_t, bool, bool, T*, int64_t*);   \
  template void scatter_along_dim_cpu(const T*, const int64_t*, int64_t, int64_t, int64_t, int64_t, float, T*); \
  template void multinomial_cpu(const T*, int64_t, int64_t, int64_t, bool, uint64_t, int64_t*);
CUMULUS_INSTANTIATE(float)
CUMULUS_INSTANTIATE(BFloat16)
CUMULUS_INSTANTIATE(Half)
#undef CUMULUS_INSTANTIATE

}  // namespace cumulus::kernels
