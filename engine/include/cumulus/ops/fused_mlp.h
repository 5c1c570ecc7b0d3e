// The fused MLP training op: a stack of Linear layers with ReLU between them, ending in softmax
// cross-entropy, as one op and one autograd node (Note [Fused MLP] in engine/ops/fused_mlp.cpp).
#pragma once

#include <string>
#include <vector>

#include "cumulus/ops/loss.h"

namespace cumulus::ops {

// cross_entropy(L(x), labels, reduction) for L = Linear_n . ReLU . ... . ReLU . Linear_1, with
// Linear_i(h) = h weights[i]^T + biases[i]: x [B, in] f32, weights[i] [out_i, in_i] f32 with
// in_1 = in and in_{i+1} = out_i, biases[i] [out_i] f32, labels [B] i32 or i64 in [0, C) (no
// ignore_index; Sum or Mean) -> the f32 loss scalar.
// Backward writes every needed gradient (x's too, when it requires one) through the gradient
// sinks like the unfused ops. On the CPU it is the unfused ops' arithmetic in their order (the same
// bits); on CUDA a few kernels of our own per micro-batch, deterministic run to run.
Tensor mlp_cross_entropy(const Tensor& x, const Tensor& labels, const std::vector<Tensor>& weights,
                         const std::vector<Tensor>& biases, Reduction reduction = Reduction::Mean);

// Why mlp_cross_entropy would refuse these tensors (the dtype, the device, the number of classes
// on CUDA), or an empty string when it runs them. Shapes are checked by the op itself.
std::string mlp_cross_entropy_unsupported_reason(const Tensor& x, const std::vector<Tensor>& weights);

// Whether a GPU run has measured the op's CUDA kernels correct and faster than the generic path:
// on an H200 (bench/results/2026-11-29-h200/) the seed's 16 x 4 step took 243 us fused against 826
// generic, 64 x 1 104 against 203 (198 and 234, 90 and 103 under CUDA graphs), and the fused cases
// passed. The automatic choice takes them only when this holds.
inline constexpr bool kFusedMlpMeasuredOnGpu = true;

}  // namespace cumulus::ops
