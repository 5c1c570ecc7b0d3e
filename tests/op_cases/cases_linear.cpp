// Op cases (Note [Op cases] in op_case.h): linear, the fused linear + relu, and the fused MLP
// training op mlp_cross_entropy.
#include <string>

#include "cumulus/ops/fused_mlp.h"
#include "cumulus/ops/linear.h"
#include "cumulus/ops/loss.h"
#include "cumulus/ops/pointwise.h"
#include "op_case.h"
#include "references.h"

namespace cumulus::testing {

namespace {

struct LinearSpec {
  int64_t B, in, out;
  bool bias = true;
  bool x_grad = true;  // false: x is an input that needs no gradient (only the parameters get one)
};

// linear or linear+relu of x [B, in] (any floating type) with weight [out, in] and bias [out] (f32).
OpCase linear_case(const std::string& name, const LinearSpec& s, DType dtype, ops::Activation act) {
  OpCase c;
  const bool relu = act == ops::Activation::relu;
  c.op = relu ? "linear+relu" : "linear";
  c.name = name + "_" + dtype_name(dtype);
  c.inputs = {{{s.B, s.in}, dtype, -1, 1, 0, s.x_grad}, {{s.out, s.in}, DType::f32}};
  if (s.bias) c.inputs.push_back({{s.out}, DType::f32});
  const bool bias = s.bias;
  c.forward = [bias, act](const Inputs& t) { return ops::linear(t[0], t[1], bias ? t[2] : Tensor(), act); };
  c.reference = [s, relu](const Values& v) {
    const ref::Vec y = ref::linear(v[0], v[1], s.bias ? v[2] : ref::Vec(), s.B, s.in, s.out);
    return relu ? ref::relu(y) : y;
  };
  c.grad_tolerance = 1e-5;  // f32: also the CPU/CUDA parity's bound for the gradients
  if (dtype != DType::f32) {
    // A 16-bit x multiplies a 16-bit copy of the weight (rounded: 2^-9 relative in bf16, 2^-12 in
    // f16) with f32 accumulation, and the output and dx round to x's type; the reference keeps the
    // f32 weight. Sums of at most 7 terms of size <= 1.
    c.tolerance = dtype == DType::bf16 ? 1e-2 : 2e-3;
    c.grad_tolerance = dtype == DType::bf16 ? 1e-2 : 2e-3;
  }
  c.flops = 2.0 * s.B * s.in * s.out;
  const int64_t B = 256, in = 784, out = 512;  // the seed MLP's first layer at micro-batch 256
  c.bench_shapes = {{B, in}, {out, in}};
  if (s.bias) c.bench_shapes.push_back({out});
  c.bench_flops = 2.0 * B * in * out;
  return c;
}

// mlp_cross_entropy over layers of the given widths: inputs x [B, widths[0]], labels [B] (i32 in
// [0, widths.back())), then each layer's weight and bias.
OpCase mlp_case(const std::string& name, int64_t B, const std::vector<int64_t>& widths, ops::Reduction r,
                bool x_grad = true) {
  OpCase c;
  c.op = "mlp_cross_entropy";
  c.name = name;
  c.grad_tolerance = 1e-5;
  const int64_t classes = widths.back();
  c.inputs = {{{B, widths[0]}, DType::f32, -1, 1, 0, x_grad}, {{B}, DType::i32, 0, static_cast<double>(classes)}};
  // Benchmark: the same depth at the seed MLP's widths (784 in, 512 hidden, 10 classes), B = 256.
  std::vector<int64_t> bw(widths.size(), 512);
  bw.front() = 784;
  bw.back() = 10;
  c.bench_shapes = {{256, bw[0]}, {256}};
  for (std::size_t i = 1; i < widths.size(); ++i) {
    c.inputs.push_back({{widths[i], widths[i - 1]}, DType::f32});
    c.inputs.push_back({{widths[i]}, DType::f32});
    c.flops += 2.0 * B * widths[i - 1] * widths[i];
    c.bench_shapes.push_back({bw[i], bw[i - 1]});
    c.bench_shapes.push_back({bw[i]});
    c.bench_flops += 2.0 * 256 * bw[i - 1] * bw[i];
  }
  c.forward = [r](const Inputs& t) {
    std::vector<Tensor> weights, biases;
    for (std::size_t i = 2; i < t.size(); i += 2) {
      weights.push_back(t[i]);
      biases.push_back(t[i + 1]);
    }
    return ops::mlp_cross_entropy(t[0], t[1], weights, biases, r);
  };
  c.reference = [B, widths, r](const Values& v) {
    ref::Vec h = v[0];
    for (std::size_t i = 1; i < widths.size(); ++i) {
      h = ref::linear(h, v[2 * i], v[2 * i + 1], B, widths[i - 1], widths[i]);
      if (i + 1 < widths.size()) h = ref::relu(h);
    }
    return ref::Vec{ref::cross_entropy(h, v[1], widths.back(), r == ops::Reduction::Mean)};
  };
  return c;
}

}  // namespace

CUMULUS_OP_CASES(linear) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    cases.push_back(linear_case("linear_5x7_3_bias", {5, 7, 3}, dtype, ops::Activation::none));
    cases.push_back(linear_case("linear_relu_5x7_6_bias", {5, 7, 6}, dtype, ops::Activation::relu));
  }
  cases.push_back(linear_case("linear_3x7_6_nobias", {3, 7, 6, false}, DType::f32, ops::Activation::none));
  cases.push_back(linear_case("linear_4x5_3_frozen_x", {4, 5, 3, true, false}, DType::f32, ops::Activation::none));
  cases.push_back(linear_case("linear_relu_4x6_5_nobias", {4, 6, 5, false}, DType::f32, ops::Activation::relu));
  cases.push_back(linear_case("linear_relu_3x5_4_frozen_x", {3, 5, 4, true, false}, DType::f32, ops::Activation::relu));

  // The fused MLP: one layer (the head alone), two and three (the seed MLP's depth); the mean and
  // the sum; an x that needs no gradient (the dataset's batch, as in training).
  cases.push_back(mlp_case("mlp_ce_head_only_sum", 4, {6, 3}, ops::Reduction::Sum));
  cases.push_back(mlp_case("mlp_ce_1hidden_mean", 5, {7, 6, 4}, ops::Reduction::Mean));
  cases.push_back(mlp_case("mlp_ce_2hidden_sum", 3, {5, 6, 4, 3}, ops::Reduction::Sum));
  cases.push_back(mlp_case("mlp_ce_2hidden_mean_frozen_x", 4, {5, 6, 4, 3}, ops::Reduction::Mean, false));
}

}  // namespace cumulus::testing
