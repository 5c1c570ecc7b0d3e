// Op case (Note [Op cases] in op_case.h): a GPT-2-style model of one block written from the public
// ops as a user would write it in PyTorch, with no reshape around a Linear and no host-built mask:
// token and position embeddings (i64 indices), pre-LayerNorm causal self-attention with the heads as
// views of the qkv projection (split, reshape, permute), the mask from tril, softmax over the last
// dimension, a GELU MLP, residuals, a final LayerNorm, an LM head tied to the token embedding, and
// cross-entropy over [B, T, V] logits with i64 labels. The reference is the same model in double,
// written loop by loop from its definition; the driver checks every parameter's gradient against
// finite differences of it, the case again with strided inputs, and CPU against CUDA.
#include <cmath>
#include <string>

#include "cumulus/ops/attention.h"
#include "cumulus/ops/compare.h"
#include "cumulus/ops/linear.h"
#include "cumulus/ops/loss.h"
#include "cumulus/ops/normalization.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/shape.h"
#include "op_case.h"

namespace cumulus::testing {

namespace {

constexpr int64_t kB = 2, kT = 5, kC = 8, kH = 2, kD = kC / kH, kV = 7;

// The inputs, in order.
enum Input {
  tokens,
  labels,
  ones,
  wte,
  wpe,
  ln1_w,
  ln1_b,
  attn_w,
  attn_b,
  proj_w,
  proj_b,
  ln2_w,
  ln2_b,
  fc_w,
  fc_b,
  fc2_w,
  fc2_b,
  lnf_w,
  lnf_b,
  kInputs
};

// [B, T, C] -> [B, H, T, D]: a view.
Tensor heads(const Tensor& x) { return ops::permute(ops::reshape(x, {kB, kT, kH, kD}), {0, 2, 1, 3}); }

// fused: the attention as ops::scaled_dot_product_attention of the same views (the second case,
// on the same reference: the fused op must give the composition's loss and gradients).
Tensor gpt_block_loss(const Inputs& in, bool fused) {
  const Tensor positions = ops::arange(kT, in[tokens].device());
  Tensor x = ops::embedding(in[tokens], in[wte]) + ops::embedding(positions, in[wpe]);  // [B, T, C]

  const Tensor h = ops::layer_norm(x, Shape{kC}, in[ln1_w], in[ln1_b]);
  const std::vector<Tensor> qkv = ops::split(ops::linear(h, in[attn_w], in[attn_b]), kC, -1);
  const Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
  Tensor heads_out;
  if (fused) {
    heads_out = ops::scaled_dot_product_attention(q, k, v, /*causal=*/true);
  } else {
    Tensor att = ops::matmul(q, ops::transpose(k, -2, -1)) * static_cast<float>(1.0 / std::sqrt(double(kD)));
    const Tensor causal = ops::tril(in[ones]);  // 1 on and below the diagonal
    att = ops::softmax(ops::masked_fill(att, ops::eq(causal, 0.0), -INFINITY), -1);
    heads_out = ops::matmul(att, v);
  }
  const Tensor y = ops::reshape(ops::permute(heads_out, {0, 2, 1, 3}), {kB, kT, kC});
  x = x + ops::linear(y, in[proj_w], in[proj_b]);

  const Tensor h2 = ops::layer_norm(x, Shape{kC}, in[ln2_w], in[ln2_b]);
  x = x + ops::linear(ops::gelu(ops::linear(h2, in[fc_w], in[fc_b])), in[fc2_w], in[fc2_b]);

  const Tensor logits = ops::linear(ops::layer_norm(x, Shape{kC}, in[lnf_w], in[lnf_b]), in[wte], Tensor());
  return ops::cross_entropy(logits, in[labels]);  // the mean over B x T positions
}

// ---- the reference, in double ----
using Mat = std::vector<double>;  // row-major

// rows x n -> rows x n, over each row
Mat layer_norm_ref(const Mat& x, int64_t rows, const Mat& w, const Mat& b) {
  Mat y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < kC; ++c) mean += x[r * kC + c] / kC;
    for (int64_t c = 0; c < kC; ++c) var += (x[r * kC + c] - mean) * (x[r * kC + c] - mean) / kC;
    for (int64_t c = 0; c < kC; ++c) y[r * kC + c] = (x[r * kC + c] - mean) / std::sqrt(var + 1e-5) * w[c] + b[c];
  }
  return y;
}

// x [rows, in] W^T [in, out] + b -> [rows, out]; b empty: none.
Mat linear_ref(const Mat& x, int64_t rows, int64_t in, const Mat& w, const Mat& b, int64_t out) {
  Mat y(static_cast<std::size_t>(rows * out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double acc = b.empty() ? 0.0 : b[o];
      for (int64_t i = 0; i < in; ++i) acc += x[r * in + i] * w[o * in + i];
      y[r * out + o] = acc;
    }
  return y;
}

// Causal attention over qkv [B*T, 3C] -> [B*T, C] (heads concatenated).
Mat attention_ref(const Mat& qkv) {
  Mat y(static_cast<std::size_t>(kB * kT * kC), 0.0);
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t hd = 0; hd < kH; ++hd)
      for (int64_t i = 0; i < kT; ++i) {
        auto at = [&](int64_t t, int64_t part, int64_t d) {
          return qkv[(b * kT + t) * 3 * kC + part * kC + hd * kD + d];
        };
        std::vector<double> p(static_cast<std::size_t>(i + 1));
        double max = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double s = 0;
          for (int64_t d = 0; d < kD; ++d) s += at(i, 0, d) * at(j, 1, d);
          p[j] = s / std::sqrt(double(kD));
          max = std::max(max, p[j]);
        }
        for (int64_t j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - max));
        for (int64_t d = 0; d < kD; ++d) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j) acc += p[j] / sum * at(j, 2, d);
          y[(b * kT + i) * kC + hd * kD + d] = acc;
        }
      }
  return y;
}

std::vector<double> gpt_block_reference(const Values& in) {
  const int64_t rows = kB * kT;
  Mat x(static_cast<std::size_t>(rows * kC));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < kC; ++c)
      x[r * kC + c] = in[wte][static_cast<int64_t>(in[tokens][r]) * kC + c] + in[wpe][(r % kT) * kC + c];
  const Mat qkv = linear_ref(layer_norm_ref(x, rows, in[ln1_w], in[ln1_b]), rows, kC, in[attn_w], in[attn_b], 3 * kC);
  const Mat proj = linear_ref(attention_ref(qkv), rows, kC, in[proj_w], in[proj_b], kC);
  for (std::size_t e = 0; e < x.size(); ++e) x[e] += proj[e];
  Mat fc = linear_ref(layer_norm_ref(x, rows, in[ln2_w], in[ln2_b]), rows, kC, in[fc_w], in[fc_b], 4 * kC);
  for (double& u : fc) u = 0.5 * u * (1.0 + std::erf(u / std::sqrt(2.0)));
  const Mat mlp = linear_ref(fc, rows, 4 * kC, in[fc2_w], in[fc2_b], kC);
  for (std::size_t e = 0; e < x.size(); ++e) x[e] += mlp[e];
  const Mat logits = linear_ref(layer_norm_ref(x, rows, in[lnf_w], in[lnf_b]), rows, kC, in[wte], {}, kV);
  double loss = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double max = -INFINITY, sum = 0;
    for (int64_t v = 0; v < kV; ++v) max = std::max(max, logits[r * kV + v]);
    for (int64_t v = 0; v < kV; ++v) sum += std::exp(logits[r * kV + v] - max);
    loss += max + std::log(sum) - logits[r * kV + static_cast<int64_t>(in[labels][r])];
  }
  return {loss / static_cast<double>(rows)};
}

}  // namespace

CUMULUS_OP_CASES(gpt_block) {
  OpCase c;
  c.op = "cross_entropy";
  c.name = "gpt_block_b2_t5_c8_h2_v7";
  c.inputs.resize(kInputs);
  c.inputs[tokens] = {{kB, kT}, DType::i64, 0, kV};
  c.inputs[labels] = {{kB, kT}, DType::i64, 0, kV};
  c.inputs[ones] = {{kT, kT}, DType::f32, 1, 1};
  c.inputs[ones].grad = false;
  const double w = 0.5;  // weights of a width-8 model's scale: logits of order 1
  c.inputs[wte] = {{kV, kC}, DType::f32, -1, 1};
  c.inputs[wpe] = {{kT, kC}, DType::f32, -w, w};
  for (Input ln : {ln1_w, ln2_w, lnf_w}) c.inputs[ln] = {{kC}, DType::f32, 0.5, 1.5};
  for (Input ln : {ln1_b, ln2_b, lnf_b}) c.inputs[ln] = {{kC}, DType::f32, -0.2, 0.2};
  c.inputs[attn_w] = {{3 * kC, kC}, DType::f32, -w, w};
  c.inputs[attn_b] = {{3 * kC}, DType::f32, -0.1, 0.1};
  c.inputs[proj_w] = {{kC, kC}, DType::f32, -w, w};
  c.inputs[proj_b] = {{kC}, DType::f32, -0.1, 0.1};
  c.inputs[fc_w] = {{4 * kC, kC}, DType::f32, -w, w};
  c.inputs[fc_b] = {{4 * kC}, DType::f32, -0.1, 0.1};
  c.inputs[fc2_w] = {{kC, 4 * kC}, DType::f32, -w / 2, w / 2};
  c.inputs[fc2_b] = {{kC}, DType::f32, -0.1, 0.1};
  c.forward = [](const Inputs& in) { return gpt_block_loss(in, false); };
  c.reference = gpt_block_reference;
  c.tolerance = 1e-5;
  c.grad_tolerance = 1e-4;
  c.inner_ops = {"embedding",   "arange",    "add",        "layer_norm", "linear", "split", "reshape",
                 "permute",     "transpose", "matmul",     "bmm",        "mul",    "tril",  "eq",
                 "masked_fill", "softmax",   "contiguous", "gelu",       "cast"};
  cases.push_back(c);

  c.name = "gpt_block_fused_attention_b2_t5_c8_h2_v7";
  c.forward = [](const Inputs& in) { return gpt_block_loss(in, true); };
  c.inner_ops.push_back("scaled_dot_product_attention");
  cases.push_back(c);
}

}  // namespace cumulus::testing
