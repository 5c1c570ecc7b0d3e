// The rules of the reductions over dimensions (engine/ops/reduce_dims.cpp), shared by the CPU loops
// (kernels/cpu/reduce_dims.cpp) and the CUDA kernels (kernels/cuda/reduce_dims.cu) through
// CUMULUS_HOST_DEVICE: how an output element finds its inputs, which element ranks first in
// max / min / topk, and multinomial's counter-based draws.
#pragma once

#include <math.h>

#include <cstdint>

#include "kernels/float16.h"
#include "kernels/host_device.h"
#include "kernels/pointwise_rules.h"

namespace cumulus::kernels {

// Up to 8 dimensions of each kind (the engine's shapes have at most 8).
constexpr int kReduceMaxDims = 8;

// Note [Reduce geometry]
// A reduction of a dense, row-major tensor over a set of its dimensions. The kept dimensions
// (in order) index the output, row-major; the reduced ones index the terms of one output element.
// Element (o, r) of the input, o an output index and r a term index (both row-major over their
// dimensions), is at kept_offset(o) + reduced_offset(r). The engine merges neighbouring
// dimensions of the same kind and drops those of size 1, so the common cases (the last dimension,
// the first) are one dimension of each kind.
struct ReduceGeometry {
  int kept_ndim = 0, reduced_ndim = 0;
  int64_t kept_size[kReduceMaxDims] = {}, kept_stride[kReduceMaxDims] = {};
  int64_t reduced_size[kReduceMaxDims] = {}, reduced_stride[kReduceMaxDims] = {};
  int64_t outputs = 1, terms = 1;  // the products of the kept and of the reduced sizes
};

// The offset of row-major index i over `ndim` dimensions of `size` and `stride`.
CUMULUS_HOST_DEVICE int64_t offset_of(int64_t i, int ndim, const int64_t* size, const int64_t* stride) {
  int64_t offset = 0;
  for (int d = ndim - 1; d >= 0; --d) {
    offset += (i % size[d]) * stride[d];
    i /= size[d];
  }
  return offset;
}
CUMULUS_HOST_DEVICE int64_t kept_offset(const ReduceGeometry& g, int64_t o) {
  return offset_of(o, g.kept_ndim, g.kept_size, g.kept_stride);
}
CUMULUS_HOST_DEVICE int64_t reduced_offset(const ReduceGeometry& g, int64_t r) {
  return offset_of(r, g.reduced_ndim, g.reduced_size, g.reduced_stride);
}

// amax / amin of output o's terms: the largest (smallest) value, NaN where any term is NaN (as
// torch.amax); -inf (+inf) for no terms, which the engine refuses.
template <typename T>
CUMULUS_HOST_DEVICE float extreme_of(const ReduceGeometry& g, const T* x, int64_t o, bool largest) {
  const T* xo = x + kept_offset(g, o);
  float best = largest ? -INFINITY : INFINITY;
  for (int64_t r = 0; r < g.terms; ++r) {
    const float v = to_f32(xo[reduced_offset(g, r)]);
    if (v != v) return v;
    best = largest ? (v > best ? v : best) : (v < best ? v : best);
  }
  return best;
}

// The gradient of amax / amin at output o, as torch's: dy / count to each of the count terms equal
// to the result and dy / count * 0 to the others (so NaN everywhere when the result is NaN: no term
// equals it, and dy / 0 * 0 is NaN), written with beta (0 or 1).
template <typename T>
CUMULUS_HOST_DEVICE void extreme_backward_of(const ReduceGeometry& g, const T* x, const T* y, const T* dy, int64_t o,
                                             float beta, T* dx) {
  const int64_t base = kept_offset(g, o);
  const float result = to_f32(y[o]);
  int64_t count = 0;
  for (int64_t r = 0; r < g.terms; ++r) count += to_f32(x[base + reduced_offset(g, r)]) == result;
  const float share = to_f32(dy[o]) / static_cast<float>(count);
  for (int64_t r = 0; r < g.terms; ++r) {
    const int64_t i = base + reduced_offset(g, r);
    const float v = share * (to_f32(x[i]) == result ? 1.0f : 0.0f);
    dx[i] = from_f32<T>(beta == 0.0f ? v : v + beta * to_f32(dx[i]));
  }
}

// Note [Selection order]
// max, min, argmax, argmin and topk pick along one dimension by one total order: element a (at
// index ia) ranks before b when its value is further toward the wanted end (the largest or the
// smallest), ties (-0 and +0 included) going to the lower index, as PyTorch's CPU kernels. A NaN
// equals another NaN and ranks before every number where `nan_first` (max and min propagate NaN:
// torch.max and torch.min return the first NaN, kernels::row_argmax's rule), after every number
// otherwise (topk with largest=false: torch.topk orders NaN as the largest value).
CUMULUS_HOST_DEVICE bool ranks_before(float a, int64_t ia, float b, int64_t ib, bool largest, bool nan_first) {
  const bool a_nan = a != a, b_nan = b != b;
  if (a_nan != b_nan) return a_nan == nan_first;
  if (!a_nan && a != b) return largest ? a > b : a < b;
  return ia < ib;
}

// The k elements of a row of `dim` elements (x[d * stride]) that rank first (Note [Selection
// order]), in that order: values[j * stride] (when values is not null) and indices[j * stride].
// Each pick is the first-ranking element ranking after the previous pick: O(k dim), no scratch.
template <typename T>
CUMULUS_HOST_DEVICE void select_row(const T* x, int64_t dim, int64_t stride, int64_t k, bool largest, bool nan_first,
                                    T* values, int64_t* indices) {
  float prev = 0.0f;
  int64_t prev_index = -1;
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    float best_value = 0.0f;
    for (int64_t d = 0; d < dim; ++d) {
      const float v = to_f32(x[d * stride]);
      if (prev_index >= 0 && !ranks_before(prev, prev_index, v, d, largest, nan_first)) continue;
      if (best < 0 || ranks_before(v, d, best_value, best, largest, nan_first)) {
        best = d;
        best_value = v;
      }
    }
    if (values) values[j * stride] = x[best * stride];
    indices[j * stride] = best;
    prev = best_value;
    prev_index = best;
  }
}

// The gradient of select_row's values: dx[d * stride] = sum of dy[j * stride] over the picks j of d
// (each d at most once) + beta * dx (beta 0 or 1: the gradient sink's mode), rounded once to T.
template <typename T>
CUMULUS_HOST_DEVICE void scatter_row(const T* dy, const int64_t* indices, int64_t dim, int64_t stride, int64_t k,
                                     float beta, T* dx) {
  if (beta == 0.0f)
    for (int64_t d = 0; d < dim; ++d) dx[d * stride] = from_f32<T>(0.0f);
  for (int64_t j = 0; j < k; ++j) {
    T* target = dx + indices[j * stride] * stride;
    *target = from_f32<T>(to_f32(dy[j * stride]) + to_f32(*target));
  }
}

// Multinomial's draw: sample s of row `row` with `seed` is a double uniform in [0, 1), the top 53
// bits of a SplitMix64 hash of (seed, row, s), counter-based as dropout's mask (Note [Dropout
// mask]), so either device computes any draw on its own with the same bits.
CUMULUS_HOST_DEVICE double multinomial_uniform(uint64_t seed, int64_t row, int64_t sample) {
  const uint64_t key = splitmix64_finalize(splitmix64_finalize(seed ^ 0x6A09E667F3BCC909ull) +
                                           static_cast<uint64_t>(row) * 0xD1B54A32D192ED03ull);
  const uint64_t h = splitmix64_finalize(key + static_cast<uint64_t>(sample) * 0x9E3779B97F4A7C15ull);
  return static_cast<double>(h >> 11) * 1.1102230246251565e-16;  // * 2^-53
}

// Whether category c is among the first s samples of a row (sampling without replacement).
CUMULUS_HOST_DEVICE bool already_drawn(const int64_t* drawn, int64_t s, int64_t c) {
  for (int64_t t = 0; t < s; ++t)
    if (drawn[t] == c) return true;
  return false;
}

// Note [Multinomial draw]
// Sample s of a row of n weights w (non-negative, summing above 0: the engine checks) is the
// inverse CDF at u = multinomial_uniform(seed, row, s): the first category c of positive weight
// whose running sum (in double, from category 0) exceeds u * total. Without replacement the
// categories drawn so far leave both the total and the running sum. The last positive category
// takes a u * total that rounding lifts past the running sums.
template <typename T>
CUMULUS_HOST_DEVICE void multinomial_row(const T* w, int64_t n, int64_t samples, bool replacement, uint64_t seed,
                                         int64_t row, int64_t* out) {
  for (int64_t s = 0; s < samples; ++s) {
    double total = 0;
    for (int64_t c = 0; c < n; ++c)
      if (replacement || !already_drawn(out, s, c)) total += static_cast<double>(to_f32(w[c]));
    const double target = multinomial_uniform(seed, row, s) * total;
    double running = 0;
    int64_t pick = -1;
    for (int64_t c = 0; c < n; ++c) {
      const double v = static_cast<double>(to_f32(w[c]));
      if (!(v > 0) || (!replacement && already_drawn(out, s, c))) continue;
      running += v;
      pick = c;
      if (target < running) break;
    }
    out[s] = pick;
  }
}

}  // namespace cumulus::kernels
