// The convolutional ops, layers and model:
//  - conv2d, batch_norm2d (training and evaluation) and max_pool2d against a double-precision
//    reference written here: forward values, and gradients by central finite differences of the
//    reference compared with the engine's float32 gradients (every case on every device);
//  - CPU-versus-cuDNN parity of values, gradients and running statistics (CUDA only), and the
//    algorithm cache (one entry per shape and direction);
//  - gradients accumulating in the persistent buffers (inside the GEMM / cuDNN), stale overwrite;
//  - batch norm's running statistics and evaluation mode against hand-computed values;
//  - the CNN: PyTorch's state_dict names and order, buffers, train/eval, a safetensors round trip;
//  - batch norm under accumulation: 16 x 4 equals four separate micro-batches of 16, each with its
//    own statistics, and differs from one batch of 64 (which the same model in evaluation mode
//    matches);
//  - the tracker's activation bytes for the CNN against the analytic sum of what its ops save.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cumulus/autograd/grad_mode.h"
#include "cumulus/core/cudnn_context.h"
#include "cumulus/io/safetensors.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/memory/tracker.h"
#include "cumulus/nn/conv_layers.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/ops/conv_ops.h"
#include "cumulus/ops/ops.h"
#include "cumulus/optim/accumulator.h"
#include "cumulus/optim/sgd.h"
#include "cumulus/tensor/random.h"
#include "cumulus/models/cnn.h"
#include "test_util.h"

namespace cumulus {
namespace {

using testing::DeviceTest;
using testing::max_rel_diff;

using Vec = std::vector<double>;
using Vars = std::vector<Vec>;

// ---- the double-precision reference ----------------------------------------------------------

struct ConvDims {
  int n, c, h, w, k, r, s, sh, sw, ph, pw;
  int oh() const { return (h + 2 * ph - r) / sh + 1; }
  int ow() const { return (w + 2 * pw - s) / sw + 1; }
};

Vec ref_conv2d(const Vec& x, const Vec& wt, const Vec& b, const ConvDims& d) {
  const int oh = d.oh(), ow = d.ow();
  Vec y(std::size_t(d.n) * d.k * oh * ow);
  for (int n = 0; n < d.n; ++n)
    for (int k = 0; k < d.k; ++k)
      for (int i = 0; i < oh; ++i)
        for (int j = 0; j < ow; ++j) {
          double s = b.empty() ? 0.0 : b[k];
          for (int c = 0; c < d.c; ++c)
            for (int u = 0; u < d.r; ++u)
              for (int v = 0; v < d.s; ++v) {
                const int hi = i * d.sh - d.ph + u, wi = j * d.sw - d.pw + v;
                if (hi < 0 || hi >= d.h || wi < 0 || wi >= d.w) continue;
                s += x[((n * d.c + c) * d.h + hi) * d.w + wi] * wt[((k * d.c + c) * d.r + u) * d.s + v];
              }
          y[((n * d.k + k) * oh + i) * ow + j] = s;
        }
  return y;
}

// Batch statistics (biased variance) when mean/var are empty; otherwise the given running ones.
Vec ref_batch_norm(const Vec& x, const Vec& g, const Vec& b, int n, int c, int hw, double eps,
                   const Vec& running_mean = {}, const Vec& running_var = {}) {
  Vec y(x.size());
  for (int ch = 0; ch < c; ++ch) {
    double mean = 0, var = 0;
    if (running_mean.empty()) {
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < hw; ++j) mean += x[(i * c + ch) * hw + j];
      mean /= n * hw;
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < hw; ++j) var += std::pow(x[(i * c + ch) * hw + j] - mean, 2);
      var /= n * hw;
    } else {
      mean = running_mean[ch];
      var = running_var[ch];
    }
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < hw; ++j) {
        const std::size_t k = std::size_t((i * c + ch) * hw + j);
        y[k] = g[ch] * (x[k] - mean) / std::sqrt(var + eps) + b[ch];
      }
  }
  return y;
}

struct PoolDims {
  int n, c, h, w, k, s, p;
  int oh() const { return (h + 2 * p - k) / s + 1; }
  int ow() const { return (w + 2 * p - k) / s + 1; }
};

Vec ref_max_pool(const Vec& x, const PoolDims& d) {
  Vec y(std::size_t(d.n) * d.c * d.oh() * d.ow());
  for (int pl = 0; pl < d.n * d.c; ++pl)
    for (int i = 0; i < d.oh(); ++i)
      for (int j = 0; j < d.ow(); ++j) {
        double m = -INFINITY;
        for (int u = 0; u < d.k; ++u)
          for (int v = 0; v < d.k; ++v) {
            const int hi = i * d.s - d.p + u, wi = j * d.s - d.p + v;
            if (hi >= 0 && hi < d.h && wi >= 0 && wi < d.w) m = std::max(m, x[(pl * d.h + hi) * d.w + wi]);
          }
        y[(pl * d.oh() + i) * d.ow() + j] = m;
      }
  return y;
}

Vec ref_relu(Vec x) {
  for (double& v : x) v = std::max(v, 0.0);
  return x;
}

// x: [B, in] (any layout of B * in values), w: [out, in], b: [out] -> [B, out]
Vec ref_linear(const Vec& x, const Vec& w, const Vec& b, int B, int in, int out) {
  Vec y(std::size_t(B) * out);
  for (int i = 0; i < B; ++i)
    for (int o = 0; o < out; ++o) {
      double s = b[o];
      for (int k = 0; k < in; ++k) s += x[i * in + k] * w[o * in + k];
      y[i * out + o] = s;
    }
  return y;
}

double ref_cross_entropy_sum(const Vec& logits, const std::vector<int32_t>& labels, int C) {
  double total = 0;
  for (std::size_t i = 0; i < labels.size(); ++i) {
    double m = -INFINITY, s = 0;
    for (int c = 0; c < C; ++c) m = std::max(m, logits[i * C + c]);
    for (int c = 0; c < C; ++c) s += std::exp(logits[i * C + c] - m);
    total += m + std::log(s) - logits[i * C + labels[i]];
  }
  return total;
}

std::vector<float> random_values(std::size_t n, Generator& g, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(n);
  g.fill_uniform(v.data(), static_cast<int64_t>(n), lo, hi);
  return v;
}

std::vector<int32_t> random_labels(int B, int C, Generator& g) {
  std::vector<float> u(B);
  g.fill_uniform(u.data(), B, 0.0f, float(C));
  std::vector<int32_t> y(B);
  for (int i = 0; i < B; ++i) y[i] = std::min(C - 1, int32_t(u[i]));
  return y;
}

// ---- the finite-difference harness -----------------------------------------------------------
// Each case ends in the same head, so the op under test sees a gradient that differs element by
// element and sample by sample (batch norm's input gradient vanishes under a plain sum):
//   loss = cross_entropy(linear(flatten(op(...)), head_w, head_b), labels, Sum)
// The head's weight and bias are inputs too (checked as well).

struct Input {
  Shape shape;
  std::vector<float> values;
};

using EngineFn = std::function<Tensor(const std::vector<Tensor>&)>;
using RefFn = std::function<double(const Vars&)>;

struct Case {
  std::string name;
  std::vector<Input> inputs;
  EngineFn engine;
  RefFn ref;
};

struct GradResult {
  float loss = 0;
  std::vector<std::vector<float>> grads;
};

GradResult run_engine(const Case& c, Device device) {
  std::vector<Tensor> leaves;
  for (const Input& in : c.inputs) {
    Tensor t = Tensor::from_vector(in.values, in.shape, device);
    t.set_requires_grad(true);
    leaves.push_back(t);
  }
  Tensor loss = c.engine(leaves);
  GradResult r;
  EXPECT_EQ(loss.numel(), 1);
  r.loss = loss.item();
  loss.backward();
  for (const Tensor& t : leaves) {
    Tensor g = t.grad();
    EXPECT_TRUE(g.defined()) << "no gradient reached an input";
    r.grads.push_back(g.defined() ? g.to_vector<float>() : std::vector<float>(t.numel(), NAN));
  }
  return r;
}

void check_gradients(const Case& c, Device device, double tol = 1e-4) {
  SCOPED_TRACE(c.name);
  Vars x;
  for (const Input& in : c.inputs) x.emplace_back(in.values.begin(), in.values.end());
  const GradResult r = run_engine(c, device);
  const double ref_loss = c.ref(x);
  EXPECT_NEAR(r.loss, ref_loss, 1e-5 * std::max(1.0, std::fabs(ref_loss))) << "forward value";
  const double h = 1e-6;
  for (std::size_t i = 0; i < x.size(); ++i) {
    std::vector<float> fd(x[i].size());
    for (std::size_t k = 0; k < x[i].size(); ++k) {
      Vars xp = x, xm = x;
      xp[i][k] += h;
      xm[i][k] -= h;
      fd[k] = float((c.ref(xp) - c.ref(xm)) / (2 * h));
    }
    double scale = 0;
    for (float v : fd) scale = std::max(scale, double(std::fabs(v)));
    EXPECT_GT(scale, 1e-3) << "input " << i << ": the reference gradient is ~0, the check would be empty";
    const double err = max_rel_diff(r.grads[i], fd);
    EXPECT_LT(err, tol) << "input " << i << " (" << c.inputs[i].shape.str()
                        << "): analytic vs finite differences, max error relative to max |ref| = " << err;
  }
}

constexpr int kClasses = 3;

// Builds a case from the op's engine and reference forms; the head (inputs[n_op], inputs[n_op+1])
// and the labels are added here. `features` = numel of the op's output / batch.
Case with_head(std::string name, std::vector<Input> op_inputs, int batch, int features,
               std::function<Tensor(const std::vector<Tensor>&)> op,
               std::function<Vec(const Vars&)> ref_op, Generator& g) {
  const std::size_t n_op = op_inputs.size();
  const auto labels = random_labels(batch, kClasses, g);
  op_inputs.push_back({{kClasses, features}, random_values(std::size_t(kClasses) * features, g, -0.5f, 0.5f)});
  op_inputs.push_back({{kClasses}, random_values(kClasses, g)});
  Case c;
  c.name = std::move(name);
  c.inputs = std::move(op_inputs);
  c.engine = [=](const std::vector<Tensor>& t) {
    Tensor h = ops::flatten(op(t), 1);
    Tensor y = Tensor::from_vector(labels, {batch}, t[0].device());
    return ops::cross_entropy(ops::linear(h, t[n_op], t[n_op + 1]), y, ops::Reduction::Sum);
  };
  c.ref = [=](const Vars& v) {
    return ref_cross_entropy_sum(ref_linear(ref_op(v), v[n_op], v[n_op + 1], batch, features, kClasses), labels,
                                 kClasses);
  };
  return c;
}

Case conv_case(const std::string& name, const ConvDims& d, bool bias, Generator& g) {
  std::vector<Input> in = {{{d.n, d.c, d.h, d.w}, random_values(std::size_t(d.n) * d.c * d.h * d.w, g)},
                           {{d.k, d.c, d.r, d.s}, random_values(std::size_t(d.k) * d.c * d.r * d.s, g)}};
  if (bias) in.push_back({{d.k}, random_values(d.k, g)});
  ops::Conv2dOptions o;
  o.stride_h = d.sh, o.stride_w = d.sw, o.pad_h = d.ph, o.pad_w = d.pw;
  return with_head(
      name, in, d.n, d.k * d.oh() * d.ow(),
      [=](const std::vector<Tensor>& t) { return ops::conv2d(t[0], t[1], bias ? t[2] : Tensor(), o); },
      [=](const Vars& v) { return ref_conv2d(v[0], v[1], bias ? v[2] : Vec(), d); }, g);
}

Case batch_norm_case(const std::string& name, int n, int c, int h, int w, bool training, Generator& g) {
  std::vector<Input> in = {{{n, c, h, w}, random_values(std::size_t(n) * c * h * w, g, -2.0f, 3.0f)},
                           {{c}, random_values(c, g, 0.5f, 1.5f)},
                           {{c}, random_values(c, g)}};
  const std::vector<float> rm = random_values(c, g), rv = random_values(c, g, 0.5f, 2.0f);
  ops::BatchNormOptions o;
  o.training = training;
  return with_head(
      name, in, n, c * h * w,
      [=](const std::vector<Tensor>& t) {
        const Device d = t[0].device();
        // Fresh running statistics each call: training updates them in place.
        Tensor mean = Tensor::from_vector(rm, {c}, d), var = Tensor::from_vector(rv, {c}, d);
        return ops::batch_norm2d(t[0], t[1], t[2], mean, var, Tensor(), o);
      },
      [=](const Vars& v) {
        if (training) return ref_batch_norm(v[0], v[1], v[2], n, c, h * w, o.eps);
        return ref_batch_norm(v[0], v[1], v[2], n, c, h * w, o.eps, Vec(rm.begin(), rm.end()),
                              Vec(rv.begin(), rv.end()));
      },
      g);
}

Case pool_case(const std::string& name, const PoolDims& d, Generator& g) {
  std::vector<Input> in = {{{d.n, d.c, d.h, d.w}, random_values(std::size_t(d.n) * d.c * d.h * d.w, g)}};
  return with_head(
      name, in, d.n, d.c * d.oh() * d.ow(),
      [=](const std::vector<Tensor>& t) { return ops::max_pool2d(t[0], d.k, d.s, d.p); },
      [=](const Vars& v) { return ref_max_pool(v[0], d); }, g);
}

// The CNN's block in miniature: conv(pad 1) -> batch norm -> relu -> max pool 2. The conv has no
// bias here: before training-mode batch norm a per-channel constant cancels, so its gradient is
// exactly zero and a finite-difference check of it would be empty.
Case block_case(Generator& g) {
  const ConvDims d{2, 2, 6, 6, 3, 3, 3, 1, 1, 1, 1};
  const PoolDims p{2, 3, 6, 6, 2, 2, 0};
  std::vector<Input> in = {{{2, 2, 6, 6}, random_values(144, g)},
                           {{3, 2, 3, 3}, random_values(54, g)},
                           {{3}, random_values(3, g, 0.5f, 1.5f)},
                           {{3}, random_values(3, g)}};
  return with_head(
      "conv_bn_relu_pool", in, 2, 3 * 3 * 3,
      [](const std::vector<Tensor>& t) {
        Tensor h = ops::conv2d(t[0], t[1], Tensor(), 1, 1);
        h = ops::batch_norm2d(h, t[2], t[3], Tensor(), Tensor(), Tensor(), ops::BatchNormOptions{});
        return ops::max_pool2d(ops::relu(h), 2);
      },
      [=](const Vars& v) {
        const Vec h = ref_batch_norm(ref_conv2d(v[0], v[1], Vec(), d), v[2], v[3], 2, 3, 36, 1e-5);
        return ref_max_pool(ref_relu(h), p);
      },
      g);
}

std::vector<Case> make_cases(uint64_t seed) {
  Generator g(seed);
  std::vector<Case> cases;
  cases.push_back(conv_case("conv3x3_pad1", {2, 3, 5, 5, 4, 3, 3, 1, 1, 1, 1}, true, g));
  cases.push_back(conv_case("conv2x3_stride2x1_pad1x0_nobias", {2, 2, 6, 5, 3, 2, 3, 2, 1, 1, 0}, false, g));
  cases.push_back(conv_case("conv3x3_stride2", {2, 2, 6, 6, 3, 3, 3, 2, 2, 0, 0}, true, g));
  cases.push_back(conv_case("conv1x1", {2, 3, 4, 4, 2, 1, 1, 1, 1, 0, 0}, true, g));
  cases.push_back(batch_norm_case("batch_norm_training", 2, 3, 5, 5, true, g));
  cases.push_back(batch_norm_case("batch_norm_training_1x1_spatial", 4, 2, 1, 1, true, g));
  cases.push_back(batch_norm_case("batch_norm_eval", 2, 3, 4, 5, false, g));
  cases.push_back(pool_case("max_pool2", {2, 2, 6, 6, 2, 2, 0}, g));
  cases.push_back(pool_case("max_pool2_odd_input", {2, 2, 5, 7, 2, 2, 0}, g));
  cases.push_back(pool_case("max_pool3_stride2_pad1", {2, 2, 5, 5, 3, 2, 1}, g));
  cases.push_back(block_case(g));
  return cases;
}

class CnnOpsTest : public DeviceTest {};

TEST_P(CnnOpsTest, GradientsMatchFiniteDifferences) {
  for (const Case& c : make_cases(11)) check_gradients(c, device());
}

TEST_P(CnnOpsTest, GradientsMatchFiniteDifferencesOtherSeed) {
  for (const Case& c : make_cases(5)) check_gradients(c, device());
}

TEST_P(CnnOpsTest, ForwardShapesAndArgumentChecks) {
  const Device d = device();
  Generator g(2);
  Tensor x = Tensor::from_vector(random_values(2 * 3 * 7 * 9, g), {2, 3, 7, 9}, d);
  Tensor w = Tensor::from_vector(random_values(4 * 3 * 3 * 3, g), {4, 3, 3, 3}, d);
  EXPECT_EQ(ops::conv2d(x, w, Tensor()).shape(), Shape({2, 4, 5, 7}));
  EXPECT_EQ(ops::conv2d(x, w, Tensor(), 1, 1).shape(), Shape({2, 4, 7, 9}));
  EXPECT_EQ(ops::conv2d(x, w, Tensor(), 2, 1).shape(), Shape({2, 4, 4, 5}));
  EXPECT_EQ(ops::max_pool2d(x, 2).shape(), Shape({2, 3, 3, 4}));
  EXPECT_EQ(ops::max_pool2d(x, 3, 2, 1).shape(), Shape({2, 3, 4, 5}));

  EXPECT_THROW(ops::conv2d(x.reshape({6, 7, 9}), w, Tensor()), ShapeError);
  EXPECT_THROW(ops::conv2d(x, Tensor::zeros({4, 2, 3, 3}, DType::f32, d), Tensor()), ShapeError);
  EXPECT_THROW(ops::conv2d(x, w, Tensor::zeros({3}, DType::f32, d)), ShapeError);
  EXPECT_THROW(ops::conv2d(x, w, Tensor(), 0, 0), InvalidArgument);
  EXPECT_THROW(ops::conv2d(x, Tensor::zeros({4, 3, 8, 3}, DType::f32, d), Tensor()), ShapeError);
  EXPECT_THROW(ops::max_pool2d(x, 2, 2, 2), InvalidArgument) << "padding past half the kernel";
  const Tensor ones = Tensor::full({3}, 1.0f, d), zeros = Tensor::zeros({3}, DType::f32, d);
  EXPECT_THROW(ops::batch_norm2d(x, ones, zeros, zeros, Tensor(), Tensor(), {}), InvalidArgument);
  ops::BatchNormOptions eval;
  eval.training = false;
  EXPECT_THROW(ops::batch_norm2d(x, ones, zeros, Tensor(), Tensor(), Tensor(), eval), InvalidArgument)
      << "evaluation needs running statistics";
  EXPECT_THROW(ops::batch_norm2d(Tensor::zeros({1, 3, 1, 1}, DType::f32, d), ones, zeros, Tensor(), Tensor(),
                                 Tensor(), {}),
               ShapeError)
      << "one value per channel cannot be normalized in training";
  EXPECT_THROW(ops::batch_norm2d(x, Tensor::full({2}, 1.0f, d), zeros, Tensor(), Tensor(), Tensor(), {}), ShapeError);
}

TEST_P(CnnOpsTest, MaxPoolRoutesGradientsToTheFirstMaximumAndPropagatesNaN) {
  const Device d = device();
  // One 2x2 window per plane: ties go to the first maximum (CPU rule; cuDNN's is its own, so the
  // tie case runs on the CPU only).
  // Kernel 2 stride 2 (the CPU's fast path) and kernel 2 stride 1 (its general path).
  for (int64_t stride : {2, 1}) {
    SCOPED_TRACE("stride " + std::to_string(stride));
    if (d.is_cpu()) {
      Tensor x = Tensor::from_vector<float>({1, 5, 5, 2}, {1, 1, 2, 2}, d);
      x.set_requires_grad(true);
      Tensor y = ops::max_pool2d(x, 2, stride);
      EXPECT_EQ(y.to_vector<float>(), std::vector<float>{5});
      ops::sum(y).backward();
      EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{0, 1, 0, 0}));
    }
    Tensor n = Tensor::from_vector<float>({1, NAN, 3, 2, -1, -2, -3, -4}, {1, 2, 2, 2}, d);
    const auto y = ops::max_pool2d(n, 2, stride).to_vector<float>();
    EXPECT_TRUE(std::isnan(y[0])) << "a NaN in the window is its maximum";
    EXPECT_EQ(y[1], -1.0f);
  }
}

// ---- parity: CUDA (cuDNN) against the CPU ----------------------------------------------------

TEST_P(CnnOpsTest, CudnnMatchesTheCpu) {
  if (device().is_cpu()) GTEST_SKIP() << "compares CUDA with the CPU";
  if (!cudnn_compiled()) GTEST_SKIP() << "built without cuDNN";
  for (const Case& c : make_cases(23)) {
    SCOPED_TRACE(c.name);
    const GradResult cpu = run_engine(c, Device::cpu());
    const GradResult gpu = run_engine(c, device());
    EXPECT_NEAR(gpu.loss, cpu.loss, 1e-5 * std::max(1.0f, std::fabs(cpu.loss)));
    for (std::size_t i = 0; i < cpu.grads.size(); ++i)
      EXPECT_LT(max_rel_diff(gpu.grads[i], cpu.grads[i]), 1e-5) << "input " << i;
  }
  // Running statistics and num_batches_tracked after two training forwards, then evaluation.
  Generator g(4);
  const auto xv = random_values(4 * 3 * 5 * 5, g, -1.0f, 2.0f);
  std::vector<std::vector<float>> stats[2];
  for (int side = 0; side < 2; ++side) {
    const Device d = side == 0 ? Device::cpu() : device();
    nn::BatchNorm2d bn(3, d);
    Tensor x = Tensor::from_vector(xv, {4, 3, 5, 5}, d);
    bn(x);
    bn(x);
    bn.eval();
    stats[side] = {bn.running_mean().to_vector<float>(), bn.running_var().to_vector<float>(), bn(x).to_vector<float>()};
    EXPECT_EQ(bn.num_batches_tracked().to_vector<int32_t>(), std::vector<int32_t>{2});
  }
  for (int k = 0; k < 3; ++k) EXPECT_LT(max_rel_diff(stats[1][k], stats[0][k]), 1e-5) << "statistic " << k;

#if CUMULUS_WITH_CUDNN
  // One algorithm choice per shape and direction: repeating a shape adds no cache entry.
  Tensor x = Tensor::from_vector(random_values(2 * 3 * 9 * 9, g), {2, 3, 9, 9}, device());
  Tensor w = Tensor::from_vector(random_values(5 * 3 * 3 * 3, g), {5, 3, 3, 3}, device());
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  ops::sum(ops::conv2d(x, w, Tensor(), 1, 1)).backward();
  const std::size_t entries = cudnn::conv_algorithm_cache_size();
  for (int i = 0; i < 3; ++i) ops::sum(ops::conv2d(x, w, Tensor(), 1, 1)).backward();
  EXPECT_EQ(cudnn::conv_algorithm_cache_size(), entries);
#endif
}

// ---- accumulation into the persistent buffers -------------------------------------------------

TEST_P(CnnOpsTest, ParameterGradientsAccumulateAndStaleBuffersAreOverwritten) {
  const Device d = device();
  Generator gen(9);
  nn::Conv2d conv(2, 3, 3, gen, d, 1, 1);
  nn::BatchNorm2d bn(3, d);
  const Tensor x = Tensor::from_vector(random_values(2 * 2 * 6 * 6, gen), {2, 2, 6, 6}, d);
  const Tensor head = Tensor::from_vector(random_values(3 * 3 * 3 * 3, gen), {3, 27}, d);
  const Tensor labels = Tensor::from_vector<int32_t>({0, 2}, {2}, d);
  auto loss = [&] {
    Tensor h = ops::max_pool2d(ops::relu(bn(conv(x))), 2);
    return ops::cross_entropy(ops::linear(ops::flatten(h, 1), head, Tensor()), labels, ops::Reduction::Sum);
  };
  std::vector<Tensor> params = conv.parameters();
  for (const Tensor& p : bn.parameters()) params.push_back(p);
  std::vector<const void*> addresses;
  for (const Tensor& p : params) addresses.push_back(p.grad_buffer().raw_data());

  loss().backward();
  std::vector<std::vector<float>> once;
  for (const Tensor& p : params) once.push_back(p.grad().to_vector<float>());
  loss().backward();
  for (std::size_t i = 0; i < params.size(); ++i) {
    std::vector<float> twice_expected = once[i];
    for (float& v : twice_expected) v *= 2.0f;
    EXPECT_LT(max_rel_diff(params[i].grad().to_vector<float>(), twice_expected), 1e-5) << "param " << i;
    EXPECT_EQ(params[i].grad_buffer().raw_data(), addresses[i]) << "the buffer never moves";
  }
  // Poison the buffers and mark them stale: the next backward must overwrite without reading.
  for (const Tensor& p : params) {
    p.grad_buffer().copy_from(Tensor::full(p.shape(), NAN));
    p.mark_grad_stale();
  }
  loss().backward();
  for (std::size_t i = 0; i < params.size(); ++i)
    EXPECT_LT(max_rel_diff(params[i].grad().to_vector<float>(), once[i]), 1e-6) << "param " << i;
}

// ---- batch norm's statistics by hand ----------------------------------------------------------

TEST_P(CnnOpsTest, BatchNormRunningStatisticsMatchHandComputedValues) {
  const Device d = device();
  nn::BatchNorm2d bn(2, d);  // momentum 0.1, eps 1e-5
  EXPECT_EQ(bn.running_mean().to_vector<float>(), (std::vector<float>{0, 0}));
  EXPECT_EQ(bn.running_var().to_vector<float>(), (std::vector<float>{1, 1}));
  EXPECT_EQ(bn.num_batches_tracked().dtype(), DType::i32);
  EXPECT_EQ(bn.num_batches_tracked().to_vector<int32_t>(), std::vector<int32_t>{0});
  // x: [2, 2, 1, 2]. Channel 0 holds 1, 3, 5, 7: mean 4, biased var 5, unbiased 20/3.
  // Channel 1 holds 2, 2, -2, 6: mean 2, biased var 8, unbiased 32/3.
  const std::vector<float> xv = {1, 3, 2, 2, 5, 7, -2, 6};
  Tensor x = Tensor::from_vector(xv, {2, 2, 1, 2}, d);
  const Tensor y = bn(x);
  // Training normalizes with the batch statistics (biased variance).
  const double eps = 1e-5;
  const std::vector<double> expected_y = {(1 - 4) / std::sqrt(5 + eps), (3 - 4) / std::sqrt(5 + eps),
                                          0.0,                          0.0,
                                          (5 - 4) / std::sqrt(5 + eps), (7 - 4) / std::sqrt(5 + eps),
                                          -4 / std::sqrt(8 + eps),      4 / std::sqrt(8 + eps)};
  const auto yv = y.to_vector<float>();
  for (std::size_t i = 0; i < yv.size(); ++i) EXPECT_NEAR(yv[i], expected_y[i], 1e-6) << i;
  // running = 0.9 running + 0.1 statistic (unbiased variance for running_var).
  auto expect_near = [](const std::vector<float>& got, const std::vector<double>& want, const char* what) {
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << what << "[" << i << "]";
  };
  expect_near(bn.running_mean().to_vector<float>(), {0.4, 0.2}, "running_mean after 1");
  expect_near(bn.running_var().to_vector<float>(), {0.9 + 0.1 * 20 / 3.0, 0.9 + 0.1 * 32 / 3.0}, "running_var after 1");
  bn(x);
  const double rm0 = 0.9 * 0.4 + 0.4, rm1 = 0.9 * 0.2 + 0.2;
  const double rv0 = 0.9 * (0.9 + 0.1 * 20 / 3.0) + 0.1 * 20 / 3.0, rv1 = 0.9 * (0.9 + 0.1 * 32 / 3.0) + 0.1 * 32 / 3.0;
  expect_near(bn.running_mean().to_vector<float>(), {rm0, rm1}, "running_mean after 2");  // 0.76, 0.38
  expect_near(bn.running_var().to_vector<float>(), {rv0, rv1}, "running_var after 2");    // 2.0767, 2.8367
  EXPECT_EQ(bn.num_batches_tracked().to_vector<int32_t>(), std::vector<int32_t>{2});

  // Evaluation normalizes with the running statistics and updates nothing.
  bn.eval();
  EXPECT_FALSE(bn.is_training());
  const auto ye = bn(x).to_vector<float>();
  for (std::size_t i = 0; i < ye.size(); ++i) {
    const int ch = int(i / 2) % 2;
    const double want = (xv[i] - (ch == 0 ? rm0 : rm1)) / std::sqrt((ch == 0 ? rv0 : rv1) + eps);
    EXPECT_NEAR(ye[i], want, 1e-6) << i;
  }
  expect_near(bn.running_mean().to_vector<float>(), {rm0, rm1}, "running_mean after eval");
  EXPECT_EQ(bn.num_batches_tracked().to_vector<int32_t>(), std::vector<int32_t>{2});
  // Training again under NoGradGuard still updates (as PyTorch): grad mode and module mode are separate.
  bn.train();
  {
    NoGradGuard no_grad;
    bn(x);
  }
  EXPECT_EQ(bn.num_batches_tracked().to_vector<int32_t>(), std::vector<int32_t>{3});
}

// ---- the model --------------------------------------------------------------------------------

class CnnModelTest : public DeviceTest {};

TEST_P(CnnModelTest, StateDictHasPyTorchNamesParametersThenBuffersPerModule) {
  Generator gen(0);
  models::CNN model(gen, device());
  const std::vector<std::pair<std::string, Shape>> want = {
      {"0.weight", {32, 1, 3, 3}}, {"0.bias", {32}},
      {"1.weight", {32}},          {"1.bias", {32}},
      {"1.running_mean", {32}},    {"1.running_var", {32}},
      {"1.num_batches_tracked", {}},
      {"4.weight", {64, 32, 3, 3}}, {"4.bias", {64}},
      {"5.weight", {64}},          {"5.bias", {64}},
      {"5.running_mean", {64}},    {"5.running_var", {64}},
      {"5.num_batches_tracked", {}},
      {"9.weight", {128, 3136}},   {"9.bias", {128}},
      {"11.weight", {10, 128}},    {"11.bias", {10}}};
  const auto sd = model.state_dict();
  ASSERT_EQ(sd.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(sd[i].first, want[i].first) << i;
    EXPECT_EQ(sd[i].second.shape(), want[i].second) << want[i].first;
    EXPECT_EQ(sd[i].second.device(), device()) << want[i].first;
  }
  const auto params = model.named_parameters();
  ASSERT_EQ(params.size(), 12u) << "buffers are not parameters";
  for (const auto& [name, t] : params) EXPECT_EQ(name.find("running"), std::string::npos) << name;
  EXPECT_EQ(model.named_buffers().size(), 6u);
  EXPECT_EQ(model.num_parameters(), 421834) << "PyTorch's count for the same nn.Sequential";
  for (const auto& [name, t] : model.named_buffers()) {
    EXPECT_FALSE(t.requires_grad()) << name;
    EXPECT_EQ(t.memory_category(), MemoryCategory::parameters) << name;
  }
  // train()/eval() reach every child.
  model.eval();
  for (std::size_t i = 0; i < model.size(); ++i) EXPECT_FALSE(model[i].is_training()) << i;
  model.train();
  for (std::size_t i = 0; i < model.size(); ++i) EXPECT_TRUE(model[i].is_training()) << i;
}

TEST_P(CnnModelTest, ForwardShapesAndSafetensorsRoundTrip) {
  Generator gen(1);
  models::CNN model(gen, device());
  Generator data_gen(2);
  const Tensor x = Tensor::from_vector(random_values(3 * 784, data_gen, 0.0f, 1.0f), {3, 784}, device());
  const Tensor logits = model(x);  // training mode: also moves the running statistics
  EXPECT_EQ(logits.shape(), Shape({3, 10}));
  EXPECT_EQ(model(x.reshape({3, 28, 28})).shape(), Shape({3, 10}));
  EXPECT_EQ(model(x.reshape({3, 1, 28, 28})).shape(), Shape({3, 10}));
  EXPECT_THROW(model(x.reshape({3, 28, 1, 28})), ShapeError);
  model.eval();
  std::vector<float> before;
  {
    NoGradGuard no_grad;
    before = model(x).to_vector<float>();
  }
  const std::string path = ::testing::TempDir() + "cumulus_cnn_roundtrip.safetensors";
  io::save_safetensors(path, model.state_dict());
  Generator other(99);
  models::CNN loaded(other, device());
  const auto contents = io::load_safetensors(path, device());
  auto sd = loaded.state_dict();
  ASSERT_EQ(contents.tensors.size(), sd.size());
  for (auto& [name, t] : sd) {
    auto it = std::find_if(contents.tensors.begin(), contents.tensors.end(),
                           [&](const auto& e) { return e.first == name; });
    ASSERT_NE(it, contents.tensors.end()) << name;
    ASSERT_EQ(it->second.dtype(), t.dtype()) << name;
    t.copy_from(it->second);
  }
  std::remove(path.c_str());
  EXPECT_EQ(loaded.state_dict()[6].second.to_vector<int32_t>(), std::vector<int32_t>{3})
      << "1.num_batches_tracked: three training forwards";
  loaded.eval();
  NoGradGuard no_grad;
  EXPECT_EQ(loaded(x).to_vector<float>(), before) << "the same weights and statistics give the same logits";
}

// ---- batch norm under gradient accumulation ----------------------------------------------------

struct Batch {
  Tensor x, y;
};

Batch make_batch(int64_t n, uint64_t seed, Device device) {
  Generator g(seed);
  std::vector<int32_t> y(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) y[static_cast<std::size_t>(i)] = static_cast<int32_t>((i * 7) % 10);
  MemoryCategoryScope scope(MemoryCategory::data);
  return {Tensor::from_vector(random_values(static_cast<std::size_t>(n * 784), g, 0.0f, 1.0f), {n, 784}, device),
          Tensor::from_vector(y, {n}, device)};
}

using Grads = std::vector<std::vector<float>>;

Grads gradients_of(const nn::Module& m) {
  Grads out;
  for (const Tensor& p : m.parameters()) out.push_back(p.grad().to_vector<float>());
  return out;
}

// The summed loss's gradient of micro-batches [start, start + size) of `b`, accumulated (no reset).
void backward_on(models::CNN& model, const Batch& b, int64_t start, int64_t size) {
  ops::cross_entropy(model(b.x.narrow_rows(start, size)), b.y.narrow_rows(start, size), ops::Reduction::Sum)
      .backward();
}

TEST_P(CnnModelTest, AccumulationWithBatchNormMatchesSeparateMicroBatchesNotOneBigBatch) {
  const Batch b = make_batch(64, 5, device());
  const std::vector<std::string> names = [&] {
    Generator gen(3);
    std::vector<std::string> n;
    for (const auto& [name, t] : models::CNN(gen, device()).named_parameters()) n.push_back(name);
    return n;
  }();

  // (a) 16 x 4 through the Accumulator: gradients accumulate in the flat buffer, each micro-batch
  // normalized by its own batch-norm statistics.
  Generator gen_a(3);
  models::CNN a(gen_a, device());
  auto flat = std::make_shared<nn::FlatParameters>(a);
  optim::AccumulatorOptions ao;
  ao.accum_steps = 4;
  optim::Accumulator acc(std::make_shared<optim::SGD>(flat, optim::SGDOptions{}), ao);
  acc.begin_epoch(0, 4);
  for (int64_t i = 0; i < 4; ++i) {
    acc.backward(ops::cross_entropy(a(b.x.narrow_rows(16 * i, 16)), b.y.narrow_rows(16 * i, 16), ops::Reduction::Sum),
                 16);
    if (i < 3) EXPECT_FALSE(acc.ready());
  }
  ASSERT_TRUE(acc.ready());
  const Grads accumulated = gradients_of(a);

  // (b) The same four micro-batches run separately (fresh gradients each), summed on the host.
  Generator gen_b(3);
  models::CNN sep(gen_b, device());
  Grads summed;
  for (int64_t i = 0; i < 4; ++i) {
    sep.zero_grad();
    backward_on(sep, b, 16 * i, 16);
    const Grads g = gradients_of(sep);
    if (summed.empty()) summed = g;
    else
      for (std::size_t p = 0; p < g.size(); ++p)
        for (std::size_t k = 0; k < g[p].size(); ++k) summed[p][k] += g[p][k];
  }
  for (std::size_t p = 0; p < summed.size(); ++p)
    EXPECT_LT(max_rel_diff(accumulated[p], summed[p]), 1e-5) << names[p] << ": 16 x 4 vs four micro-batches of 16";
  // Both ran four training forwards: the same running statistics (1.running_mean, 1.running_var,
  // 5.running_mean, 5.running_var).
  const auto sd_a = a.state_dict(), sd_sep = sep.state_dict();
  for (const std::size_t i : {4u, 5u, 11u, 12u})
    EXPECT_LT(max_rel_diff(sd_a[i].second.to_vector<float>(), sd_sep[i].second.to_vector<float>()), 1e-6)
        << sd_a[i].first;
  EXPECT_EQ(a.state_dict()[6].second.to_vector<int32_t>(), std::vector<int32_t>{4});
  acc.step_if_ready();

  // (c) One batch of 64 differs, and this is expected: batch norm normalizes by the statistics of
  // the batch it sees, so 64 samples normalized together are not four groups of 16 normalized
  // apart. (Without batch norm, as in the MLP, 16 x 4 equals 64 x 1 to float rounding.)
  Generator gen_c(3);
  models::CNN big(gen_c, device());
  backward_on(big, b, 0, 64);
  const Grads whole = gradients_of(big);
  double largest = 0;
  for (std::size_t p = 0; p < whole.size(); ++p) largest = std::max(largest, max_rel_diff(whole[p], summed[p]));
  EXPECT_GT(largest, 1e-3) << "64 x 1 must differ from 16 x 4 when batch norm uses batch statistics";
  EXPECT_EQ(big.state_dict()[6].second.to_vector<int32_t>(), std::vector<int32_t>{1});

  // Control: with batch norm in evaluation mode (fixed running statistics), 16 x 4 equals 64 x 1,
  // so the difference above is batch norm's statistics and nothing else.
  Generator gen_d(3), gen_e(3);
  models::CNN ev16(gen_d, device()), ev64(gen_e, device());
  ev16.eval();
  ev64.eval();
  for (int64_t i = 0; i < 4; ++i) backward_on(ev16, b, 16 * i, 16);
  backward_on(ev64, b, 0, 64);
  const Grads g16 = gradients_of(ev16), g64 = gradients_of(ev64);
  for (std::size_t p = 0; p < g16.size(); ++p)
    EXPECT_LT(max_rel_diff(g16[p], g64[p]), 1e-5) << names[p] << ": evaluation-mode batch norm, 16 x 4 vs 64 x 1";
}

// ---- the activation footprint -----------------------------------------------------------------

constexpr int64_t kRound = CachingAllocator::kRounding;
int64_t rounded(int64_t bytes) { return (bytes + kRound - 1) / kRound * kRound; }

// What the CNN's forward leaves allocated for backward at micro-batch b (f32, each tensor rounded
// to the allocator's 512 B). The input is a view of the dataset (category data), so the first
// conv's saved x costs nothing; it needs no dx, so it keeps no weight either.
//   c1 [b, 32, 28, 28]   conv1's output, saved by bn1 (its x)
//   2 x [32]             bn1's saved mean and invstd
//   r1 [b, 32, 28, 28]   relu1's output (saved by relu1, and by pool1 as its x)
//   p1 [b, 32, 14, 14]   pool1's output (saved by conv2 as its x; by pool1 as its y on CUDA)
//   c2 [b, 64, 14, 14]   conv2's output, saved by bn2 (conv2's weight is a parameter: free)
//   2 x [64]             bn2's saved mean and invstd
//   r2 [b, 64, 14, 14]   relu2's output (saved by relu2 and by pool2)
//   p2 [b, 64, 7, 7]     pool2's output, flattened as a view, saved by linear1 as its x
//   r3 [b, 128]          the fused linear1+relu3's output (saved by it and by linear2)
//   logits [b, 10]       saved by cross_entropy
//   loss []              the loss scalar
// Freed during the forward: the batch-norm outputs (read once by the ReLU after them, which saves
// its own output) and the conv's column scratch (category workspace); linear1 and relu3 run as one
// op (Note [Fused linear]), so no pre-activation exists.
int64_t cnn_activation_bytes(int64_t b) {
  return rounded(b * 32 * 28 * 28 * 4) + 2 * rounded(32 * 4) + rounded(b * 32 * 28 * 28 * 4) +
         rounded(b * 32 * 14 * 14 * 4) + rounded(b * 64 * 14 * 14 * 4) + 2 * rounded(64 * 4) +
         rounded(b * 64 * 14 * 14 * 4) + rounded(b * 64 * 7 * 7 * 4) + rounded(b * 128 * 4) + rounded(b * 10 * 4) +
         rounded(4);
}

TEST_P(CnnModelTest, ActivationFootprintIsTheAnalyticSum) {
  const Batch data = make_batch(40, 8, device());
  Generator gen(1);
  models::CNN model(gen, device());
  auto flat = std::make_shared<nn::FlatParameters>(model);
  optim::AccumulatorOptions ao;
  ao.accum_steps = 2;
  optim::Accumulator acc(std::make_shared<optim::SGD>(flat, optim::SGDOptions{}), ao);
  MemoryTracker::Options o;
  o.model = "cnn";
  o.micro_batch_size = 2;
  o.accum_steps = 2;
  o.timeline_steps = 0;
  MemoryTracker tracker(device(), o);
  const int64_t mbs = 4;  // per size
  for (int64_t b : {1, 2, 5}) {
    SCOPED_TRACE("micro-batch " + std::to_string(b));
    acc.begin_epoch(0, mbs);
    for (int64_t i = 0; i < mbs; ++i) {
      tracker.begin_micro_batch(0, i, b);
      Tensor loss = ops::cross_entropy(model(data.x.narrow_rows(i * b, b)), data.y.narrow_rows(i * b, b),
                                       ops::Reduction::Sum);
      tracker.end_forward();
      acc.backward(loss, b);
      loss = Tensor();
      tracker.end_backward();
      if (acc.ready()) {
        tracker.begin_step();
        acc.step_if_ready();
        tracker.end_step(acc.optimizer_steps(), acc.optimizer().state_bytes());
      }
      const MicroBatchRecord& r = tracker.last_micro_batch();
      EXPECT_EQ(r.activation_bytes, cnn_activation_bytes(b)) << "micro-batch " << i;
      EXPECT_GE(r.peak_bytes, r.activation_bytes);
    }
  }
  EXPECT_EQ(tracker.micro_batches().size(), 12u);
  // The slope over sizes 1, 2, 5: 4 * (2 * 25088 + 6272 + 2 * 12544 + 3136 + 128 + 10) = 339240
  // bytes per sample (~331 KiB), within the allocator's rounding.
  EXPECT_NEAR(tracker.summary().activation_bytes_per_sample, 339240.0, double(kRound));
  EXPECT_EQ(allocator_for(device()).stats()[MemoryCategory::activations].current, 0)
      << "backward released every saved tensor";
}

CUMULUS_INSTANTIATE_DEVICES(CnnOpsTest);
CUMULUS_INSTANTIATE_DEVICES(CnnModelTest);

}  // namespace
}  // namespace cumulus
