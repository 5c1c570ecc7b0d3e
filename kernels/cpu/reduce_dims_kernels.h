// CPU kernels of the reductions over dimensions (engine/ops/reduce_dims.cpp): sums and means over
// any set of dimensions (kernels/reduce_dims_rules.h, Note [Reduce geometry]), the selections along
// one dimension (max, min, argmax, argmin, topk: Note [Selection order]) and their gradient, and
// multinomial's draws (Note [Multinomial draw]). Templated over the storage type (float, BFloat16,
// Half), computing in f32 and summing in double. A tensor along one dimension is [outer, dim, inner].
#pragma once

#include <cstdint>

#include "kernels/reduce_dims_rules.h"

namespace cumulus::kernels {

// y[o] = (sum over the terms of o, in double, in term order) / divisor, rounded once to T.
template <typename T>
void sum_dims_cpu(const ReduceGeometry& g, const T* x, int64_t divisor, T* y);
// dx[kept_offset(o) + reduced_offset(r)] = scale * dy[o] + beta * dx, for every o and r.
template <typename T>
void sum_dims_backward_cpu(const ReduceGeometry& g, const T* dy, float scale, float beta, T* dx);

// y[o] = extreme_of(o): amax (largest) or amin, stored as T (exact: a copy of a term).
template <typename T>
void extreme_dims_cpu(const ReduceGeometry& g, const T* x, bool largest, T* y);
// dx (+)= amax / amin's gradient from x, its result y and dy (extreme_backward_of).
template <typename T>
void extreme_dims_backward_cpu(const ReduceGeometry& g, const T* x, const T* y, const T* dy, float beta, T* dx);

// Along x [outer, dim, inner]: the k first-ranking elements of each row, into values [outer, k, inner]
// (skipped when null) and indices [outer, k, inner] (select_row).
template <typename T>
void select_along_dim_cpu(const T* x, int64_t outer, int64_t dim, int64_t inner, int64_t k, bool largest,
                          bool nan_first, T* values, int64_t* indices);
// The gradient of select_along_dim's values: dy [outer, k, inner] into dx [outer, dim, inner] (scatter_row).
template <typename T>
void scatter_along_dim_cpu(const T* dy, const int64_t* indices, int64_t outer, int64_t dim, int64_t inner, int64_t k,
                           float beta, T* dx);

// w [rows, n] valid weights (non-negative, each row's sum above 0, enough positive categories
// without replacement) -> out [rows, samples] category indices (multinomial_row).
template <typename T>
void multinomial_cpu(const T* w, int64_t rows, int64_t n, int64_t samples, bool replacement, uint64_t seed,
                     int64_t* out);

}  // namespace cumulus::kernels
