// Op cases (Note [Op cases] in op_case.h): conv2d, batch_norm2d (training and evaluation) and
// max_pool2d, NCHW. The 16-bit cases: x of that type, the weight and bias (and batch norm's
// statistics) f32, as the ops take them.
#include <algorithm>
#include <string>

#include "cumulus/ops/convolution.h"
#include "cumulus/ops/normalization.h"
#include "op_case.h"
#include "references.h"

namespace cumulus::testing {

namespace {

// Errors of a 16-bit x's case: the output (and dx) round to the type; conv2d also multiplies a
// 16-bit copy of the weight (the reference keeps it f32). Sums of at most 27 terms of size <= 1.
void sixteen_bit_tolerances(OpCase& c, DType dtype) {
  c.grad_tolerance = 1e-5;  // f32: also the CPU/CUDA parity's bound for the gradients
  if (dtype == DType::f32) return;
  c.tolerance = dtype == DType::bf16 ? 1e-2 : 2e-3;
  c.grad_tolerance = dtype == DType::bf16 ? 1e-2 : 2e-3;
}

OpCase conv_case(const std::string& name, const ref::ConvDims& d, bool bias, DType dtype = DType::f32) {
  OpCase c;
  c.op = "conv2d";
  c.name = name + "_" + dtype_name(dtype);
  c.inputs = {{{d.n, d.c, d.h, d.w}, dtype}, {{d.k, d.c, d.r, d.s}, DType::f32}};
  if (bias) c.inputs.push_back({{d.k}, DType::f32});
  ops::Conv2dOptions o;
  o.stride_h = d.sh, o.stride_w = d.sw, o.pad_h = d.ph, o.pad_w = d.pw;
  c.forward = [o, bias](const Inputs& t) { return ops::conv2d(t[0], t[1], bias ? t[2] : Tensor(), o); };
  c.reference = [d, bias](const Values& v) { return ref::conv2d(v[0], v[1], bias ? v[2] : ref::Vec(), d); };
  sixteen_bit_tolerances(c, dtype);
  c.flops = d.flops();
  // The CNN's second convolution's sizes (32 -> 64 channels at 14 x 14), micro-batch 16.
  ref::ConvDims b = d;
  b.n = 16, b.c = 32, b.h = 14, b.w = 14, b.k = 64;
  c.bench_shapes = {{b.n, b.c, b.h, b.w}, {b.k, b.c, b.r, b.s}};
  if (bias) c.bench_shapes.push_back({b.k});
  c.bench_flops = b.flops();
  return c;
}

// x [n, c, h, w] in [-2, 3), weight [c] in [0.5, 1.5), bias [c]; with `running`, running_mean [c]
// and running_var [c] in [0.5, 2) as inputs that take no gradient (fresh for every run, so a
// training case's in-place update of them never leaks into another check).
OpCase batch_norm_case(const std::string& name, int64_t n, int64_t ch, int64_t h, int64_t w, bool training,
                       bool running, DType dtype = DType::f32) {
  OpCase c;
  c.op = "batch_norm2d";
  c.name = name + "_" + dtype_name(dtype);
  c.inputs = {{{n, ch, h, w}, dtype, -2, 3}, {{ch}, DType::f32, 0.5, 1.5}, {{ch}, DType::f32}};
  if (running) {
    c.inputs.push_back({{ch}, DType::f32, -1, 1, 0, false});
    c.inputs.push_back({{ch}, DType::f32, 0.5, 2, 0, false});
  }
  ops::BatchNormOptions o;
  o.training = training;
  c.forward = [o, running](const Inputs& t) {
    return ops::batch_norm2d(t[0], t[1], t[2], running ? t[3] : Tensor(), running ? t[4] : Tensor(), Tensor(), o);
  };
  const double eps = o.eps;
  c.reference = [=](const Values& v) {
    if (training) return ref::batch_norm(v[0], v[1], v[2], n, ch, h * w, eps);
    return ref::batch_norm(v[0], v[1], v[2], n, ch, h * w, eps, v[3], v[4]);
  };
  sixteen_bit_tolerances(c, dtype);
  c.bench_shapes = {{16, 64, 28, 28}, {64}, {64}};
  if (running) c.bench_shapes.insert(c.bench_shapes.end(), {{64}, {64}});
  return c;
}

OpCase pool_case(const std::string& name, const ref::PoolDims& d, DType dtype = DType::f32) {
  OpCase c;
  c.op = "max_pool2d";
  c.name = name + "_" + dtype_name(dtype);
  c.inputs = {{{d.n, d.c, d.h, d.w}, dtype}};
  c.forward = [d](const Inputs& t) { return ops::max_pool2d(t[0], d.k, d.s, d.p); };
  c.reference = [d](const Values& v) { return ref::max_pool2d(v[0], d); };
  c.grad_tolerance = 1e-5;
  // The maximum passes through unrounded, and its gradient (exact) too.
  c.bench_shapes = {{16, 64, 28, 28}};
  return c;
}

}  // namespace

CUMULUS_OP_CASES(conv) {
  // {n, c, h, w, k, r, s, stride_h, stride_w, pad_h, pad_w}
  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    cases.push_back(conv_case("conv2d_3x3_pad1", {2, 3, 5, 5, 4, 3, 3, 1, 1, 1, 1}, true, dtype));
  cases.push_back(conv_case("conv2d_2x3_stride2x1_pad1x0_nobias", {2, 2, 6, 5, 3, 2, 3, 2, 1, 1, 0}, false));
  cases.push_back(conv_case("conv2d_3x3_stride2", {2, 2, 6, 6, 3, 3, 3, 2, 2, 0, 0}, true));
  cases.push_back(conv_case("conv2d_1x1", {2, 3, 4, 4, 2, 1, 1, 1, 1, 0, 0}, true));
  // "Same" padding in other shapes (the CPU's columns as shifted planes: kernels/cpu/conv.cpp).
  cases.push_back(conv_case("conv2d_5x5_pad2", {2, 2, 6, 7, 3, 5, 5, 1, 1, 2, 2}, true));
  cases.push_back(conv_case("conv2d_1x3_pad0x1", {2, 2, 4, 6, 3, 1, 3, 1, 1, 0, 1}, false));
  cases.push_back(conv_case("conv2d_3x1_pad1x0", {1, 2, 3, 9, 2, 3, 1, 1, 1, 1, 0}, true));
  // A kernel wider than the plane (a shift past its every column), two samples side by side.
  cases.push_back(conv_case("conv2d_3x5_pad1x2_narrow", {2, 1, 3, 1, 2, 3, 5, 1, 1, 1, 2}, true));

  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    cases.push_back(batch_norm_case("batch_norm2d_training_2x3x5x5", 2, 3, 5, 5, true, true, dtype));
  cases.push_back(batch_norm_case("batch_norm2d_training_untracked_4x2x1x1", 4, 2, 1, 1, true, false));
  for (DType dtype : {DType::f32, DType::bf16})
    cases.push_back(batch_norm_case("batch_norm2d_eval_2x3x4x5", 2, 3, 4, 5, false, true, dtype));
  // A channel constant after rounding to f16 (3000.3 -> 3000), far from 0: its exact output is the
  // bias. Folded as x * scale + (beta - mean * scale), x * scale and mean * scale round alike and
  // the output came out as the bias rounded to their spacing (issue 40): with gamma 1 and a scale
  // of 316 (var 0; evaluation: var 1e-5) that is 1/16, and a bias of 0.47 moved by 0.03.
  for (bool training : {true, false}) {
    OpCase c =
        batch_norm_case(std::string("batch_norm2d_") + (training ? "training" : "eval") + "_constant_channel_2x2x3x3",
                        2, 2, 3, 3, training, true, DType::f16);
    c.inputs[0].edit = [](std::vector<float>& x) {
      for (int64_t i = 0; i < 2; ++i) std::fill_n(x.begin() + (i * 2 + 1) * 9, 9, 3000.3f);
    };
    c.inputs[1].edit = [](std::vector<float>& gamma) { gamma[1] = 1.0f; };
    c.inputs[2].edit = [](std::vector<float>& beta) { beta[1] = 0.47f; };
    if (!training) {  // that channel's running statistics
      c.inputs[3].edit = [](std::vector<float>& m) { m[1] = 3000.0f; };
      c.inputs[4].edit = [](std::vector<float>& v) { v[1] = 1e-5f; };
    }
    cases.push_back(c);
  }

  // {n, c, h, w, kernel, stride, padding}. 16-bit rounding can tie a window's values, where the
  // maximum's gradient is not defined; the 16-bit cases' inputs were checked to have no tie.
  cases.push_back(pool_case("max_pool2d_k2_6x6", {2, 2, 6, 6, 2, 2, 0}));
  cases.push_back(pool_case("max_pool2d_k2_odd_5x7", {2, 2, 5, 7, 2, 2, 0}));
  cases.push_back(pool_case("max_pool2d_k3_stride2_pad1", {2, 2, 5, 5, 3, 2, 1}));
  cases.push_back(pool_case("max_pool2d_k2_stride1", {2, 2, 4, 5, 2, 1, 0}));
  cases.push_back(pool_case("max_pool2d_k2_4x4", {1, 2, 4, 4, 2, 2, 0}, DType::bf16));
  cases.push_back(pool_case("max_pool2d_k2_6x6", {2, 2, 6, 6, 2, 2, 0}, DType::f16));
}

}  // namespace cumulus::testing
