// The ops' behaviour beyond their values and gradients, which the op-case registry checks for
// every op (tests/op_cases/, Note [Op cases]: forward against a double reference, gradients
// against finite differences, memory accounting, CPU against CUDA): shapes and defaults,
// cross_entropy's stability for large logits and shift invariance, relu's NaN rule, argmax and its
// ties, label checking, leaves that take no gradient, the fused linear + relu against the two ops
// bit for bit, the seed MLP's CPU/CUDA parity at its real sizes, and ClassificationTally.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "cumulus/autograd/grad_mode.h"
#include "cumulus/autograd/node.h"
#include "cumulus/core/error.h"
#include "cumulus/ops/linear.h"
#include "cumulus/ops/loss.h"
#include "cumulus/ops/metrics.h"
#include "cumulus/ops/normalization.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/ops/rotary.h"
#include "cumulus/ops/shape.h"
#include "cumulus/tensor/random.h"
#include "cumulus/tensor/tensor.h"
#include "test_util.h"

namespace cumulus {
namespace {

using testing::DeviceTest;
using testing::max_rel_diff;
using ops::Reduction;

using Vec = std::vector<double>;

// ---- the double-precision reference ----------------------------------------------------------

// Per-row logsumexp - logit[label], summed or averaged.
double ref_cross_entropy(const Vec& logits, const std::vector<int32_t>& labels, int C, Reduction r) {
  const int B = int(labels.size());
  double total = 0;
  for (int i = 0; i < B; ++i) {
    double m = -INFINITY;
    for (int c = 0; c < C; ++c) m = std::max(m, logits[i * C + c]);
    double s = 0;
    for (int c = 0; c < C; ++c) s += std::exp(logits[i * C + c] - m);
    total += m + std::log(s) - logits[i * C + labels[i]];
  }
  return r == Reduction::Mean ? total / B : total;
}

Vec to_double(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

std::vector<float> random_values(std::size_t n, Generator& g, float lo = -1.0f, float hi = 1.0f,
                                 float keep_away_from_zero = 0.0f) {
  std::vector<float> v(n);
  for (float& x : v) {
    do g.fill_uniform(&x, 1, lo, hi);
    while (std::fabs(x) < keep_away_from_zero);
  }
  return v;
}

std::vector<int32_t> random_labels(int B, int C, Generator& g) {
  std::vector<float> u(B);
  g.fill_uniform(u.data(), B, 0.0f, float(C));
  std::vector<int32_t> y(B);
  for (int i = 0; i < B; ++i) y[i] = std::min(C - 1, int32_t(u[i]));
  return y;
}

class OpsTest : public DeviceTest {};

// Values against the double references are the registry's (tests/op_cases/); here what it does not
// look at: shapes, devices, 0-d scalars, and the default reduction.
TEST_P(OpsTest, ForwardShapesAndDefaults) {
  const Device d = device();
  Generator g(3);
  const int B = 5, in = 7, out = 4;
  const auto xv = random_values(B * in, g), wv = random_values(out * in, g), bv = random_values(out, g);
  Tensor x = Tensor::from_vector(xv, {B, in}, d), w = Tensor::from_vector(wv, {out, in}, d),
         b = Tensor::from_vector(bv, {out}, d);

  Tensor y = ops::linear(x, w, b);
  EXPECT_EQ(y.shape(), Shape({B, out}));
  EXPECT_EQ(y.device(), d);
  EXPECT_EQ(ops::relu(y).shape(), y.shape());
  Tensor r3 = ops::relu(Tensor::from_vector<float>({-1, 0, 2, -0.5f, 3, -4, 5, 6}, {2, 2, 2}, d));
  EXPECT_EQ(r3.shape(), Shape({2, 2, 2}));
  EXPECT_EQ(r3.to_vector<float>(), (std::vector<float>{0, 0, 2, 0, 3, 0, 5, 6}));

  EXPECT_EQ(ops::sum(x).ndim(), 0) << "sum gives a 0-d scalar";
  EXPECT_EQ(ops::mean(x).ndim(), 0);
  Tensor v = ops::reshape(x, {in, B});
  EXPECT_EQ(v.shape(), Shape({in, B}));
  EXPECT_EQ(v.to_vector<float>(), xv);

  Tensor labels = Tensor::from_vector<int32_t>({3, 0, 1, 1, 2}, {B}, d);
  Tensor l_mean = ops::cross_entropy(y, labels, Reduction::Mean);
  EXPECT_EQ(l_mean.numel(), 1);
  EXPECT_EQ(ops::cross_entropy(y, labels).item(), l_mean.item()) << "the default reduction is Mean";
  EXPECT_NEAR(ops::cross_entropy(y, labels, Reduction::Sum).item(), l_mean.item() * B, 1e-5 * B);
}

TEST_P(OpsTest, ReluPropagatesNaN) {
  // As PyTorch: relu(NaN) is NaN (a diverged model must not look healthy), and the gradient
  // follows threshold_backward on the output: 0 where y <= 0, the upstream gradient elsewhere,
  // NaN outputs included. relu(-0) is +-0, compared as 0.
  const Device d = device();
  const float nan = std::nanf(""), inf = INFINITY;
  Tensor x = Tensor::from_vector<float>({nan, -1.0f, 0.0f, 2.0f, -nan, inf, -inf, -0.0f}, {8}, d);
  x.set_requires_grad(true);
  Tensor y = ops::relu(x);
  const auto yv = y.to_vector<float>();
  EXPECT_TRUE(std::isnan(yv[0])) << "relu(NaN) is " << yv[0];
  EXPECT_TRUE(std::isnan(yv[4])) << "relu(-NaN) is " << yv[4];
  EXPECT_EQ(yv[1], 0.0f);
  EXPECT_EQ(yv[2], 0.0f);
  EXPECT_EQ(yv[3], 2.0f);
  EXPECT_EQ(yv[5], inf);
  EXPECT_EQ(yv[6], 0.0f);
  EXPECT_EQ(yv[7], 0.0f);
  // A weighted sum gives each element its own upstream gradient: d/dx_i of sum_i w_i relu(x_i),
  // as a linear layer with one output.
  const std::vector<float> w = {2, 3, 4, 5, 6, 7, 8, 9};
  ops::sum(ops::linear(ops::reshape(y, {1, 8}), Tensor::from_vector(w, {1, 8}, d), Tensor())).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{2, 0, 0, 5, 6, 7, 0, 0}));
  // The forward result is NaN wherever the input is, whatever its sign bit or payload.
  Tensor many = ops::relu(Tensor::full({1000}, nan, d));
  for (float v : many.to_vector<float>()) ASSERT_TRUE(std::isnan(v));
}

TEST_P(OpsTest, CrossEntropyIsStableForLargeLogits) {
  const Device d = device();
  const std::vector<float> lv = {1000,  1001,  999.5f,  //
                                 -1000, -1001, -999,    //
                                 0,     1000,  -1000,   //
                                 88,    89,    90};     // exp(90) overflows float without the max shift
  const std::vector<int32_t> yv = {1, 2, 0, 0};
  Tensor logits = Tensor::from_vector(lv, {4, 3}, d);
  logits.set_requires_grad(true);
  Tensor loss = ops::cross_entropy(logits, Tensor::from_vector(yv, {4}, d), Reduction::Sum);
  const double ref = ref_cross_entropy(to_double(lv), yv, 3, Reduction::Sum);
  ASSERT_TRUE(std::isfinite(loss.item())) << "loss " << loss.item();
  EXPECT_NEAR(loss.item(), ref, 1e-6 * ref) << "reference " << ref;
  EXPECT_GT(ref, 1000.0);
  loss.backward();
  const auto grad = logits.grad().to_vector<float>();
  for (int i = 0; i < 4; ++i) {
    double m = -INFINITY, z = 0, row = 0;
    for (int c = 0; c < 3; ++c) m = std::max(m, double(lv[i * 3 + c]));
    for (int c = 0; c < 3; ++c) z += std::exp(lv[i * 3 + c] - m);
    for (int c = 0; c < 3; ++c) {
      const float gv = grad[i * 3 + c];
      ASSERT_TRUE(std::isfinite(gv)) << "row " << i;
      const double expected = std::exp(lv[i * 3 + c] - m) / z - (c == yv[i] ? 1.0 : 0.0);
      EXPECT_NEAR(gv, expected, 1e-5) << "softmax - one_hot at row " << i << " col " << c;
      row += gv;
    }
    EXPECT_NEAR(row, 0.0, 1e-5) << "each gradient row sums to zero";
  }

  // Mean: the gradient is divided by the batch.
  Tensor logits2 = Tensor::from_vector(lv, {4, 3}, d);
  logits2.set_requires_grad(true);
  Tensor mean_loss = ops::cross_entropy(logits2, Tensor::from_vector(yv, {4}, d), Reduction::Mean);
  EXPECT_NEAR(mean_loss.item(), ref / 4, 1e-6 * ref);
  mean_loss.backward();
  const auto g2 = logits2.grad().to_vector<float>();
  for (std::size_t k = 0; k < g2.size(); ++k) EXPECT_NEAR(g2[k], grad[k] / 4, 1e-6);
}

// Cross-entropy is shift-invariant: logits + 1000 must give the loss and gradient of the logits,
// to float precision of the *result* (the row max is subtracted exactly; only the per-row
// log-sum-exp relative to the max needs rounding).
TEST_P(OpsTest, CrossEntropyIsShiftInvariantToFloatPrecision) {
  const Device d = device();
  Generator g(31);
  const int B = 6, C = 5;
  const auto base = random_values(B * C, g, -2, 2);
  const auto y = random_labels(B, C, g);
  for (float shift : {1000.0f, -1000.0f, 30000.0f}) {
    SCOPED_TRACE(shift);
    std::vector<float> shifted(base.size());
    for (std::size_t k = 0; k < base.size(); ++k) shifted[k] = base[k] + shift;
    // The reference takes the shifted float values as they are.
    const double ref = ref_cross_entropy(to_double(shifted), y, C, Reduction::Sum);
    Tensor logits = Tensor::from_vector(shifted, {B, C}, d);
    logits.set_requires_grad(true);
    Tensor loss = ops::cross_entropy(logits, Tensor::from_vector(y, {B}, d), Reduction::Sum);
    EXPECT_NEAR(loss.item(), ref, 1e-5 * ref) << "per-sample losses are O(1): float gives ~1e-7";
    loss.backward();
    const auto grad = logits.grad().to_vector<float>();
    for (int i = 0; i < B; ++i) {
      double m = -INFINITY, z = 0;
      for (int c = 0; c < C; ++c) m = std::max(m, double(shifted[i * C + c]));
      for (int c = 0; c < C; ++c) z += std::exp(shifted[i * C + c] - m);
      for (int c = 0; c < C; ++c) {
        const double expected = std::exp(shifted[i * C + c] - m) / z - (c == y[i] ? 1.0 : 0.0);
        EXPECT_NEAR(grad[i * C + c], expected, 2e-6) << "softmax - one_hot at row " << i << " col " << c;
      }
    }
  }
}

TEST_P(OpsTest, ArgmaxTakesTheFirstMaximum) {
  const Device d = device();
  Tensor x = Tensor::from_vector<float>({1, 3, 2,     //
                                         5, 5, 1,     //
                                         0, -1, -2,   //
                                         2, 2, 2,     //
                                         -3, -1, -1,  //
                                         -5, -4, 7},
                                        {6, 3}, d);
  x.set_requires_grad(true);
  Tensor a = ops::argmax(x);
  EXPECT_EQ(a.dtype(), DType::i32);
  EXPECT_EQ(a.shape(), Shape({6}));
  EXPECT_EQ(a.device(), d);
  EXPECT_FALSE(a.requires_grad()) << "argmax has no gradient";
  EXPECT_EQ(a.to_vector<int32_t>(), (std::vector<int32_t>{1, 0, 0, 0, 1, 2}));

  Generator g(21);
  const int rows = 37, cols = 10;
  const auto v = random_values(rows * cols, g, -3, 3);
  const auto got = ops::argmax(Tensor::from_vector(v, {rows, cols}, d)).to_vector<int32_t>();
  for (int i = 0; i < rows; ++i) {
    const auto row = v.begin() + i * cols;
    EXPECT_EQ(got[i], int32_t(std::max_element(row, row + cols) - row)) << "row " << i;
  }
}

TEST_P(OpsTest, OutOfRangeLabels) {
  const Device d = device();
  Tensor logits = Tensor::from_vector<float>({0.1f, 0.2f, 0.3f, 1, 2, 3}, {2, 3}, d);
  for (const std::vector<int32_t>& bad : {std::vector<int32_t>{0, 3}, std::vector<int32_t>{-1, 0}}) {
    Tensor labels = Tensor::from_vector(bad, {2}, d);
    if (d.is_cpu()) {
      try {
        ops::cross_entropy(logits, labels);
        ADD_FAILURE() << "label outside [0, 3) must throw on CPU";
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find("cross_entropy"), std::string::npos) << e.what();
      }
    } else {
      EXPECT_TRUE(std::isnan(ops::cross_entropy(logits, labels).item()))
          << "documented: a bad label gives a NaN loss on CUDA";
    }
  }
}

// PyTorch's ignore_index (default -100): an ignored position adds no loss and no gradient, Mean
// divides by the positions kept, and every position ignored makes the mean NaN (0 / 0) with a zero
// gradient, the sum 0 and each Reduction::None loss 0. i64 labels give i32's results.
TEST_P(OpsTest, CrossEntropyIgnoresIgnoreIndex) {
  const Device d = device();
  const std::vector<float> lv{0.1f, 0.2f, 0.3f, 1, 2, 3, -1, 0, 1};
  Tensor logits = Tensor::from_vector(lv, {3, 3}, d);
  logits.set_requires_grad(true);
  const Tensor labels = Tensor::from_vector<int64_t>({-100, 2, 0}, {3}, d);
  Tensor loss = ops::cross_entropy(logits, labels);
  const double want = (ref_cross_entropy(to_double({1, 2, 3}), {2}, 3, Reduction::Sum) +
                       ref_cross_entropy(to_double({-1, 0, 1}), {0}, 3, Reduction::Sum)) /
                      2;
  EXPECT_NEAR(loss.item(), want, 1e-6);
  loss.backward();
  const std::vector<float> g = logits.grad().to(Device::cpu()).to_vector<float>();
  for (int c = 0; c < 3; ++c) EXPECT_EQ(g[c], 0.0f) << "the ignored row's gradient, column " << c;
  EXPECT_NE(g[3], 0.0f);
  const Tensor i32_labels = Tensor::from_vector<int32_t>({-100, 2, 0}, {3}, d);
  EXPECT_EQ(ops::cross_entropy(logits.detach(), i32_labels).item(), loss.item());
  const std::vector<float> rows =
      ops::cross_entropy(logits.detach(), labels, Reduction::None).to(Device::cpu()).to_vector<float>();
  EXPECT_EQ(rows[0], 0.0f);
  EXPECT_NEAR(rows[1] + rows[2], 2 * want, 1e-5);

  Tensor all = Tensor::from_vector(lv, {3, 3}, d);
  all.set_requires_grad(true);
  const Tensor ignored = Tensor::from_vector<int64_t>({-100, -100, -100}, {3}, d);
  Tensor mean = ops::cross_entropy(all, ignored, Reduction::Mean);
  EXPECT_TRUE(std::isnan(mean.item())) << mean.item();
  mean.backward();
  for (float v : all.grad().to(Device::cpu()).to_vector<float>()) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(ops::cross_entropy(all.detach(), ignored, Reduction::Sum).item(), 0.0f);
  // A class as ignore_index.
  EXPECT_NEAR(
      ops::cross_entropy(logits.detach(), Tensor::from_vector<int32_t>({1, 2, 0}, {3}, d), Reduction::Mean, 1).item(),
      want, 1e-6);
}

TEST_P(OpsTest, LeadingDimensionErrorsNameTheOpAndShapes) {
  const Device d = device();
  auto expect = [](auto&& f, std::vector<std::string> parts) {
    try {
      f();
      ADD_FAILURE() << "no error; wanted " << parts[0];
    } catch (const Error& e) {
      for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  };
  const Tensor w = Tensor::zeros({5, 8}, DType::f32, d);
  expect(
      [&] {
        ops::linear(Tensor::zeros({2, 5, 7}, DType::f32, d), w, Tensor());
      },
      {"linear", "[2, 5, 7]", "7 features", "[5, 8]"});
  expect([&] { ops::linear(Tensor::zeros({}, DType::f32, d), w, Tensor()); }, {"linear", "[..., in_features]"});
  const Tensor logits = Tensor::zeros({2, 5, 8}, DType::f32, d);
  expect(
      [&] {
        ops::cross_entropy(logits, Tensor::zeros({2, 4}, DType::i64, d));
      },
      {"cross_entropy", "labels [2, 4]", "logits [2, 5, 8]"});
  expect(
      [&] {
        ops::cross_entropy(logits, Tensor::zeros({2, 5}, DType::f32, d));
      },
      {"cross_entropy", "labels must be i32 or i64", "f32"});
  expect([&] { ops::softmax(logits, 3); }, {"softmax", "dim 3"});
  expect([&] { ops::log_softmax(logits, -4); }, {"log_softmax", "dim -4"});
  expect([&] { ops::embedding(Tensor::zeros({3}, DType::f32, d), w); }, {"embedding", "indices", "i32 or i64"});
  expect([&] { ops::layer_norm(logits, Shape{4, 8}); }, {"layer_norm", "normalized_shape [4, 8]"});
  if (d.is_cpu()) {
    expect(
        [&] {
          ops::cross_entropy(logits, Tensor::from_vector<int64_t>({0, 1, 2, 3, 8, 0, 0, 0, 0, 0}, {2, 5}, d));
        },
        {"cross_entropy", "label 8 at position 4", "[0, 8)"});
    expect([&] { ops::embedding(Tensor::from_vector<int64_t>({int64_t{1} << 40}, {1}, d), w); },
           {"embedding", "outside [0, 5)"});
  }
}

TEST_P(OpsTest, LeavesThatNeedNoGradientAreSkipped) {
  // Only the weight requires grad: the input and bias get no buffer.
  const Device d = device();
  Generator g(8);
  Tensor x = Tensor::from_vector(random_values(12, g), {3, 4}, d);
  Tensor w = Tensor::from_vector(random_values(8, g), {2, 4}, d);
  Tensor b = Tensor::from_vector(random_values(2, g), {2}, d);
  w.set_requires_grad(true);
  ops::sum(ops::linear(x, w, b)).backward();
  EXPECT_FALSE(x.grad_buffer().defined());
  EXPECT_FALSE(b.grad_buffer().defined());
  ASSERT_TRUE(w.grad().defined());
  // d sum(x w^T + b) / dw[o, k] = sum_i x[i, k]
  const auto xv = x.to_vector<float>();
  const auto gw = w.grad().to_vector<float>();
  for (int o = 0; o < 2; ++o)
    for (int k = 0; k < 4; ++k) EXPECT_NEAR(gw[o * 4 + k], xv[k] + xv[4 + k] + xv[8 + k], 1e-6);
}

// ---- fused linear + relu against the two ops ---------------------------------------------------

// Forward value and the gradients of every leaf of L = CE(linear(act(x W1^T + b1), W2, b2)), where the
// first layer is linear + relu either fused or as two ops, after one backward (every leaf's sink
// overwrites) and after a second one (they accumulate). Bias optional; x requires grad or not.
struct FusedRun {
  std::vector<std::vector<float>> values;  // y of the first layer, loss, then the gradients
};

FusedRun run_linear_relu(bool fused, Device d, bool bias, bool x_grad, int B, int in, int hidden, int C,
                         uint64_t seed) {
  Generator g(seed);
  const auto labels = random_labels(B, C, g);
  Tensor x = Tensor::from_vector(random_values(B * in, g), {B, in}, d);
  Tensor w1 = Tensor::from_vector(random_values(hidden * in, g, -0.5f, 0.5f), {hidden, in}, d);
  Tensor b1 = bias ? Tensor::from_vector(random_values(hidden, g, -0.5f, 0.5f), {hidden}, d) : Tensor();
  Tensor w2 = Tensor::from_vector(random_values(C * hidden, g), {C, hidden}, d);
  Tensor b2 = Tensor::from_vector(random_values(C, g), {C}, d);
  std::vector<Tensor> leaves{w1, w2, b2};
  if (bias) leaves.push_back(b1);
  if (x_grad) leaves.push_back(x);
  for (Tensor& t : leaves) t.set_requires_grad(true);
  FusedRun r;
  for (int pass = 0; pass < 2; ++pass) {
    Tensor h = fused ? ops::linear(x, w1, b1, ops::Activation::relu) : ops::relu(ops::linear(x, w1, b1));
    Tensor loss = ops::cross_entropy(ops::linear(h, w2, b2), Tensor::from_vector(labels, {B}, d), Reduction::Sum);
    r.values.push_back(h.to_vector<float>());
    r.values.push_back({loss.item()});
    loss.backward();  // pass 0: the leaves' buffers are stale (overwrite); pass 1: accumulate
    for (const Tensor& t : leaves) r.values.push_back(t.grad().to_vector<float>());
  }
  return r;
}

TEST_P(OpsTest, FusedLinearReluEqualsLinearThenRelu) {
  const Device d = device();
  struct Shape3 {
    int B, in, hidden, C;
  };
  for (const Shape3 s : {Shape3{5, 7, 6, 3}, Shape3{33, 40, 70, 10}}) {
    for (bool bias : {true, false}) {
      for (bool x_grad : {false, true}) {
        SCOPED_TRACE("B " + std::to_string(s.B) + (bias ? " bias" : " no bias") + (x_grad ? " dx" : ""));
        const FusedRun fused = run_linear_relu(true, d, bias, x_grad, s.B, s.in, s.hidden, s.C, 11);
        const FusedRun plain = run_linear_relu(false, d, bias, x_grad, s.B, s.in, s.hidden, s.C, 11);
        ASSERT_EQ(fused.values.size(), plain.values.size());
        int zeros = 0;
        for (float v : plain.values[0]) zeros += v == 0.0f;
        EXPECT_GT(zeros, 0) << "relu must cut something for the mask to be tested";
        for (std::size_t i = 0; i < plain.values.size(); ++i) {
          if (d.is_cpu()) {
            // The same arithmetic in the same order: identical bits, forward and every gradient.
            EXPECT_EQ(fused.values[i], plain.values[i]) << "value " << i;
          } else {
            EXPECT_LT(max_rel_diff(fused.values[i], plain.values[i]), 1e-5) << "value " << i;
          }
        }
      }
    }
  }
}

TEST_P(OpsTest, FusedLinearReluPropagatesNaN) {
  // As relu alone (ReluPropagatesNaN): a NaN pre-activation stays NaN. On CUDA the bias comes from
  // cuBLASLt's BIAS epilogue and the ReLU is our kernel, never cuBLASLt's RELU epilogues, whose NaN
  // rule is not documented (Note [ReLU epilogues and NaN] in engine/ops/linear.cpp).
  const Device d = device();
  const float nan = std::nanf("");
  Tensor x = Tensor::from_vector<float>({1.0f, nan, -1.0f, 0.5f, 0.25f, -2.0f}, {2, 3}, d);
  Tensor w = Tensor::from_vector<float>({1, 1, 1, -1, -1, -1, 2, 0, 0, 0, 0, 3}, {4, 3}, d);
  Tensor b = Tensor::from_vector<float>({0, 0, 0, 0}, {4}, d);
  const auto fused = ops::linear(x, w, b, ops::Activation::relu).to_vector<float>();
  const auto plain = ops::relu(ops::linear(x, w, b)).to_vector<float>();
  ASSERT_TRUE(std::isnan(plain[0]) && std::isnan(plain[1])) << "the NaN must reach the output";
  for (int j = 0; j < 4; ++j)
    EXPECT_EQ(std::isnan(fused[j]), std::isnan(plain[j])) << "row 0, column " << j << ": fused " << fused[j];
  for (int j = 4; j < 8; ++j) EXPECT_EQ(fused[j], plain[j]) << "row 1, column " << j - 4;
}

TEST_P(OpsTest, FusedLinearReluRecordsOneNodeAndSavesItsOutput) {
  const Device d = device();
  Generator g(4);
  Tensor x = Tensor::from_vector(random_values(12, g), {3, 4}, d);
  Tensor w = Tensor::from_vector(random_values(8, g), {2, 4}, d);
  Tensor b = Tensor::from_vector(random_values(2, g), {2}, d);
  w.set_requires_grad(true);
  Tensor y = ops::linear(x, w, b, ops::Activation::relu);
  ASSERT_TRUE(y.grad_fn() != nullptr);
  EXPECT_STREQ(y.grad_fn()->name(), "linear+relu");
  EXPECT_EQ(y.grad_fn()->next_edges().size(), 3u);
  EXPECT_STREQ(ops::linear(x, w, b, ops::Activation::none).grad_fn()->name(), "linear");
  {
    NoGradGuard no_grad;
    Tensor e = ops::linear(x, w, b, ops::Activation::relu);
    EXPECT_TRUE(e.grad_fn() == nullptr);
    EXPECT_EQ(e.to_vector<float>(), y.to_vector<float>());
  }
  // Shape errors name the fused op.
  try {
    ops::linear(x, Tensor::from_vector(random_values(6, g), {2, 3}, d), b, ops::Activation::relu);
    ADD_FAILURE() << "a mismatched weight must be refused";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("linear+relu"), std::string::npos) << e.what();
  }
}

CUMULUS_INSTANTIATE_DEVICES(OpsTest);

// ---- CPU versus CUDA -------------------------------------------------------------------------

// Runs forward and backward of `f` on `device` with every input a leaf requiring grad; returns
// the scalar loss, then each input's gradient.
std::vector<std::vector<float>> loss_and_gradients(const std::vector<std::pair<Shape, std::vector<float>>>& inputs,
                                                   const std::function<Tensor(const std::vector<Tensor>&)>& f,
                                                   Device device) {
  std::vector<Tensor> leaves;
  for (const auto& [shape, values] : inputs) {
    leaves.push_back(Tensor::from_vector(values, shape, device));
    leaves.back().set_requires_grad(true);
  }
  Tensor loss = f(leaves);
  std::vector<std::vector<float>> out = {{loss.item()}};
  loss.backward();
  for (const Tensor& t : leaves) out.push_back(t.grad().to_vector<float>());
  return out;
}

// Every op's CPU/CUDA parity at the op cases' sizes is the registry's (tests/test_op_cases.cpp,
// CudaMatchesCpu); here the seed MLP at its real sizes, where cuBLAS picks its large-matrix
// algorithms (and TF32 would show).
TEST(OpsParity, CpuMatchesCudaAtTheSeedMlpSizes) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  Generator g(77);
  const int B = 64, in = 784, hidden = 512, C = 10;
  auto y = random_labels(B, C, g);
  const std::vector<std::pair<Shape, std::vector<float>>> big = {
      {{B, in}, random_values(B * in, g, 0, 1)},
      {{hidden, in}, random_values(hidden * in, g, -0.035f, 0.035f)},
      {{hidden}, random_values(hidden, g, -0.035f, 0.035f)},
      {{C, hidden}, random_values(C * hidden, g, -0.044f, 0.044f)},
      {{C}, random_values(C, g, -0.044f, 0.044f)}};
  auto mlp = [y](const std::vector<Tensor>& t) {
    Tensor h = ops::relu(ops::linear(t[0], t[1], t[2]));
    return ops::cross_entropy(ops::linear(h, t[3], t[4]), Tensor::from_vector(y, {B}, t[0].device()), Reduction::Sum);
  };
  const auto cpu_grads = loss_and_gradients(big, mlp, Device::cpu());
  const auto cuda_grads = loss_and_gradients(big, mlp, Device::cuda(0));
  for (std::size_t i = 0; i < cpu_grads.size(); ++i)
    EXPECT_LT(max_rel_diff(cuda_grads[i], cpu_grads[i]), 1e-5) << (i == 0 ? "loss" : "gradient ") << i;

  // Forward outputs of every op, element by element.
  const auto xv = random_values(B * in, g, -1, 1);
  const auto wv = random_values(hidden * in, g, -0.035f, 0.035f);
  const auto bv = random_values(hidden, g, -0.035f, 0.035f);
  NoGradGuard no_grad;
  auto on = [&](Device d) {
    Tensor x = Tensor::from_vector(xv, {B, in}, d);
    Tensor lin = ops::linear(x, Tensor::from_vector(wv, {hidden, in}, d), Tensor::from_vector(bv, {hidden}, d));
    Tensor rel = ops::relu(lin);
    // argmax of the same input on both devices must agree exactly (no rounding involved).
    const auto idx = ops::argmax(x).to_vector<int32_t>();
    return std::vector<std::vector<float>>{lin.to_vector<float>(),
                                           rel.to_vector<float>(),
                                           {ops::sum(x).item()},
                                           {ops::mean(x).item()},
                                           std::vector<float>(idx.begin(), idx.end())};
  };
  const auto cpu = on(Device::cpu()), gpu = on(Device::cuda(0));
  const char* what[] = {"linear", "relu", "sum", "mean", "argmax"};
  for (std::size_t i = 0; i < cpu.size(); ++i)
    EXPECT_LT(max_rel_diff(gpu[i], cpu[i], 1e-6), i == 4 ? 1e-12 : 1e-5) << what[i];
}

// ---- ClassificationTally -------------------------------------------------------------------------

class TallyTest : public DeviceTest {};

// The device-side totals equal what a per-batch host loop computes: the batches' mean losses summed
// in double, and the rows whose ops::argmax equals the label (ties to the first maximum, a NaN row).
TEST_P(TallyTest, EqualsThePerBatchHostLoop) {
  const std::vector<std::vector<float>> batches = {
      {0.1f, 2.0f, -1.0f, /**/ 3.0f, 3.0f, 1.0f, /**/ -5.0f, -5.0f, -4.0f},  // a tie: the first maximum
      {NAN, 1.0f, 0.0f, /**/ 1.0f, NAN, 2.0f},                               // NaN rows
      {100.0f, -100.0f, 0.0f}};
  const std::vector<std::vector<int32_t>> labels = {{1, 1, 2}, {0, 1}, {0}};
  ops::ClassificationTally tally(device());
  double loss_sum = 0.0;
  int64_t correct = 0, samples = 0;
  for (std::size_t k = 0; k < batches.size(); ++k) {
    const int64_t rows = static_cast<int64_t>(labels[k].size());
    const Tensor logits = Tensor::from_vector(batches[k], Shape{rows, 3}, device());
    const Tensor y = Tensor::from_vector(labels[k], Shape{rows}, device());
    const Tensor loss = ops::cross_entropy(logits, y, Reduction::Mean);
    tally.add(logits, y, loss);
    loss_sum += static_cast<double>(loss.item());
    const std::vector<int32_t> pred = ops::argmax(logits).to_vector<int32_t>();
    for (int64_t r = 0; r < rows; ++r)
      correct += pred[static_cast<std::size_t>(r)] == labels[k][static_cast<std::size_t>(r)];
    samples += rows;
  }
  const ops::ClassificationTally::Totals t = tally.read();
  EXPECT_TRUE(std::isnan(loss_sum)) << "the NaN batch's loss is NaN, and the sum with it";
  EXPECT_TRUE(std::isnan(t.loss_sum));
  EXPECT_EQ(t.correct, correct);
  EXPECT_EQ(t.correct, 5) << "batch 1: rows 0 and 2 (the tie goes to class 0, not its label 1); the NaN batch: "
                             "both (a NaN is the maximum wherever it stands, as in torch.argmax); batch 3";
  EXPECT_EQ(t.samples, samples);
  EXPECT_EQ(t.batches, 3);

  // Without the NaN batch the loss sums match to the last bit.
  ops::ClassificationTally finite(device());
  double want = 0.0;
  for (std::size_t k : {std::size_t(0), std::size_t(2)}) {
    const int64_t rows = static_cast<int64_t>(labels[k].size());
    const Tensor logits = Tensor::from_vector(batches[k], Shape{rows, 3}, device());
    const Tensor y = Tensor::from_vector(labels[k], Shape{rows}, device());
    const Tensor loss = ops::cross_entropy(logits, y, Reduction::Mean);
    finite.add(logits, y, loss);
    want += static_cast<double>(loss.item());
  }
  EXPECT_EQ(finite.read().loss_sum, want);
}

TEST_P(TallyTest, RefusesMismatchedShapes) {
  ops::ClassificationTally tally(device());
  const Tensor logits = Tensor::zeros(Shape{4, 3}, DType::f32, device());
  const Tensor loss = Tensor::zeros(Shape{}, DType::f32, device());
  EXPECT_THROW(tally.add(logits, Tensor::zeros(Shape{3}, DType::i32, device()), loss), ShapeError);
  EXPECT_THROW(tally.add(logits, Tensor::zeros(Shape{4}, DType::f32, device()), loss), Error);
  EXPECT_THROW(tally.add(logits, Tensor::zeros(Shape{4}, DType::i32, device()), logits), ShapeError);
  EXPECT_EQ(tally.read().batches, 0);
}

CUMULUS_INSTANTIATE_DEVICES(TallyTest);

// The bias gradient from the weight-gradient GEMM's BGRADB epilogue (CUDA, when db's sink
// overwrites) against the CPU's sum_rows, then accumulated on a second backward (BGRADB into a
// temporary and the engine's deferred add). Where cuBLASLt fuses BGRADB the overwriting backward
// launches one kernel less than the accumulating one; where it declines (no algorithm, told by
// cuda_epilogue_calls) both run the GEMM and sum_rows and launch the same.
TEST(OpsParity, BiasGradientFromTheWeightGradientGemm) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (const int B : {16, 33, 64}) {
    for (const bool relu : {false, true}) {
      SCOPED_TRACE("B " + std::to_string(B) + (relu ? " linear+relu" : " linear"));
      const int in = 784, out = 512, C = 10;
      Generator g(900 + B);
      const auto labels = random_labels(B, C, g);
      const auto xv = random_values(B * in, g, 0, 1), w1v = random_values(out * in, g, -0.035f, 0.035f),
                 b1v = random_values(out, g, -0.035f, 0.035f), w2v = random_values(C * out, g, -0.044f, 0.044f);
      auto run = [&](Device d, std::vector<int64_t>* launches, std::vector<int64_t>* fused) {
        Tensor x = Tensor::from_vector(xv, {B, in}, d);
        Tensor w1 = Tensor::from_vector(w1v, {out, in}, d), b1 = Tensor::from_vector(b1v, {out}, d);
        Tensor w2 = Tensor::from_vector(w2v, {C, out}, d);
        w1.set_requires_grad(true);
        b1.set_requires_grad(true);
        std::vector<std::vector<float>> grads;
        for (int pass = 0; pass < 2; ++pass) {  // overwrite, then accumulate
          Tensor h = ops::linear(x, w1, b1, relu ? ops::Activation::relu : ops::Activation::none);
          Tensor loss =
              ops::cross_entropy(ops::linear(h, w2, Tensor()), Tensor::from_vector(labels, {B}, d), Reduction::Sum);
          const int64_t before = cuda_kernel_launches();
          const int64_t fused_before = cuda_epilogue_calls(CudaEpilogue::bias_gradient).fused;
          loss.backward();
          if (launches != nullptr) launches->push_back(cuda_kernel_launches() - before);
          if (fused != nullptr) fused->push_back(cuda_epilogue_calls(CudaEpilogue::bias_gradient).fused - fused_before);
          grads.push_back(w1.grad().to_vector<float>());
          grads.push_back(b1.grad().to_vector<float>());
        }
        return grads;
      };
      std::vector<int64_t> launches, fused;
      const auto cpu = run(Device::cpu(), nullptr, nullptr);
      const auto gpu = run(Device::cuda(0), &launches, &fused);
      const char* what[] = {"dW (overwrite)", "db (overwrite: BGRADB)", "dW (accumulate)", "db (accumulate: sum_rows)"};
      for (std::size_t i = 0; i < cpu.size(); ++i) EXPECT_LT(max_rel_diff(gpu[i], cpu[i]), 1e-5) << what[i];
      ASSERT_EQ(launches.size(), 2u);
      ASSERT_EQ(fused.size(), 2u);
      ASSERT_TRUE(fused[0] == 0 || fused[0] == 1) << "one Linear has a bias";
      // The accumulating pass costs one launch for db either way (the deferred add or sum_rows).
      EXPECT_EQ(launches[0] + fused[0], launches[1])
          << "db inside the dW GEMM saves one launch when it overwrites (if cuBLASLt offers BGRADB)";
    }
  }
}

}  // namespace
}  // namespace cumulus

namespace cumulus::testing {
namespace {

// Llama's tables: column j and j + D/2 share the angle t * base^(-2j / D), rounded once from double.
TEST(Rotary, TablesHoldEachAngleOnceRoundedInBothHalves) {
  const int64_t context = 7, D = 8;
  const ops::RotaryTables rope = ops::rotary_tables(context, D, 500.0);
  EXPECT_EQ(rope.cos.shape(), Shape({context, D}));
  const std::vector<float> c = rope.cos.to_vector<float>(), s = rope.sin.to_vector<float>();
  for (int64_t t = 0; t < context; ++t)
    for (int64_t j = 0; j < D; ++j) {
      const double angle = static_cast<double>(t) / std::pow(500.0, 2.0 * static_cast<double>(j % (D / 2)) / D);
      EXPECT_EQ(c[t * D + j], static_cast<float>(std::cos(angle))) << t << ", " << j;
      EXPECT_EQ(s[t * D + j], static_cast<float>(std::sin(angle))) << t << ", " << j;
    }
}

TEST(Rotary, BadSizesAreRefusedByName) {
  EXPECT_NE(thrown_message<InvalidArgument>([] { ops::rotary_tables(4, 7); }).find("head_dim must be even"),
            std::string::npos);
  EXPECT_NE(thrown_message<InvalidArgument>([] { ops::rotary_tables(0, 8); }).find("context must be >= 1"),
            std::string::npos);
  const ops::RotaryTables rope = ops::rotary_tables(4, 8);
  EXPECT_NE(thrown_message<ShapeError>([&] {
              ops::apply_rotary(Tensor::zeros(Shape{1, 5, 8}), rope.cos, rope.sin);
            }).find("the tables must be [T' >= 5, 8]"),
            std::string::npos);
}

}  // namespace
}  // namespace cumulus::testing
