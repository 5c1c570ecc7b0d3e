// nn::init: the moments and bounds of large draws against the distribution each initializer
// promises (within a few standard errors), PyTorch's fans and gains against hand values, the same
// values for the same seed on every device, and errors that name the function and the argument.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cumulus/core/error.h"
#include "cumulus/nn/init.h"
#include "cumulus/nn/layers.h"
#include "test_util.h"

namespace cumulus {
namespace {

using namespace nn::init;
using testing::DeviceTest;

struct Moments {
  double mean, std, min, max;
};

Moments moments(const Tensor& t) {
  const std::vector<float> v = t.to_vector<float>();
  double sum = 0.0, sq = 0.0;
  for (float x : v) sum += x;
  const double mean = sum / static_cast<double>(v.size());
  for (float x : v) sq += (x - mean) * (x - mean);
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return {mean, std::sqrt(sq / static_cast<double>(v.size() - 1)), *lo, *hi};
}

// Sample mean and std of n draws from a distribution of std `sigma` lie within 5 standard errors
// (sigma / sqrt(n) and about sigma / sqrt(2 n); the uniform's is smaller, sigma * sqrt(0.8 / (2 n)),
// so the normal's bound is the looser one). A failure by chance: below 1e-6 per check.
void expect_moments(const Tensor& t, double mean, double sigma, const std::string& what) {
  const Moments m = moments(t);
  const double n = static_cast<double>(t.numel());
  EXPECT_NEAR(m.mean, mean, 5.0 * sigma / std::sqrt(n)) << what << ": mean";
  EXPECT_NEAR(m.std, sigma, 5.0 * sigma / std::sqrt(2.0 * n)) << what << ": std";
}

// The uniform's draws stay in [lo, hi) and, with this many of them, come within 1e-3 of the
// range's width of both ends (missing the end 1e-3 of the range in 1e5 draws: e^-100).
void expect_uniform_range(const Tensor& t, double lo, double hi, const std::string& what) {
  const Moments m = moments(t);
  ASSERT_GE(t.numel(), 100000);
  EXPECT_GE(m.min, lo) << what;
  EXPECT_LT(m.max, hi) << what;
  EXPECT_LT(m.min, lo + 1e-3 * (hi - lo)) << what;
  EXPECT_GT(m.max, hi - 1e-3 * (hi - lo)) << what;
}

// What the call throws (InvalidArgument), or a failure.
template <typename Fn>
std::string invalid_argument_message(Fn fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << "no InvalidArgument thrown";
  return "";
}

class InitTest : public DeviceTest {};

TEST_P(InitTest, NormalMomentsAndSeed) {
  Tensor t = Tensor::zeros(Shape{1 << 20}, DType::f32, device());
  normal_(t, 1.5f, 2.0f, 7);
  expect_moments(t, 1.5, 2.0, "normal_(1.5, 2)");
  // The same seed again: the same values; another seed: others.
  Tensor again = Tensor::zeros(Shape{1 << 20}, DType::f32, device());
  normal_(again, 1.5f, 2.0f, 7);
  EXPECT_EQ(again.to_vector<float>(), t.to_vector<float>());
  normal_(again, 1.5f, 2.0f, 8);
  EXPECT_NE(again.to_vector<float>(), t.to_vector<float>());
}

TEST_P(InitTest, UniformMomentsAndBounds) {
  Tensor t = Tensor::zeros(Shape{1024, 1024}, DType::f32, device());
  uniform_(t, -3.0f, 5.0f, 1);
  expect_uniform_range(t, -3.0, 5.0, "uniform_(-3, 5)");
  expect_moments(t, 1.0, 8.0 / std::sqrt(12.0), "uniform_(-3, 5)");
  // a == b is allowed (PyTorch too): every value is a.
  uniform_(t, 2.0f, 2.0f, 1);
  EXPECT_EQ(moments(t).min, 2.0);
  EXPECT_EQ(moments(t).max, 2.0);
}

TEST_P(InitTest, ConstantZerosOnes) {
  Tensor t = Tensor::full(Shape{3, 4}, 9.0f, device());
  constant_(t, -0.25f);
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(12, -0.25f));
  zeros_(t);
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(12, 0.0f));
  ones_(t);
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(12, 1.0f));
}

TEST(Init, FansAsPyTorch) {
  // torch.nn.init._calculate_fan_in_and_fan_out on these shapes.
  EXPECT_EQ(calculate_fan_in_and_fan_out(Shape{3, 5}).fan_in, 5);  // Linear(5, 3).weight
  EXPECT_EQ(calculate_fan_in_and_fan_out(Shape{3, 5}).fan_out, 3);
  EXPECT_EQ(calculate_fan_in_and_fan_out(Shape{8, 4, 3, 3}).fan_in, 36);  // Conv2d(4, 8, 3).weight
  EXPECT_EQ(calculate_fan_in_and_fan_out(Shape{8, 4, 3, 3}).fan_out, 72);
  EXPECT_EQ(calculate_fan_in_and_fan_out(Shape{6, 2, 5}).fan_in, 10);  // Conv1d(2, 6, 5).weight
  EXPECT_EQ(calculate_fan_in_and_fan_out(Shape{6, 2, 5}).fan_out, 30);
  EXPECT_THROW(calculate_fan_in_and_fan_out(Shape{5}), InvalidArgument);
}

TEST(Init, GainsAsPyTorch) {
  EXPECT_FLOAT_EQ(calculate_gain(Nonlinearity::linear), 1.0f);
  EXPECT_FLOAT_EQ(calculate_gain(Nonlinearity::sigmoid), 1.0f);
  EXPECT_FLOAT_EQ(calculate_gain(Nonlinearity::tanh), 5.0f / 3.0f);
  EXPECT_FLOAT_EQ(calculate_gain(Nonlinearity::relu), std::sqrt(2.0f));
  EXPECT_FLOAT_EQ(calculate_gain(Nonlinearity::leaky_relu), std::sqrt(2.0f / (1.0f + 0.01f * 0.01f)));
  EXPECT_FLOAT_EQ(calculate_gain(Nonlinearity::leaky_relu, 0.2f), std::sqrt(2.0f / 1.04f));
  EXPECT_FLOAT_EQ(calculate_gain(Nonlinearity::leaky_relu, 0.0f), std::sqrt(2.0f));
  EXPECT_FLOAT_EQ(calculate_gain(Nonlinearity::selu), 0.75f);
}

TEST_P(InitTest, XavierStdAndBound) {
  // [out 384, in 512]: std = gain * sqrt(2 / 896).
  const double std_expected = 0.5 * std::sqrt(2.0 / 896.0);
  Tensor t = Tensor::zeros(Shape{384, 512}, DType::f32, device());
  xavier_uniform_(t, 0.5f, 3);
  expect_uniform_range(t, -std::sqrt(3.0) * std_expected, std::sqrt(3.0) * std_expected, "xavier_uniform_");
  expect_moments(t, 0.0, std_expected, "xavier_uniform_");
  xavier_normal_(t, 0.5f, 4);
  expect_moments(t, 0.0, std_expected, "xavier_normal_");
}

TEST_P(InitTest, KaimingStdPerModeAndNonlinearity) {
  // A conv weight [out 64, in 32, 7, 7]: fan_in 1568, fan_out 3136 (the two differ by sqrt(2) in
  // std, far more than the 5 standard errors allowed).
  Tensor t = Tensor::zeros(Shape{64, 32, 7, 7}, DType::f32, device());
  kaiming_normal_(t, 0.0f, FanMode::fan_in, Nonlinearity::relu, 5);
  expect_moments(t, 0.0, std::sqrt(2.0) / std::sqrt(1568.0), "kaiming_normal_ relu fan_in");
  kaiming_normal_(t, 0.2f, FanMode::fan_out, Nonlinearity::leaky_relu, 6);
  expect_moments(t, 0.0, std::sqrt(2.0 / 1.04) / std::sqrt(3136.0), "kaiming_normal_ leaky_relu(0.2) fan_out");
  const double tanh_std = 5.0 / 3.0 / std::sqrt(3136.0);
  kaiming_uniform_(t, 0.0f, FanMode::fan_out, Nonlinearity::tanh, 7);
  expect_uniform_range(t, -std::sqrt(3.0) * tanh_std, std::sqrt(3.0) * tanh_std, "kaiming_uniform_ tanh fan_out");
  expect_moments(t, 0.0, tanh_std, "kaiming_uniform_ tanh fan_out");
  // linear: gain 1, whatever a is.
  kaiming_uniform_(t, 3.0f, FanMode::fan_in, Nonlinearity::linear, 8);
  const double bound = std::sqrt(3.0) / std::sqrt(1568.0);
  expect_uniform_range(t, -bound, bound, "kaiming_uniform_ linear fan_in");
}

TEST_P(InitTest, LinearsDefaultIsKaimingUniformWithSqrt5) {
  // nn.Linear's documented init: kaiming_uniform_(a = sqrt(5)) has bound 1 / sqrt(in_features).
  Tensor t = Tensor::zeros(Shape{300, 400}, DType::f32, device());
  kaiming_uniform_(t, std::sqrt(5.0f), FanMode::fan_in, Nonlinearity::leaky_relu, 9);
  expect_uniform_range(t, -1.0 / 20.0, 1.0 / 20.0, "kaiming_uniform_(sqrt 5)");
}

TEST_P(InitTest, SameSeedSameValuesOnEveryDevice) {
  // The host draws are the reference: a device's tensor must hold them bit for bit.
  Tensor here = Tensor::zeros(Shape{33, 65}, DType::f32, device());
  Tensor host = Tensor::zeros(Shape{33, 65});
  xavier_normal_(here, 1.0f, 11);
  xavier_normal_(host, 1.0f, 11);
  EXPECT_EQ(here.to_vector<float>(), host.to_vector<float>());
  kaiming_uniform_(here, 0.0f, FanMode::fan_in, Nonlinearity::relu, 12);
  kaiming_uniform_(host, 0.0f, FanMode::fan_in, Nonlinearity::relu, 12);
  EXPECT_EQ(here.to_vector<float>(), host.to_vector<float>());
}

TEST_P(InitTest, GeneratorAdvancesAsASeededStream) {
  // Two calls on one generator draw consecutive values: the second call continues the first.
  Generator gen(21);
  Tensor a = Tensor::zeros(Shape{100}, DType::f32, device());
  Tensor b = Tensor::zeros(Shape{100}, DType::f32, device());
  uniform_(a, 0.0f, 1.0f, gen);
  uniform_(b, 0.0f, 1.0f, gen);
  EXPECT_EQ(gen.offset(), 200u);
  Tensor both = Tensor::zeros(Shape{200}, DType::f32, device());
  uniform_(both, 0.0f, 1.0f, 21);
  std::vector<float> expected = a.to_vector<float>(), second = b.to_vector<float>();
  expected.insert(expected.end(), second.begin(), second.end());
  EXPECT_EQ(both.to_vector<float>(), expected);
}

TEST_P(InitTest, ParameterStaysALeafThatRequiresGrad) {
  // The initializers write values outside autograd: a registered parameter stays a leaf whose
  // gradient buffer is untouched.
  Generator gen(0);
  nn::Linear linear(8, 4, gen, device());
  const Tensor& w = linear.weight();
  const void* data = w.raw_data();
  normal_(w, 0.0f, 0.02f, 1);
  EXPECT_TRUE(w.requires_grad());
  EXPECT_TRUE(w.is_leaf());
  EXPECT_TRUE(w.grad_stale());
  EXPECT_EQ(w.raw_data(), data);  // in place
  expect_moments(w, 0.0, 0.02, "normal_ on a parameter");
}

TEST_P(InitTest, ViewWritesOnlyItsRows) {
  Tensor t = Tensor::zeros(Shape{4, 3}, DType::f32, device());
  ones_(t.narrow_rows(1, 2));
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0}));
}

TEST_P(InitTest, ZeroElementTensorIsLeftAlone) {
  Tensor t = Tensor::zeros(Shape{0, 5}, DType::f32, device());
  EXPECT_NO_THROW(kaiming_normal_(t, 0.0f, FanMode::fan_out, Nonlinearity::relu, 1));  // fan_out 0
  EXPECT_NO_THROW(xavier_uniform_(Tensor::zeros(Shape{0, 0}, DType::f32, device()), 1.0f, 1));
}

TEST_P(InitTest, BadArgumentsNameFunctionAndArgument) {
  Tensor t = Tensor::zeros(Shape{4, 4}, DType::f32, device());
  Tensor v = Tensor::zeros(Shape{4}, DType::f32, device());
  std::string m = invalid_argument_message([&] { normal_(t, 0.0f, -1.0f, 0); });
  EXPECT_NE(m.find("nn::init::normal_"), std::string::npos) << m;
  EXPECT_NE(m.find("std must be >= 0"), std::string::npos) << m;
  m = invalid_argument_message([&] { uniform_(t, 1.0f, 0.0f, 0); });
  EXPECT_NE(m.find("nn::init::uniform_: a must be <= b"), std::string::npos) << m;
  m = invalid_argument_message([&] { xavier_uniform_(v, 1.0f, 0); });
  EXPECT_NE(m.find("nn::init::xavier_uniform_"), std::string::npos) << m;
  EXPECT_NE(m.find("at least 2 dimensions"), std::string::npos) << m;
  m = invalid_argument_message([&] { xavier_normal_(t, -1.0f, 0); });
  EXPECT_NE(m.find("nn::init::xavier_normal_: gain must be >= 0"), std::string::npos) << m;
  m = invalid_argument_message([&] { xavier_normal_(v, 1.0f, 0); });
  EXPECT_NE(m.find("nn::init::xavier_normal_"), std::string::npos) << m;
  m = invalid_argument_message([&] { kaiming_normal_(v, 0.0f, FanMode::fan_in, Nonlinearity::relu, 0); });
  EXPECT_NE(m.find("nn::init::kaiming_normal_"), std::string::npos) << m;
  m = invalid_argument_message([&] { normal_(t, NAN, 1.0f, 0); });
  EXPECT_NE(m.find("nn::init::normal_: mean must be finite"), std::string::npos) << m;
  m = invalid_argument_message([&] { kaiming_uniform_(t, INFINITY, FanMode::fan_in, Nonlinearity::leaky_relu, 0); });
  EXPECT_NE(m.find("nn::init::kaiming_uniform_: a must be finite"), std::string::npos) << m;
  m = invalid_argument_message([&] { ones_(Tensor::zeros(Shape{2}, DType::i32, device())); });
  EXPECT_NE(m.find("nn::init::ones_: t must be f32, got i32"), std::string::npos) << m;
  m = invalid_argument_message([&] { zeros_(Tensor()); });
  EXPECT_NE(m.find("nn::init::zeros_: t is undefined"), std::string::npos) << m;
  // A refused call writes nothing.
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(16, 0.0f));
}

CUMULUS_INSTANTIATE_DEVICES(InitTest);

}  // namespace
}  // namespace cumulus
