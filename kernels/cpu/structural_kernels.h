// CPU launchers of the structural ops (engine/ops/layer_norm.cpp, index.cpp, concat.cpp, matmul.cpp).
// Templated over the storage type T (float, BFloat16, Half), f32 arithmetic, one rounding per
// 16-bit store; every launcher that writes a gradient takes a beta (0 overwrites without reading
// the destination, 1 adds to it: Note [Gradient sinks]).
//
// Slabs: an op along dimension `dim` of a contiguous tensor sees it as [outer, size(dim), inner]
// (outer: the product of the sizes before dim, inner: of those after), so one launcher serves
// every dimension.
#pragma once

#include <cstdint>

#include "kernels/float16.h"

namespace cumulus::kernels {

// ---- layer norm over the last dimension: x [rows, cols] ----
// y = (x - mean) * rstd * weight + bias with the biased variance and rstd = 1 / sqrt(var + eps);
// weight and bias f32 or null (1 and 0). Writes each row's mean and rstd (f32) for backward.
template <typename T>
void layer_norm_forward_cpu(const T* x, const float* weight, const float* bias, int64_t rows, int64_t cols, float eps,
                            T* y, float* mean, float* rstd);
// dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)) + beta * dx, g = dy * weight (weight null: 1).
template <typename T>
void layer_norm_backward_dx_cpu(const T* x, const T* dy, const float* weight, const float* mean, const float* rstd,
                                int64_t rows, int64_t cols, float beta, T* dx);
// dweight = sum_rows dy * x_hat + beta_dw * dweight, dbias = sum_rows dy + beta_db * dbias (each
// skipped when null); f32, summed over the rows in order.
template <typename T>
void layer_norm_param_grads_cpu(const T* x, const T* dy, const float* mean, const float* rstd, int64_t rows,
                                int64_t cols, float beta_dw, float* dweight, float beta_db, float* dbias);
// Both: dx (skipped when null) and the parameter gradients, in one pass over x and dy where the CPU
// has AVX-512 (Note [Layer norm's backward in one pass] in structural.cpp), else the two above.
template <typename T>
void layer_norm_backward_cpu(const T* x, const T* dy, const float* weight, const float* mean, const float* rstd,
                             int64_t rows, int64_t cols, float beta, T* dx, float beta_dw, float* dweight,
                             float beta_db, float* dbias);

// ---- slabs ----
// dst[o, dst_start + j, i] = src[o, src_start + j, i] + beta * dst[...] for j < length: narrow's
// forward, cat's forward (one input at a time) and cat's backward (one input's gradient).
template <typename T>
void copy_slab_cpu(const T* src, int64_t src_dim, int64_t src_start, T* dst, int64_t dst_dim, int64_t dst_start,
                   int64_t outer, int64_t length, int64_t inner, float beta);
// narrow's backward: dx[o, d, i] = (start <= d < start + length ? dy[o, d - start, i] : 0) + beta * dx.
template <typename T>
void narrow_backward_cpu(const T* dy, int64_t outer, int64_t dim, int64_t start, int64_t length, int64_t inner,
                         float beta, T* dx);

// ---- gathers along a dimension (index_select, embedding) ----
// Returns the position of the first index outside [0, dim), or -1 (checked before any kernel runs).
int64_t first_index_out_of_range_cpu(const int32_t* indices, int64_t count, int64_t dim);
// y[o, j, i] = x[o, indices[j], i] (indices in range).
template <typename T>
void index_gather_cpu(const T* x, int64_t outer, int64_t dim, const int32_t* indices, int64_t count, int64_t inner,
                      T* y);
// dx[o, d, i] = sum over j with indices[j] == d of dy[o, j, i] + beta * dx: summed in f32 in the
// order of j, starting from beta * dx, rounded once into a 16-bit dx.
template <typename T>
void index_scatter_add_cpu(const T* dy, int64_t outer, int64_t count, const int32_t* indices, int64_t dim,
                           int64_t inner, float beta, T* dx);

}  // namespace cumulus::kernels
