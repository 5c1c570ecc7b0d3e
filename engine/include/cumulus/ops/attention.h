// Fused scaled dot-product attention (engine/ops/attention.cpp; the algorithm is Note [Fused
// attention] in kernels/cpu/attention.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "cumulus/tensor/tensor.h"

namespace cumulus::ops {

// softmax(scale * q k^T [masked]) v, PyTorch's F.scaled_dot_product_attention without dropout or an
// explicit mask: q [..., Tq, D], k and v [..., Tk, D] with the same leading dimensions (any number,
// none included), one floating dtype (f32, bf16 or f16: computed in f32, stored in the input's
// type) and one device -> [..., Tq, D]: dense, except that a 4-D output [B, H, Tq, D] is laid out
// as [B, Tq, H, D] (PyTorch's layout), so that merging the heads, transpose(1, 2).reshape({B, Tq,
// H * D}), is a view. scale defaults to 1 / sqrt(D). causal: query i
// sees keys j <= i, which needs Tq == Tk (top-left alignment); without it any Tk >= 1 (a decoding
// step: one query against a key/value cache).
// q, k and v may be strided views whose last dimension is dense (the heads of a qkv projection,
// permute(reshape(split(linear(x))))): they are read where they lie, with no copy, and saved as
// they are. Backward recomputes the probabilities from q, k, v and each row's log-sum-exp, so the
// op keeps only its output and Tq floats of log-sum-exp per head: no [Tq, Tk] matrix, forward or
// backward. On CUDA D is at most 128. bf16 and f16 on CUDA run cuDNN's fused attention where this
// build has it and cuda_attention() is cudnn (below); f32, and what cuDNN declines, run our kernels.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false,
                                    std::optional<double> scale = std::nullopt);

// Attention over a packed projection: qkv [B, T, 3 * heads * D] holds q, k and v side by side in its
// last dimension (one Linear's output, as GPT-2's c_attn) -> [B, T, heads * D], the heads merged.
// The values of splitting qkv in three, viewing each as [B, heads, T, D] and calling
// scaled_dot_product_attention, then merging the heads, to the bit; but the backward writes the
// gradients of q, k and v straight into one [B, T, 3C] gradient of qkv, and reads the upstream
// gradient where the next op left it: no copies, where the composition's view backwards transpose
// and scatter each of them (and split's first zero-fills the whole gradient).
Tensor packed_qkv_attention(const Tensor& qkv, int64_t heads, bool causal = false,
                            std::optional<double> scale = std::nullopt);

// Which implementation runs bf16 and f16 attention on CUDA (f32 always runs ours): cuDNN's fused
// scaled-dot-product attention (Note [cuDNN attention] in kernels/cuda/cudnn_attention.cpp), or
// our own kernels. A geometry cuDNN does not take (a head size not a multiple of 8, unaligned
// views, a single key, a graph it declines) runs ours either way.
enum class CudaAttention : uint8_t { cudnn, own };
// Whether this build has cuDNN's fused attention (cuDNN and the cuDNN frontend's headers found).
bool cudnn_attention_compiled();
// The choice in force: set_cuda_attention's if called, else the environment variable
// CUMULUS_CUDA_ATTENTION (cudnn or own; read once), else cudnn where the build has it. Our own
// kernels are attention.cu's row kernels, or with CUMULUS_CUDA_ATTENTION_KERNELS=tiled (read once)
// the register-tiled ones of attention_tiled.cu, which no GPU has run yet.
CudaAttention cuda_attention();
// InvalidArgument for cudnn in a build without it.
void set_cuda_attention(CudaAttention choice);
// What runs `dtype` attention on CUDA under the choice in force, for banners: "cuDNN 9.19.0 fused
// SDPA (frontend 1.18.0)" or "cumulus's own kernels".
std::string cuda_attention_description(DType dtype);
// Calls of the op on CUDA tensors since the start, by the implementation their forward ran on.
struct CudaAttentionCalls {
  int64_t cudnn = 0, own = 0;
};
CudaAttentionCalls cuda_attention_calls();

}  // namespace cumulus::ops
