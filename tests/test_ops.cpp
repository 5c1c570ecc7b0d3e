// Every op against a double-precision reference written here: forward values, and gradients by
// central finite differences of the reference (h = 1e-6 in double) compared with the engine's
// analytic float32 gradients. Scalar losses are built only from ops that exist (cross_entropy,
// sum, mean, reshape), so some checks cover a composite: each op appears in several of them.
// Also: cross_entropy's stability for large logits, argmax and its ties, label checking, and a
// CPU-vs-CUDA parity test for every op.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "cumulus/autograd/grad_mode.h"
#include "cumulus/autograd/node.h"
#include "cumulus/core/error.h"
#include "cumulus/ops/metrics.h"
#include "cumulus/ops/ops.h"
#include "cumulus/tensor/random.h"
#include "cumulus/tensor/tensor.h"
#include "test_util.h"

namespace cumulus {
namespace {

using testing::DeviceTest;
using testing::max_rel_diff;
using ops::Reduction;

using Vec = std::vector<double>;
using Vars = std::vector<Vec>;

// ---- the double-precision reference ----------------------------------------------------------

// x: [B, in], w: [out, in], b: [out] or empty -> [B, out]
Vec ref_linear(const Vec& x, const Vec& w, const Vec& b, int B, int in, int out) {
  Vec y(std::size_t(B) * out);
  for (int i = 0; i < B; ++i)
    for (int o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : b[o];
      for (int k = 0; k < in; ++k) s += x[i * in + k] * w[o * in + k];
      y[i * out + o] = s;
    }
  return y;
}

Vec ref_relu(Vec x) {
  for (double& v : x) v = std::max(v, 0.0);
  return x;
}

double ref_sum(const Vec& x) {
  double s = 0;
  for (double v : x) s += v;
  return s;
}

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

// ---- the finite-difference harness -----------------------------------------------------------

struct Input {
  Shape shape;
  std::vector<float> values;
};

using EngineFn = std::function<Tensor(const std::vector<Tensor>&)>;
using RefFn = std::function<double(const Vars&)>;

struct GradResult {
  float loss = 0;
  std::vector<std::vector<float>> grads;
};

// Runs the engine's forward and backward on `device` with every input a leaf requiring grad.
GradResult run_engine(const std::vector<Input>& inputs, const EngineFn& f, Device device) {
  std::vector<Tensor> leaves;
  for (const Input& in : inputs) {
    Tensor t = Tensor::from_vector(in.values, in.shape, device);
    t.set_requires_grad(true);
    leaves.push_back(t);
  }
  Tensor loss = f(leaves);
  GradResult r;
  EXPECT_EQ(loss.numel(), 1) << "the composite must be a scalar";
  EXPECT_EQ(loss.device(), device);
  r.loss = loss.item();
  loss.backward();
  for (const Tensor& t : leaves) {
    Tensor g = t.grad();
    EXPECT_TRUE(g.defined()) << "no gradient reached an input";
    r.grads.push_back(g.defined() ? g.to_vector<float>() : std::vector<float>(t.numel(), NAN));
  }
  return r;
}

void check_gradients(const std::string& name, const std::vector<Input>& inputs, const EngineFn& f,
                     const RefFn& ref, Device device, double tol = 1e-4) {
  SCOPED_TRACE(name);
  Vars x;
  for (const Input& in : inputs) x.push_back(to_double(in.values));
  const GradResult r = run_engine(inputs, f, device);
  const double ref_loss = ref(x);
  EXPECT_NEAR(r.loss, ref_loss, 1e-5 * std::max(1.0, std::fabs(ref_loss))) << "forward value";

  const double h = 1e-6;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    std::vector<float> fd(x[i].size());
    for (std::size_t k = 0; k < x[i].size(); ++k) {
      Vars xp = x, xm = x;
      xp[i][k] += h;
      xm[i][k] -= h;
      fd[k] = float((ref(xp) - ref(xm)) / (2 * h));
    }
    double scale = 0;
    for (float v : fd) scale = std::max(scale, double(std::fabs(v)));
    EXPECT_GT(scale, 1e-3) << "input " << i << ": the reference gradient is ~0, the check would be empty";
    const double err = max_rel_diff(r.grads[i], fd);
    EXPECT_LT(err, tol) << "input " << i << " (" << inputs[i].shape.str() << "): analytic vs finite "
                        << "differences, max error relative to max |ref| = " << err;
  }
}

// ---- the composites, shared by the FD checks and the parity test -----------------------------

struct Case {
  std::string name;
  std::vector<Input> inputs;
  EngineFn engine;
  RefFn ref;
};

std::vector<Case> make_cases(uint64_t seed) {
  Generator g(seed);
  std::vector<Case> cases;

  {  // linear with bias -> cross_entropy(Sum)
    const int B = 4, in = 5, out = 3;
    auto y = random_labels(B, out, g);
    Input x{{B, in}, random_values(B * in, g)}, w{{out, in}, random_values(out * in, g)},
        b{{out}, random_values(out, g)};
    cases.push_back({"linear_bias_ce_sum", {x, w, b},
                     [y](const std::vector<Tensor>& t) {
                       Tensor labels = Tensor::from_vector(y, {B}, t[0].device());
                       return ops::cross_entropy(ops::linear(t[0], t[1], t[2]), labels, Reduction::Sum);
                     },
                     [y](const Vars& v) {
                       return ref_cross_entropy(ref_linear(v[0], v[1], v[2], B, in, out), y, out, Reduction::Sum);
                     }});
  }
  {  // linear without bias -> cross_entropy(Mean)
    const int B = 3, in = 7, out = 6;
    auto y = random_labels(B, out, g);
    Input x{{B, in}, random_values(B * in, g, -2, 2)}, w{{out, in}, random_values(out * in, g)};
    cases.push_back({"linear_nobias_ce_mean", {x, w},
                     [y](const std::vector<Tensor>& t) {
                       Tensor labels = Tensor::from_vector(y, {B}, t[0].device());
                       return ops::cross_entropy(ops::linear(t[0], t[1], Tensor()), labels, Reduction::Mean);
                     },
                     [y](const Vars& v) {
                       return ref_cross_entropy(ref_linear(v[0], v[1], {}, B, in, out), y, out, Reduction::Mean);
                     }});
  }
  {  // linear -> sum
    const int B = 5, in = 4, out = 3;
    Input x{{B, in}, random_values(B * in, g)}, w{{out, in}, random_values(out * in, g)},
        b{{out}, random_values(out, g)};
    cases.push_back({"linear_sum", {x, w, b},
                     [](const std::vector<Tensor>& t) { return ops::sum(ops::linear(t[0], t[1], t[2])); },
                     [](const Vars& v) { return ref_sum(ref_linear(v[0], v[1], v[2], B, in, out)); }});
  }
  {  // relu -> cross_entropy(Sum): relu's gradient meets a non-uniform upstream gradient
    const int B = 4, C = 5;
    auto y = random_labels(B, C, g);
    Input x{{B, C}, random_values(B * C, g, -2, 2, 0.05f)};
    cases.push_back({"relu_ce_sum", {x},
                     [y](const std::vector<Tensor>& t) {
                       Tensor labels = Tensor::from_vector(y, {B}, t[0].device());
                       return ops::cross_entropy(ops::relu(t[0]), labels, Reduction::Sum);
                     },
                     [y](const Vars& v) { return ref_cross_entropy(ref_relu(v[0]), y, C, Reduction::Sum); }});
  }
  {  // relu on a 3-d input -> flatten -> linear -> cross_entropy(Mean)
    const int B = 3, in = 6, out = 4;
    auto y = random_labels(B, out, g);
    Input x{{B, 2, 3}, random_values(B * in, g, -1, 1, 0.05f)}, w{{out, in}, random_values(out * in, g)},
        b{{out}, random_values(out, g)};
    cases.push_back({"relu3d_flatten_linear_ce_mean", {x, w, b},
                     [y](const std::vector<Tensor>& t) {
                       Tensor labels = Tensor::from_vector(y, {B}, t[0].device());
                       Tensor h = ops::flatten(ops::relu(t[0]), 1);
                       return ops::cross_entropy(ops::linear(h, t[1], t[2]), labels, Reduction::Mean);
                     },
                     [y](const Vars& v) {
                       return ref_cross_entropy(ref_linear(ref_relu(v[0]), v[1], v[2], B, in, out), y, out,
                                                Reduction::Mean);
                     }});
  }
  {  // reshape to a different 2-d layout ([3, 8] -> [4, 6]) -> linear -> cross_entropy(Sum)
    const int B = 4, in = 6, out = 3;
    auto y = random_labels(B, out, g);
    Input x{{3, 8}, random_values(24, g)}, w{{out, in}, random_values(out * in, g)};
    cases.push_back({"reshape_linear_ce_sum", {x, w},
                     [y](const std::vector<Tensor>& t) {
                       Tensor labels = Tensor::from_vector(y, {B}, t[0].device());
                       return ops::cross_entropy(ops::linear(t[0].reshape({B, in}), t[1], Tensor()), labels,
                                                 Reduction::Sum);
                     },
                     [y](const Vars& v) {
                       return ref_cross_entropy(ref_linear(v[0], v[1], {}, B, in, out), y, out, Reduction::Sum);
                     }});
  }
  {  // Tensor::flatten of [B, 2, 2, 2] -> linear -> sum
    const int B = 2, in = 8, out = 3;
    Input x{{B, 2, 2, 2}, random_values(B * in, g)}, w{{out, in}, random_values(out * in, g)},
        b{{out}, random_values(out, g)};
    cases.push_back({"flatten4d_linear_relu_sum", {x, w, b},
                     [](const std::vector<Tensor>& t) {
                       return ops::sum(ops::relu(ops::linear(t[0].flatten(), t[1], t[2])));
                     },
                     [](const Vars& v) { return ref_sum(ref_relu(ref_linear(v[0], v[1], v[2], B, in, out))); }});
  }
  // sum / mean feed a [1, 1] reshape and a linear, so their upstream gradient is not 1.
  for (bool mean : {false, true}) {
    const int out = 3;
    const int32_t label = 2;
    // Logit spread kept to a few units so the softmax does not saturate (then 1 - p loses
    // float precision and the gradient is ~0, which would make the check empty).
    const float wr = mean ? 2.0f : 0.3f;
    Input x{{2, 3, 4}, random_values(24, g)}, w{{out, 1}, random_values(out, g, -wr, wr)},
        b{{out}, random_values(out, g)};
    cases.push_back({mean ? "mean_reshape_linear_ce" : "sum_reshape_linear_ce", {x, w, b},
                     [mean](const std::vector<Tensor>& t) {
                       Tensor s = mean ? ops::mean(t[0]) : ops::sum(t[0]);
                       Tensor labels = Tensor::from_vector<int32_t>({label}, {1}, t[0].device());
                       return ops::cross_entropy(ops::linear(ops::reshape(s, {1, 1}), t[1], t[2]), labels,
                                                 Reduction::Sum);
                     },
                     [mean](const Vars& v) {
                       const double s = ref_sum(v[0]) / (mean ? double(v[0].size()) : 1.0);
                       return ref_cross_entropy(ref_linear({s}, v[1], v[2], 1, 1, out), {label}, out,
                                                Reduction::Sum);
                     }});
  }
  {  // plain sum and mean of a leaf
    Input x{{3, 5}, random_values(15, g)};
    cases.push_back({"sum", {x}, [](const std::vector<Tensor>& t) { return ops::sum(t[0]); },
                     [](const Vars& v) { return ref_sum(v[0]); }});
    cases.push_back({"mean", {x}, [](const std::vector<Tensor>& t) { return ops::mean(t[0]); },
                     [](const Vars& v) { return ref_sum(v[0]) / 15.0; }});
  }
  // cross_entropy directly on leaf logits, both reductions, with a spread of logit scales.
  for (Reduction r : {Reduction::Sum, Reduction::Mean}) {
    const int B = 5, C = 4;
    auto y = random_labels(B, C, g);
    Input x{{B, C}, random_values(B * C, g, -4, 4)};
    cases.push_back({r == Reduction::Sum ? "ce_sum" : "ce_mean", {x},
                     [y, r](const std::vector<Tensor>& t) {
                       return ops::cross_entropy(t[0], Tensor::from_vector(y, {B}, t[0].device()), r);
                     },
                     [y, r](const Vars& v) { return ref_cross_entropy(v[0], y, C, r); }});
  }
  return cases;
}

// The seed MLP's shape in miniature: linear -> relu -> linear -> relu -> linear -> CE(Mean).
// Inputs are resampled until every hidden pre-activation is at least 0.05 away from relu's kink.
// fused: each linear -> relu pair is the fused ops::linear(..., Activation::relu).
Case make_mlp_case(uint64_t seed, bool fused = false) {
  const int B = 3, in = 5, h1 = 6, h2 = 4, C = 3;
  for (uint64_t attempt = 0;; ++attempt) {
    Generator g(seed + 1000 * attempt);
    auto y = random_labels(B, C, g);
    Input x{{B, in}, random_values(B * in, g)}, w1{{h1, in}, random_values(h1 * in, g)},
        b1{{h1}, random_values(h1, g)}, w2{{h2, h1}, random_values(h2 * h1, g)}, b2{{h2}, random_values(h2, g)},
        w3{{C, h2}, random_values(C * h2, g)}, b3{{C}, random_values(C, g)};
    auto pre1 = ref_linear(to_double(x.values), to_double(w1.values), to_double(b1.values), B, in, h1);
    auto pre2 = ref_linear(ref_relu(pre1), to_double(w2.values), to_double(b2.values), B, h1, h2);
    bool ok = true;
    int active1 = 0, active2 = 0;
    for (double v : pre1) ok = ok && std::fabs(v) > 0.05, active1 += v > 0;
    for (double v : pre2) ok = ok && std::fabs(v) > 0.05, active2 += v > 0;
    if (!ok || active1 < 3 || active2 < 3) continue;
    return {fused ? "mlp3_fused_ce_mean" : "mlp3_ce_mean",
            {x, w1, b1, w2, b2, w3, b3},
            [y, fused](const std::vector<Tensor>& t) {
              auto linear_relu = [fused](const Tensor& in, const Tensor& w, const Tensor& b) {
                return fused ? ops::linear(in, w, b, ops::Activation::relu) : ops::relu(ops::linear(in, w, b));
              };
              Tensor h = linear_relu(t[0], t[1], t[2]);
              h = linear_relu(h, t[3], t[4]);
              return ops::cross_entropy(ops::linear(h, t[5], t[6]),
                                        Tensor::from_vector(y, {B}, t[0].device()), Reduction::Mean);
            },
            [y](const Vars& v) {
              auto h = ref_relu(ref_linear(v[0], v[1], v[2], B, in, h1));
              h = ref_relu(ref_linear(h, v[3], v[4], B, h1, h2));
              return ref_cross_entropy(ref_linear(h, v[5], v[6], B, h2, C), y, C, Reduction::Mean);
            }};
  }
}

class OpsTest : public DeviceTest {};

TEST_P(OpsTest, GradientsMatchFiniteDifferences) {
  std::vector<Case> cases = make_cases(42);
  cases.push_back(make_mlp_case(43));
  cases.push_back(make_mlp_case(43, /*fused=*/true));
  for (const Case& c : cases) check_gradients(c.name, c.inputs, c.engine, c.ref, device());
}

TEST_P(OpsTest, GradientsMatchFiniteDifferencesOtherSeed) {
  for (const Case& c : make_cases(7)) check_gradients(c.name, c.inputs, c.engine, c.ref, device());
}

// ---- forward values, op by op ----------------------------------------------------------------

TEST_P(OpsTest, ForwardMatchesReference) {
  const Device d = device();
  Generator g(3);
  const int B = 5, in = 7, out = 4;
  const auto xv = random_values(B * in, g), wv = random_values(out * in, g), bv = random_values(out, g);
  Tensor x = Tensor::from_vector(xv, {B, in}, d), w = Tensor::from_vector(wv, {out, in}, d),
         b = Tensor::from_vector(bv, {out}, d);

  Tensor y = ops::linear(x, w, b);
  EXPECT_EQ(y.shape(), Shape({B, out}));
  EXPECT_EQ(y.device(), d);
  const Vec yref = ref_linear(to_double(xv), to_double(wv), to_double(bv), B, in, out);
  EXPECT_LT(max_rel_diff(y.to_vector<float>(), std::vector<float>(yref.begin(), yref.end())), 1e-6) << "linear";
  Tensor y0 = ops::linear(x, w, Tensor());
  const Vec y0ref = ref_linear(to_double(xv), to_double(wv), {}, B, in, out);
  EXPECT_LT(max_rel_diff(y0.to_vector<float>(), std::vector<float>(y0ref.begin(), y0ref.end())), 1e-6)
      << "linear without bias";

  Tensor r = ops::relu(y);
  EXPECT_EQ(r.shape(), y.shape());
  const auto yv = y.to_vector<float>(), rv = r.to_vector<float>();
  for (std::size_t i = 0; i < yv.size(); ++i) EXPECT_EQ(rv[i], std::max(yv[i], 0.0f)) << "relu at " << i;
  Tensor r3 = ops::relu(Tensor::from_vector<float>({-1, 0, 2, -0.5f, 3, -4, 5, 6}, {2, 2, 2}, d));
  EXPECT_EQ(r3.shape(), Shape({2, 2, 2}));
  EXPECT_EQ(r3.to_vector<float>(), (std::vector<float>{0, 0, 2, 0, 3, 0, 5, 6}));

  Tensor s = ops::sum(x), m = ops::mean(x);
  EXPECT_EQ(s.ndim(), 0) << "sum gives a 0-d scalar";
  EXPECT_EQ(m.ndim(), 0);
  const double sref = ref_sum(to_double(xv));
  EXPECT_NEAR(s.item(), sref, 1e-5);
  EXPECT_NEAR(m.item(), sref / (B * in), 1e-6);

  Tensor v = ops::reshape(x, {in, B});
  EXPECT_EQ(v.to_vector<float>(), xv);

  const std::vector<int32_t> y_lab = {3, 0, 1, 1, 2};
  Tensor labels = Tensor::from_vector(y_lab, {B}, d);
  const double ce_sum = ref_cross_entropy(yref, y_lab, out, Reduction::Sum);
  Tensor l_sum = ops::cross_entropy(y, labels, Reduction::Sum);
  Tensor l_mean = ops::cross_entropy(y, labels, Reduction::Mean);
  Tensor l_default = ops::cross_entropy(y, labels);
  EXPECT_EQ(l_sum.numel(), 1);
  EXPECT_NEAR(l_sum.item(), ce_sum, 1e-5 * ce_sum);
  EXPECT_NEAR(l_mean.item(), ce_sum / B, 1e-5 * ce_sum / B);
  EXPECT_EQ(l_default.item(), l_mean.item()) << "the default reduction is Mean";
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
  const std::vector<float> lv = {1000, 1001, 999.5f,   //
                                 -1000, -1001, -999,   //
                                 0, 1000, -1000,       //
                                 88, 89, 90};          // exp(90) overflows float without the max shift
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
    for (int k = 0; k < 4; ++k)
      EXPECT_NEAR(gw[o * 4 + k], xv[k] + xv[4 + k] + xv[8 + k], 1e-6);
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

void expect_parity(const std::string& name, const std::vector<Input>& inputs, const EngineFn& f) {
  SCOPED_TRACE(name);
  const GradResult c = run_engine(inputs, f, Device::cpu());
  const GradResult g = run_engine(inputs, f, Device::cuda(0));
  EXPECT_LT(max_rel_diff({g.loss}, {c.loss}), 1e-5) << "forward: cpu " << c.loss << " cuda " << g.loss;
  ASSERT_EQ(c.grads.size(), g.grads.size());
  for (std::size_t i = 0; i < c.grads.size(); ++i)
    EXPECT_LT(max_rel_diff(g.grads[i], c.grads[i]), 1e-5) << "gradient of input " << i;
}

TEST(OpsParity, CpuMatchesCuda) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::vector<Case> cases = make_cases(42);
  cases.push_back(make_mlp_case(43));
  cases.push_back(make_mlp_case(43, /*fused=*/true));
  for (const Case& c : cases) expect_parity(c.name, c.inputs, c.engine);

  // The seed MLP's real sizes, where cuBLAS picks its large-matrix algorithms (and TF32 would show).
  Generator g(77);
  const int B = 64, in = 784, hidden = 512, C = 10;
  auto y = random_labels(B, C, g);
  std::vector<Input> big = {{{B, in}, random_values(B * in, g, 0, 1)},
                            {{hidden, in}, random_values(hidden * in, g, -0.035f, 0.035f)},
                            {{hidden}, random_values(hidden, g, -0.035f, 0.035f)},
                            {{C, hidden}, random_values(C * hidden, g, -0.044f, 0.044f)},
                            {{C}, random_values(C, g, -0.044f, 0.044f)}};
  expect_parity("mlp_64x784x512x10", big, [y](const std::vector<Tensor>& t) {
    Tensor h = ops::relu(ops::linear(t[0], t[1], t[2]));
    return ops::cross_entropy(ops::linear(h, t[3], t[4]), Tensor::from_vector(y, {B}, t[0].device()),
                              Reduction::Sum);
  });

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
    return std::vector<std::vector<float>>{lin.to_vector<float>(), rel.to_vector<float>(),
                                           {ops::sum(x).item()}, {ops::mean(x).item()},
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
  const std::vector<std::vector<int32_t>> labels = {{1, 1, 2}, {0, 2}, {0}};
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
    for (int64_t r = 0; r < rows; ++r) correct += pred[static_cast<std::size_t>(r)] == labels[k][static_cast<std::size_t>(r)];
    samples += rows;
  }
  const ops::ClassificationTally::Totals t = tally.read();
  EXPECT_TRUE(std::isnan(loss_sum)) << "the NaN batch's loss is NaN, and the sum with it";
  EXPECT_TRUE(std::isnan(t.loss_sum));
  EXPECT_EQ(t.correct, correct);
  EXPECT_EQ(t.correct, 5) << "batch 1: rows 0 and 2 (the tie goes to class 0, not its label 1); the NaN batch: "
                              "both (a leading NaN stays the maximum, a later one never becomes it); batch 3";
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
          Tensor loss = ops::cross_entropy(ops::linear(h, w2, Tensor()), Tensor::from_vector(labels, {B}, d),
                                           Reduction::Sum);
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
