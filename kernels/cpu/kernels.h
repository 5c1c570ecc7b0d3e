// CPU launchers. Row-major, f32 unless noted; a launcher templated over T (float, BFloat16, Half)
// stores T and computes in f32 (Note [Mixed precision] in engine/ops/linear.cpp). Every launcher that writes a gradient takes a beta:
// 0 overwrites without reading the destination (it may hold stale or uninitialized values),
// 1 adds to it. See Note [Gradient sinks] in engine/include/cumulus/autograd/node.h.
#pragma once

#include "cumulus/optim/update_scalars.h"
#include <cstdint>

#include "kernels/float16.h"
#include "kernels/gather.h"
#include "kernels/metrics.h"
#include "kernels/quantized_state.h"

namespace cumulus::kernels {

// c[m, n] = alpha * op(a)[m, k] * op(b)[k, n] + beta * c; op transposes when trans_* is set.
void gemm_cpu(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc);

// y = x converted, among float, BFloat16 and Half (one rounding at most: through f32; Note
// [Half-precision conversions] in kernels/float16.h).
template <typename From, typename To>
void convert_cpu(const From* x, To* y, int64_t n);

// out[r, :] = row for every r of [rows, cols].
void broadcast_rows_cpu(const float* row, int64_t rows, int64_t cols, float* out);
// out[c] = sum_r x[r, c] + beta * out[c]   (x: [rows, cols]; the bias gradient)
void sum_rows_cpu(const float* x, int64_t rows, int64_t cols, float beta, float* out);
// out[0] = scale * sum_i x[i]   (accumulated in double)
void sum_all_cpu(const float* x, int64_t n, float scale, float* out);

template <typename T>
void relu_forward_cpu(const T* x, T* y, int64_t n);
// dx = dy * (y > 0) + beta * dx
template <typename T>
void relu_backward_cpu(const T* y, const T* dy, float beta, T* dx, int64_t n);

void fill_cpu(float* out, float value, int64_t n);
// out = scale * scalar[0] + beta * out
void fill_from_scalar_cpu(const float* scalar, float scale, float beta, float* out, int64_t n);
// y = x + beta * y
template <typename T>
void accumulate_cpu(const T* x, float beta, T* y, int64_t n);

// loss[0] = scale * sum_i (logsumexp(logits_i) - logits_i[labels_i]); logits: [B, C], labels: [B].
// The loss is f32 whatever T is. Returns the index of the first row whose label is outside [0, C), or -1.
template <typename T>
int64_t cross_entropy_forward_cpu(const T* logits, const int32_t* labels, int64_t batch, int64_t classes,
                                  float scale, float* loss);
// dlogits = scale * grad_loss[0] * (softmax(logits) - onehot(labels)) + beta * dlogits
template <typename T>
void cross_entropy_backward_cpu(const T* logits, const int32_t* labels, int64_t batch, int64_t classes,
                                const float* grad_loss, float scale, float beta, T* dlogits);

// out[r] = index of the first maximum of x[r, :]
template <typename T>
void argmax_rows_cpu(const T* x, int64_t rows, int64_t cols, int32_t* out);
// totals += {batch_loss[0], rows whose argmax (argmax_rows_cpu's rule) equals the label, rows, 1}.
template <typename T>
void classification_tally_cpu(const T* logits, const int32_t* labels, int64_t rows, int64_t cols,
                              const float* batch_loss, ClassificationTotals* totals);

}  // namespace cumulus::kernels

namespace cumulus::kernels {

// ---- optimizer passes over flat arrays (see engine/include/cumulus/optim/*.h for the rules) ----

using optim::FrozenChunks;

// sum_i x[i]^2, accumulated in double.
double sum_squares_cpu(const float* x, int64_t n);
// momentum_buf may be null when momentum == 0. t: this update's number, 1 for the first (the buffer
// is set to g, not blended). Frozen chunks are left alone (Note [Frozen parameters]).
void sgd_step_cpu(float* w, const float* grad, float* momentum_buf, int64_t n, float grad_scale, float lr,
                  float momentum, float dampening, bool nesterov, float weight_decay, int64_t t,
                  const FrozenChunks& frozen);
// t: this update's number, 1 for the first (bias corrections 1 - beta^t).
void adamw_step_cpu(float* w, const float* grad, float* m, float* v, int64_t n, float grad_scale, float lr, float beta1,
                    float beta2, float eps, float weight_decay, int64_t t, const FrozenChunks& frozen);
// Which code runs the 8-bit updates' whole blocks: the widest this CPU runs (best: AVX-512, AVX2 or
// the scalar loop, kernels/cpu/vec_math.h's available()), or the one named, for the tests and
// benchmarks that compare them (a width the CPU does not run, or is capped below, is refused).
// Every one gives the same bits (Note [Vector 8-bit update] in kernels/cpu/optim_8bit_blocks.h).
enum class CpuCode { best, scalar, avx2, avx512 };
// The same two updates with the state in 8 bits (Note [8-bit optimizer state] in
// kernels/quantized_state.h): each block dequantized, the rule above applied, the block requantized.
void sgd_step_8bit_cpu(float* w, const float* grad, const QuantizedState& momentum_buf, int64_t n, float grad_scale,
                       float lr, float momentum, float dampening, bool nesterov, float weight_decay, int64_t t,
                       const FrozenChunks& frozen, CpuCode code = CpuCode::best);
void adamw_step_8bit_cpu(float* w, const float* grad, const QuantizedState& m, const QuantizedState& v, int64_t n,
                         float grad_scale, float lr, float beta1, float beta2, float eps, float weight_decay, int64_t t,
                         const FrozenChunks& frozen, CpuCode code = CpuCode::best);

}  // namespace cumulus::kernels

namespace cumulus::kernels {

// ---- data (see kernels/cpu/data.cpp) ----

// Rows [0, count) of every column's batch from samples order[start + r] (order null: start + r):
// kernels/gather.h's contract.
void gather_rows_cpu(const GatherColumns& columns, const int32_t* order, int64_t start, int64_t count);

}  // namespace cumulus::kernels
