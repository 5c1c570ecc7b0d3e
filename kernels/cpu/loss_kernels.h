// CPU kernels of cross_entropy over rows with ignored positions and per-row losses
// (engine/ops/cross_entropy.cpp; the CUDA launchers: kernels/cuda/loss_kernels.h). The math is
// cross_entropy_forward_cpu's (kernels/cpu/cross_entropy.cpp); a row whose label is ignore_index
// adds no loss and gets no gradient. Instantiated for float, BFloat16 and Half logits.
#pragma once

#include <cstdint>

namespace cumulus::kernels {

// Each row's loss (m - x_y) + log sum exp(x - m), summed in double: loss[0] = sum * scale (rounded
// once) when row_loss is null, else row_loss[i] = the row's loss (0 for an ignored row). Returns the
// first row whose label is outside [0, classes) and not ignore_index (nothing written), else -1.
// With `stats` (else null), stats[2 i] and stats[2 i + 1] get row i's maximum and log sum exp (the
// row_stats the backward needs; unset for an ignored row).
template <typename T>
int64_t cross_entropy_rows_forward_cpu(const T* logits, const int32_t* labels, int64_t rows, int64_t classes,
                                       int64_t ignore_index, float scale, float* loss, float* row_loss,
                                       float* stats = nullptr);

// dx_ij = scale * grad[i * grad_stride] * (softmax(x_i)_j - [j == y_i]) (+ beta * dx), 0 (+ beta * dx)
// for an ignored row. grad_stride 0: one upstream gradient for every row (a reduced loss). `stats`:
// the forward's (the same values row_stats gives, so the same bits), else null to compute them.
template <typename T>
void cross_entropy_rows_backward_cpu(const T* logits, const int32_t* labels, int64_t rows, int64_t classes,
                                     int64_t ignore_index, const float* grad, int64_t grad_stride, float scale,
                                     float beta, T* dlogits, const float* stats = nullptr);

// out[i] = in[i] as i32, or INT32_MIN where it does not fit (an index no dimension has).
void indices_to_i32_cpu(const int64_t* in, int64_t n, int32_t* out);

}  // namespace cumulus::kernels
