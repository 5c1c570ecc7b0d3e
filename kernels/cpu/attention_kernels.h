// CPU launchers of fused attention (engine/ops/attention.cpp, Note [Fused attention] in
// kernels/cpu/attention.cpp). Templated over the storage type T (float, BFloat16, Half), f32
// arithmetic; every tensor but the log-sum-exp (dense) at its strides in `g` (kernels/attention_rules.h).
#pragma once

#include <cstdint>

#include "kernels/attention_rules.h"
#include "kernels/float16.h"

namespace cumulus::kernels {

// out [bh, tq, d] = softmax(scale q k^T (causal: masked above the diagonal)) v, and each row's
// log-sum-exp of the scaled scores, lse [bh, tq] (f32), for the backward.
template <typename T>
void attention_forward_cpu(const AttentionGeometry& g, const T* q, const T* k, const T* v, T* out, float* lse);

// From the upstream gradient dout and the saved out and lse, overwrites dq [bh, tq, d] and dk, dv
// [bh, tk, d] (any of the three may be null: not written; their places must not overlap). `delta` is scratch of bh * tq
// floats, left holding each row's rowsum(dout * out).
template <typename T>
void attention_backward_cpu(const AttentionGeometry& g, const T* q, const T* k, const T* v, const T* out,
                            const float* lse, const T* dout, float* delta, T* dq, T* dk, T* dv);

}  // namespace cumulus::kernels
