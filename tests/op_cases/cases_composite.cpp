// Composite op cases (Note [Op cases] in op_case.h; OpCase::inner_ops): a model's blocks in
// miniature, where each op's input is another op's output, so its gradient goes to the engine's
// pending gradient (GradSink::pending) and on through the next op's backward, not into a leaf.
// The single-op cases check each op; these check that they chain.
#include <string>

#include "cumulus/ops/convolution.h"
#include "cumulus/ops/linear.h"
#include "cumulus/ops/loss.h"
#include "cumulus/ops/normalization.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/rotary.h"
#include "cumulus/ops/shape.h"
#include "op_case.h"
#include "references.h"

namespace cumulus::testing {

namespace {

// The seed MLP's shape in miniature: linear -> relu -> linear -> relu -> linear -> cross_entropy
// (Mean); `fused`: each linear -> relu pair is ops::linear(..., Activation::relu).
OpCase mlp_case(bool fused) {
  const int64_t B = 3, in = 5, h1 = 6, h2 = 4, C = 3;
  OpCase c;
  c.op = fused ? "linear+relu" : "linear";
  c.inner_ops =
      fused ? std::vector<std::string>{"linear", "cross_entropy"} : std::vector<std::string>{"relu", "cross_entropy"};
  c.name = fused ? "block_mlp3_fused_ce_mean" : "block_mlp3_ce_mean";
  c.grad_tolerance = 1e-5;
  c.inputs = {{{B, in}, DType::f32},  {{B}, DType::i32, 0, C}, {{h1, in}, DType::f32}, {{h1}, DType::f32},
              {{h2, h1}, DType::f32}, {{h2}, DType::f32},      {{C, h2}, DType::f32},  {{C}, DType::f32}};
  c.forward = [fused](const Inputs& t) {
    auto linear_relu = [fused](const Tensor& x, const Tensor& w, const Tensor& b) {
      return fused ? ops::linear(x, w, b, ops::Activation::relu) : ops::relu(ops::linear(x, w, b));
    };
    const Tensor h = linear_relu(linear_relu(t[0], t[2], t[3]), t[4], t[5]);
    return ops::cross_entropy(ops::linear(h, t[6], t[7]), t[1], ops::Reduction::Mean);
  };
  c.reference = [=](const Values& v) {
    ref::Vec h = ref::relu(ref::linear(v[0], v[2], v[3], B, in, h1));
    h = ref::relu(ref::linear(h, v[4], v[5], B, h1, h2));
    return ref::Vec{ref::cross_entropy(ref::linear(h, v[6], v[7], B, h2, C), v[1], C, true)};
  };
  c.flops = 2.0 * B * (in * h1 + h1 * h2 + h2 * C);
  c.bench_shapes = {{256, 784}, {256}, {512, 784}, {512}, {512, 512}, {512}, {10, 512}, {10}};
  c.bench_flops = 2.0 * 256 * (784 * 512 + 512 * 512 + 512 * 10);
  return c;
}

// relu on a 3-d input -> flatten (a view of relu's output) -> linear -> cross_entropy (Mean).
OpCase relu_flatten_linear_case() {
  const int64_t B = 3, in = 6, out = 4;
  OpCase c;
  c.op = "relu";
  c.inner_ops = {"linear", "cross_entropy"};
  c.name = "block_relu3d_flatten_linear_ce_mean";
  c.grad_tolerance = 1e-5;
  c.inputs = {
      {{B, 2, 3}, DType::f32, -1, 1, 0.05}, {{B}, DType::i32, 0, out}, {{out, in}, DType::f32}, {{out}, DType::f32}};
  c.forward = [](const Inputs& t) {
    return ops::cross_entropy(ops::linear(ops::flatten(ops::relu(t[0]), 1), t[2], t[3]), t[1], ops::Reduction::Mean);
  };
  c.reference = [=](const Values& v) {
    return ref::Vec{ref::cross_entropy(ref::linear(ref::relu(v[0]), v[2], v[3], B, in, out), v[1], out, true)};
  };
  return c;
}

// The CNN's block: conv (pad 1, no bias: before training-mode batch norm a per-channel constant
// cancels, so its gradient would be exactly zero) -> batch norm -> relu -> max pool 2.
OpCase conv_block_case() {
  const ref::ConvDims d{2, 2, 6, 6, 3, 3, 3, 1, 1, 1, 1};
  const ref::PoolDims p{2, 3, 6, 6, 2, 2, 0};
  OpCase c;
  c.op = "conv2d";
  c.inner_ops = {"batch_norm2d", "relu", "max_pool2d"};
  c.name = "block_conv_bn_relu_pool";
  c.grad_tolerance = 1e-5;
  c.inputs = {{{2, 2, 6, 6}, DType::f32}, {{3, 2, 3, 3}, DType::f32}, {{3}, DType::f32, 0.5, 1.5}, {{3}, DType::f32}};
  c.forward = [](const Inputs& t) {
    Tensor h = ops::conv2d(t[0], t[1], Tensor(), 1, 1);
    h = ops::batch_norm2d(h, t[2], t[3], Tensor(), Tensor(), Tensor(), ops::BatchNormOptions{});
    return ops::max_pool2d(ops::relu(h), 2);
  };
  c.reference = [=](const Values& v) {
    const ref::Vec h = ref::batch_norm(ref::conv2d(v[0], v[1], ref::Vec(), d), v[2], v[3], 2, 3, 36, 1e-5);
    return ref::max_pool2d(ref::relu(h), p);
  };
  c.flops = d.flops();
  c.bench_shapes = {{16, 32, 14, 14}, {64, 32, 3, 3}, {64}, {64}};
  c.bench_flops = 2.0 * 16 * 64 * 14 * 14 * 32 * 9;
  return c;
}

}  // namespace

// Rotary position embedding of heads [B, H, T, D] with tables of a longer context (the first T
// rows used), against x cos + rotate_half(x) sin in double with the tables' f32 values. The tables
// are made in the forward (named rotary_tables), so a CUDA run makes its own.
OpCase rotary_case() {
  const int64_t B = 2, H = 2, T = 3, D = 6, context = 5;
  OpCase c;
  c.op = "add";
  c.inner_ops = {"rotary_tables", "narrow", "chunk", "contiguous", "mul", "cat"};
  c.name = "rotary_2x2x3x6";
  c.grad_tolerance = 1e-5;
  c.inputs = {{{B, H, T, D}, DType::f32}};
  c.forward = [](const Inputs& t) {
    const ops::RotaryTables rope = ops::rotary_tables(5, t[0].size(-1), 10000.0, t[0].device());
    return ops::apply_rotary(t[0], rope.cos, rope.sin);
  };
  c.reference = [=](const Values& v) {
    const ops::RotaryTables rope = ops::rotary_tables(context, D);
    const std::vector<float> cos = rope.cos.to_vector<float>(), sin = rope.sin.to_vector<float>();
    ref::Vec y(v[0].size());
    for (std::size_t i = 0; i < y.size(); ++i) {
      const std::size_t j = i % D, t = i / D % T, pair = j < D / 2 ? i + D / 2 : i - D / 2;
      const double rotated = j < D / 2 ? -v[0][pair] : v[0][pair];
      y[i] = v[0][i] * cos[t * D + j] + rotated * sin[t * D + j];
    }
    return y;
  };
  return c;
}

CUMULUS_OP_CASES(composite) {
  cases.push_back(mlp_case(false));
  cases.push_back(mlp_case(true));
  cases.push_back(relu_flatten_linear_case());
  cases.push_back(conv_block_case());
  cases.push_back(rotary_case());
}

}  // namespace cumulus::testing
