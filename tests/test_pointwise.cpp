// The pointwise ops' errors and edge cases (their values and gradients are op cases:
// tests/op_cases/cases_pointwise.cpp): shapes that do not broadcast, mixed dtypes, integer inputs,
// empty outputs, width-1 softmax rows, large logits, dropout's argument checks, mask statistics and
// memory, the operators, the nn modules (Dropout's offsets, eval mode, recompute), and the CPU
// kernels' threads (the same bits at one thread and two), vector code (its cap) and OpenBLAS's kernels.
#include <gtest/gtest.h>
#include <strings.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "cumulus/autograd/node.h"
#include "cumulus/core/threads.h"
#include "cumulus/cumulus.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/loss_kernels.h"
#include "kernels/cpu/vec_math.h"
#include "test_util.h"

namespace cumulus::testing {
namespace {

// Runs `fn`, expecting an exception of type E whose message holds every one of `parts`.
template <typename E, typename Fn>
void expect_error(Fn fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no exception";
  } catch (const E& e) {
    for (const std::string& part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

Tensor leaf(const std::vector<float>& v, const Shape& shape, Device device) {
  Tensor t = Tensor::from_vector(v, shape, device);
  t.set_requires_grad(true);
  return t;
}

class PointwiseTest : public DeviceTest {};
CUMULUS_INSTANTIATE_DEVICES(PointwiseTest);

TEST_P(PointwiseTest, ShapesThatDoNotBroadcastAreRefusedByName) {
  const Tensor a = Tensor::zeros({3, 4}, DType::f32, device()), b = Tensor::zeros({5}, DType::f32, device());
  expect_error<InvalidArgument>([&] { ops::add(a, b); }, {"add", "[3, 4]", "[5]", "do not broadcast"});
  expect_error<InvalidArgument>([&] { (void)(b / a); }, {"div", "[5]", "[3, 4]"});
  const Tensor c = Tensor::zeros({2, 3, 4}, DType::f32, device()), d = Tensor::zeros({2, 4}, DType::f32, device());
  expect_error<InvalidArgument>([&] { ops::mul(c, d); }, {"mul", "[2, 3, 4]", "[2, 4]"});
}

// Integer tensors are promoted by the arithmetic ops (tests/test_math.cpp), not by the others.
TEST_P(PointwiseTest, MixedAndIntegerDtypesAreRefused) {
  const Tensor a = Tensor::zeros({3}, DType::f32, device()), b = Tensor::zeros({3}, DType::bf16, device());
  expect_error<InvalidArgument>([&] { ops::sub(a, b); }, {"sub", "same dtype", "f32", "bf16"});
  const Tensor i = Tensor::zeros({3}, DType::i32, device()), u = Tensor::zeros({3}, DType::u8, device());
  expect_error<InvalidArgument>([&] { ops::add(u, a); }, {"add", "f32, bf16, f16, i32 or i64", "u8"});
  expect_error<InvalidArgument>([&] { ops::tanh(i); }, {"tanh", "i32"});
  expect_error<InvalidArgument>([&] { ops::softmax(i); }, {"softmax", "i32"});
  expect_error<InvalidArgument>([&] { (void)(u * 2.0f); }, {"mul", "u8"});
}

TEST_P(PointwiseTest, OperandsOnTwoDevicesAreRefused) {
  if (!cuda_available()) GTEST_SKIP() << "needs a CUDA device beside the CPU";
  const Tensor a = Tensor::zeros({3}, DType::f32, Device::cpu()), b = Tensor::zeros({3}, DType::f32, Device::cuda(0));
  expect_error<DeviceError>([&] { ops::add(a, b); }, {"add", "cpu", "cuda"});
}

// [0, 3] + [3] is an empty [0, 3]; b's gradient is zeros (no output element read it).
TEST_P(PointwiseTest, AnEmptyOutputGivesZeroGradients) {
  const Tensor a = leaf({}, {0, 3}, device()), b = leaf({1, 2, 3}, {3}, device());
  const Tensor y = a * b;
  EXPECT_EQ(y.shape(), Shape({0, 3}));
  ops::sum(y).backward();
  EXPECT_EQ(b.grad().to_vector<float>(), std::vector<float>({0, 0, 0}));
  EXPECT_EQ(a.grad().numel(), 0);
}

TEST_P(PointwiseTest, SoftmaxRowsOfWidthOneAreOneWithZeroGradient) {
  const Tensor x = leaf({0.5f, -3.0f, 7.0f}, {3, 1}, device());
  const Tensor y = ops::softmax(x), z = ops::log_softmax(x);
  EXPECT_EQ(y.to_vector<float>(), std::vector<float>({1, 1, 1}));
  EXPECT_EQ(z.to_vector<float>(), std::vector<float>({0, 0, 0}));
  ops::sum(ops::mul(ops::add(y, z), Tensor::from_vector<float>({1, 2, 3}, {3, 1}, device()))).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), std::vector<float>({0, 0, 0}));
}

// Around the row maximum: logits of 1000 neither overflow nor lose the differences between them.
TEST_P(PointwiseTest, SoftmaxIsStableForLargeInputs) {
  const Tensor x = Tensor::from_vector<float>({1000, 1001, 1002, -1000, -1001, -1002}, {2, 3}, device());
  const std::vector<float> y = ops::softmax(x).to_vector<float>(), z = ops::log_softmax(x).to_vector<float>();
  const double s = 1 + std::exp(-1.0) + std::exp(-2.0);
  const double want[] = {std::exp(-2.0) / s, std::exp(-1.0) / s, 1 / s, 1 / s, std::exp(-1.0) / s, std::exp(-2.0) / s};
  for (int i = 0; i < 6; ++i) {
    EXPECT_NEAR(y[i], want[i], 1e-6) << i;
    EXPECT_NEAR(z[i], std::log(want[i]), 1e-5) << i;
  }
}

TEST_P(PointwiseTest, SoftmaxOfAScalarIsRefused) {
  const Tensor x = Tensor::zeros(Shape{}, DType::f32, device());
  expect_error<InvalidArgument>([&] { ops::log_softmax(x); }, {"log_softmax", "dimension"});
}

// The operators record as the ops: y = 2 x - x / b + 1 - (-x) * x, gradients by hand.
TEST_P(PointwiseTest, OperatorsComputeAndDifferentiateAsTheOps) {
  const Tensor x = leaf({1, -2, 3, 0.5f}, {2, 2}, device()), b = leaf({2, 4}, {2}, device());
  const Tensor y = 2.0f * x - x / b + 1.0f - (-x) * x;
  const std::vector<float> xv = {1, -2, 3, 0.5f}, bv = {2, 4};
  const std::vector<float> got = y.to_vector<float>();
  std::vector<float> want_dx(4), want_db(2, 0.0f);
  for (int i = 0; i < 4; ++i) {
    const float xi = xv[i], bi = bv[i % 2];
    EXPECT_FLOAT_EQ(got[i], 2 * xi - xi / bi + 1 + xi * xi) << i;
    want_dx[i] = 2 - 1 / bi + 2 * xi;
    want_db[i % 2] += xi / (bi * bi);
  }
  ops::sum(y).backward();
  const std::vector<float> dx = x.grad().to_vector<float>(), db = b.grad().to_vector<float>();
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(dx[i], want_dx[i]) << i;
  for (int i = 0; i < 2; ++i) EXPECT_FLOAT_EQ(db[i], want_db[i]) << i;
}

TEST_P(PointwiseTest, DropoutChecksP) {
  const Tensor x = Tensor::zeros({4}, DType::f32, device());
  for (float p : {-0.1f, 1.0001f, 1.5f, NAN})
    expect_error<InvalidArgument>([&] { ops::dropout(x, p, true, 0, 0); }, {"dropout", "[0, 1]"});
  expect_error<InvalidArgument>([&] { nn::Dropout(1.5f); }, {"Dropout", "[0, 1]"});
}

// p = 1, as PyTorch: evaluation passes the input through; training drops every element, and its
// gradient is 0.
TEST_P(PointwiseTest, DropoutOfOneDropsEverythingWhileTraining) {
  const Tensor x = leaf({1, -2, 3}, {3}, device());
  EXPECT_EQ(ops::dropout(x, 1.0f, false, 1, 2).raw_data(), x.raw_data());
  const Tensor y = ops::dropout(x, 1.0f, true, 1, 2);
  EXPECT_EQ(y.to_vector<float>(), std::vector<float>(3, 0.0f));
  ops::sum(y).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), std::vector<float>(3, 0.0f));
  nn::Dropout layer(1.0f);
  layer.eval();
  EXPECT_EQ(layer.forward(x).raw_data(), x.raw_data());
}

// As PyTorch's x * mask / (1 - p) (issue 59): a NaN or infinity stays non-finite whether its
// element is kept or dropped (NaN * 0 is NaN, inf * 0 NaN), so the non-finite guard sees it; a
// dropped NaN gradient likewise reaches x.
TEST_P(PointwiseTest, DropoutKeepsNonFiniteValuesAsPyTorch) {
  const int64_t n = 64;
  std::vector<float> xv(n, NAN);
  for (int64_t i = 0; i < n; i += 2) xv[i] = i % 4 == 0 ? INFINITY : 1.0f;
  const Tensor x = leaf(xv, {n}, device());
  const Tensor y = ops::dropout(x, 0.5f, true, 7, 1);
  const std::vector<float> yv = y.to_vector<float>();
  int64_t dropped_nans = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool kept = ops::dropout_keeps(7, 1, i, 0.5f);
    if (std::isnan(xv[i]) || (std::isinf(xv[i]) && !kept)) EXPECT_TRUE(std::isnan(yv[i])) << i;
    else EXPECT_EQ(yv[i], kept ? xv[i] * 2.0f : 0.0f) << i;
    dropped_nans += std::isnan(xv[i]) && !kept;
  }
  EXPECT_GT(dropped_nans, 0) << "no NaN was dropped: the case shows nothing";
  const Tensor z = leaf(std::vector<float>(n, 1.0f), {n}, device());
  const Tensor w = ops::dropout(z, 0.5f, true, 7, 1);
  ops::sum(ops::mul(w, Tensor::from_vector(xv, {n}, device()))).backward();  // dy = x's values
  const std::vector<float> dz = z.grad().to_vector<float>();
  for (int64_t i = 0; i < n; ++i)
    if (std::isnan(xv[i])) EXPECT_TRUE(std::isnan(dz[i])) << "the NaN gradient at " << i;
}

// Round to nearest even bf16, for finite values: the test's own, independent of the kernels'.
float bf16_round(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  bits = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// x / x's gradient is 0; in bf16 what is left is rounding (Note [16-bit gradient sums]). PyTorch's
// is bf16(g / x) - bf16(g * bf16(bf16(x / x) / x)): each contribution rounded, its b-gradient in
// two rounded steps. Ours must leave no more in total over values where one rounding of the f32
// sum left about 1.5 times PyTorch's.
TEST_P(PointwiseTest, SixteenBitSelfDivisionGradientIsNoWorseThanPyTorchs) {
  const int64_t n = 4096;
  std::vector<float> xv(n), gv(n);
  for (int64_t i = 0; i < n; ++i) {
    xv[i] = bf16_round(0.25f + 3.0f * std::fmod(static_cast<float>(i) * 0.6180339887f, 1.0f));
    gv[i] = (i % 2 == 0 ? 1.0f : -1.0f) * static_cast<float>(1 + i % 16) / 8.0f;  // exact in bf16
  }
  Tensor x = ops::cast(Tensor::from_vector(xv, {n}, device()), DType::bf16).detach();
  x.set_requires_grad(true);
  const Tensor g = ops::cast(Tensor::from_vector(gv, {n}, device()), DType::bf16);
  ops::sum(ops::cast(ops::mul(ops::div(x, x), g), DType::f32)).backward();
  const std::vector<float> ours = ops::cast(x.grad(), DType::f32).to_vector<float>();
  double our_error = 0.0, pytorch_error = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    our_error += std::fabs(ours[i]);
    pytorch_error += std::fabs(bf16_round(gv[i] / xv[i]) - bf16_round(gv[i] * bf16_round(1.0f / xv[i])));
  }
  EXPECT_GT(pytorch_error, 0.0) << "the values show no rounding: the check would be empty";
  EXPECT_LE(our_error, pytorch_error) << "the summed |gradient| of x / x over " << n << " bf16 values";
}

// Off (eval, or p = 0) it is the input itself: the same storage, nothing allocated or recorded.
TEST_P(PointwiseTest, DropoutOffIsTheInputItself) {
  const Tensor x = leaf({1, 2, 3}, {3}, device());
  EXPECT_EQ(ops::dropout(x, 0.5f, false, 1, 2).raw_data(), x.raw_data());
  EXPECT_EQ(ops::dropout(x, 0.0f, true, 1, 2).raw_data(), x.raw_data());
}

// Over 2^20 elements the kept fraction is 1 - p within 5 standard deviations; kept elements are
// x / (1 - p); another offset or seed draws another mask, the same ones the same mask.
TEST_P(PointwiseTest, DropoutKeepsAFractionOneMinusP) {
  const int64_t n = 1 << 20;
  const Tensor x = Tensor::full({n}, 1.0f, device());
  for (float p : {0.1f, 0.5f, 0.9f}) {
    const std::vector<float> y = ops::dropout(x, p, true, 42, 3).to_vector<float>();
    int64_t kept = 0;
    for (float v : y) {
      ASSERT_TRUE(v == 0.0f || v == 1.0f / (1.0f - p)) << v;
      kept += v != 0.0f;
    }
    const double sigma = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(static_cast<double>(kept), n * (1 - p), 5 * sigma) << "p " << p;
  }
  const std::vector<float> a = ops::dropout(x, 0.5f, true, 42, 3).to_vector<float>();
  EXPECT_EQ(a, ops::dropout(x, 0.5f, true, 42, 3).to_vector<float>());
  for (auto [seed, offset] : {std::pair<uint64_t, uint64_t>{42, 4}, {43, 3}}) {
    const std::vector<float> b = ops::dropout(x, 0.5f, true, seed, offset).to_vector<float>();
    int64_t same = 0;
    for (int64_t i = 0; i < n; ++i) same += a[i] == b[i];
    EXPECT_NEAR(static_cast<double>(same), n / 2.0, 5 * std::sqrt(n / 4.0)) << "seed " << seed << " offset " << offset;
  }
  for (int64_t i = 0; i < 1000; ++i) EXPECT_EQ(a[i] != 0.0f, ops::dropout_keeps(42, 3, i, 0.5f)) << i;
}

// Note [Dropout recomputes its mask]: recording a dropout allocates its output and nothing else.
TEST_P(PointwiseTest, DropoutSavesNoMask) {
  const Tensor x = leaf(std::vector<float>(4096, 1.0f), {4096}, device());
  CachingAllocator& allocator = allocator_for(device());
  const Tensor offset = Tensor::from_vector(std::vector<int64_t>{1}, {1}, device());
  const int64_t before = allocator.stats().allocated;
  const Tensor y = ops::dropout(x, 0.5f, true, 1, offset);
  EXPECT_EQ(allocator.stats().allocated - before, static_cast<int64_t>(y.allocated_bytes()));
  ops::sum(y).backward();
  const std::vector<float> dx = x.grad().to_vector<float>(), yv = y.to_vector<float>();
  for (int64_t i = 0; i < 4096; ++i) ASSERT_EQ(dx[i], yv[i]) << i;  // x = 1: both are the mask times 2
}

TEST_P(PointwiseTest, DropoutModuleAdvancesItsOffsetInTrainingOnly) {
  const Tensor x = Tensor::full({256}, 1.0f, device());
  nn::Dropout a(0.5f, 7), b(0.5f, 7);
  const std::vector<float> first = a(x).to_vector<float>(), second = a(x).to_vector<float>();
  EXPECT_NE(first, second) << "each call draws a fresh mask";
  EXPECT_EQ(a.calls(), 2u);
  EXPECT_EQ(first, ops::dropout(x, 0.5f, true, 7, 0).to_vector<float>());
  EXPECT_EQ(second, ops::dropout(x, 0.5f, true, 7, 1).to_vector<float>());
  EXPECT_EQ(b(x).to_vector<float>(), first) << "the same seed, the same sequence";
  b.eval();
  EXPECT_EQ(b(x).raw_data(), x.raw_data());
  EXPECT_EQ(b.calls(), 1u) << "eval calls draw nothing";
  EXPECT_TRUE(b.state_dict().empty());
  b.train();
  b.set_calls(5);
  EXPECT_EQ(b(x).to_vector<float>(), ops::dropout(x, 0.5f, true, 7, 5).to_vector<float>()) << "a restored count";
  EXPECT_EQ(b.calls(), 6u);
}

// Each call takes its own offset from the device counter: two calls before one backward keep two
// masks apart (the first call's gradient is its own mask's, not the second's).
TEST_P(PointwiseTest, DropoutCalledTwiceBeforeItsBackwardKeepsEachMask) {
  const Tensor x = leaf(std::vector<float>(512, 1.0f), {512}, device());
  nn::Dropout drop(0.5f, 3);
  const Tensor first = drop(x), second = drop(x);
  ops::sum(first).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), first.to_vector<float>());
  EXPECT_NE(first.to_vector<float>(), second.to_vector<float>());
}

// A recomputed segment replays the module's mask: the gradients are the stored run's, bit for bit.
TEST_P(PointwiseTest, DropoutUnderRecomputeGivesTheStoredRunsGradients) {
  auto run = [&](bool recompute) {
    Generator gen(5);
    nn::Sequential model;
    model.add(std::make_shared<nn::Linear>(6, 16, gen, device()));
    model.add(std::make_shared<nn::Dropout>(0.4f, 11));
    model.add(std::make_shared<nn::GELU>());
    model.add(std::make_shared<nn::Linear>(16, 3, gen, device()));
    if (recompute) model.set_recompute({{0, 3}});
    const Tensor x = uniform(Shape{4, 6}, -1, 1, gen).to(device());
    std::vector<std::vector<float>> grads;
    for (int step = 0; step < 2; ++step) {  // two micro-batches: two masks
      model.zero_grad();
      ops::sum(model(x)).backward();
      for (const Tensor& p : model.parameters()) grads.push_back(p.grad().to_vector<float>());
    }
    return grads;
  };
  const auto stored = run(false), recomputed = run(true);
  ASSERT_EQ(stored.size(), recomputed.size());
  for (std::size_t i = 0; i < stored.size(); ++i) EXPECT_EQ(stored[i], recomputed[i]) << "parameter " << i;
  EXPECT_NE(stored[0], stored[stored.size() / 2]) << "the two micro-batches had the same mask";
}

TEST_P(PointwiseTest, ActivationModulesRunTheirOps) {
  const Tensor x = Tensor::from_vector<float>({-1.5f, 0.0f, 2.0f}, {3}, device());
  EXPECT_EQ(nn::GELU()(x).to_vector<float>(), ops::gelu(x).to_vector<float>());
  EXPECT_EQ(nn::GELU(ops::GeluApproximation::tanh)(x).to_vector<float>(),
            ops::gelu(x, ops::GeluApproximation::tanh).to_vector<float>());
  EXPECT_EQ(nn::Tanh()(x).to_vector<float>(), ops::tanh(x).to_vector<float>());
  EXPECT_EQ(nn::Sigmoid()(x).to_vector<float>(), ops::sigmoid(x).to_vector<float>());
  EXPECT_EQ(nn::SiLU()(x).to_vector<float>(), ops::silu(x).to_vector<float>());
  EXPECT_NE(ops::gelu(x).to_vector<float>(), ops::gelu(x, ops::GeluApproximation::tanh).to_vector<float>());
}

// Note [CPU kernel threads]: the activations (and exp, log, sqrt, rsqrt, abs), softmax (over the
// last dimension and the first), layer norm and rms norm split their work across cpu_threads() threads with
// the same bits as one thread; rows wider than the kernels' chunks (layer norm's parameter gradients
// sum 256 columns at a time) and enough elements for several chunks.
std::vector<std::vector<float>> cpu_results_at(int threads) {
  set_cpu_threads(threads);
  constexpr int64_t kRows = 300, kCols = 1000;
  Generator gen(5);
  std::vector<float> xv(kRows * kCols), cv(xv.size()), wv(kCols);
  gen.fill_uniform(xv.data(), static_cast<int64_t>(xv.size()), -4.0f, 4.0f);
  gen.fill_uniform(cv.data(), static_cast<int64_t>(cv.size()), -1.0f, 1.0f);
  gen.fill_uniform(wv.data(), kCols, 0.5f, 1.5f);
  const Tensor c = Tensor::from_vector(cv, Shape{kRows, kCols});
  const std::vector<std::function<Tensor(const Tensor&, const Tensor&)>> ops_under_test = {
      [](const Tensor& x, const Tensor&) { return ops::gelu(x); },
      [](const Tensor& x, const Tensor&) { return ops::gelu(x, ops::GeluApproximation::tanh); },
      [](const Tensor& x, const Tensor&) { return ops::tanh(x); },
      [](const Tensor& x, const Tensor&) { return ops::sigmoid(x); },
      [](const Tensor& x, const Tensor&) { return ops::silu(x); },
      [](const Tensor& x, const Tensor&) { return ops::softmax(x); },
      [](const Tensor& x, const Tensor&) { return ops::log_softmax(x); },
      [](const Tensor& x, const Tensor& w) { return ops::layer_norm(x, x.size(-1), w, w, 1e-5f); },
      [](const Tensor& x, const Tensor& w) { return ops::rms_norm(x, Shape{x.size(-1)}, w); },
      [](const Tensor& x, const Tensor&) { return ops::softmax(x, 0); },
      [](const Tensor& x, const Tensor&) { return ops::exp(x); },
      [](const Tensor& x, const Tensor&) { return ops::log(ops::abs(x)); },
      [](const Tensor& x, const Tensor&) { return ops::sqrt(ops::abs(x)); },
      [](const Tensor& x, const Tensor&) { return ops::rsqrt(ops::abs(x)); },
  };
  std::vector<std::vector<float>> out;
  for (const auto& op : ops_under_test) {
    const Tensor x = leaf(xv, Shape{kRows, kCols}, Device::cpu()), w = leaf(wv, Shape{kCols}, Device::cpu());
    const Tensor y = op(x, w);
    ops::sum(y * c).backward();
    out.push_back(y.to_vector<float>());
    out.push_back(x.grad().to_vector<float>());
    if (w.grad().defined()) out.push_back(w.grad().to_vector<float>());
  }
  return out;
}

TEST(CpuThreads, GiveTheBitsOfOneThread) {
  const int threads = cpu_threads();
  const auto one = cpu_results_at(1), two = cpu_results_at(2);
  set_cpu_threads(threads);
  ASSERT_EQ(one.size(), two.size());
  for (std::size_t i = 0; i < one.size(); ++i) EXPECT_EQ(one[i], two[i]) << "result " << i;
}

// ---- the CPU's broadcast fast paths (kernels/cpu/pointwise.cpp) and vector activations ----

// Equal bits, or both NaN.
bool same_value(float a, float b) { return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0; }

void expect_same_values(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!same_value(got[i], want[i])) {
      ADD_FAILURE() << what << " [" << i << "]: " << got[i] << " vs " << want[i];
      return;
    }
}

// The values of v stored as dtype and read back (the rounding a 16-bit tensor gives them).
std::vector<float> rounded(const std::vector<float>& v, DType dtype) {
  if (v.empty()) return v;
  return Tensor::from_vector(v, Shape{static_cast<int64_t>(v.size())}).to(dtype).to(DType::f32).to_vector<float>();
}

// x [R, n] op the broadcast operand p ([R, 1] per row, else [n]), p second unless p_first: the
// forward and both gradients from the element rules, each broadcast sum from 0 in double in
// row-major order (Note [Broadcast geometry]), the reference the fast paths must match bit for bit.
struct BroadcastCase {
  int64_t rows, cols;
  bool per_row, p_first;
  char op;  // + - * /
};

float apply(char op, float a, float b) {
  switch (op) {
    case '+': return a + b;
    case '-': return a - b;
    case '*': return a * b;
    default: return a / b;
  }
}
float grad_of(char op, int operand, float dy, float a, float b) {
  switch (op) {
    case '+': return dy;
    case '-': return operand == 0 ? dy : -dy;
    case '*': return operand == 0 ? dy * b : dy * a;
    default: return operand == 0 ? dy / b : -dy * ((a / b) / b);
  }
}

Tensor binary(char op, const Tensor& a, const Tensor& b) {
  switch (op) {
    case '+': return ops::add(a, b);
    case '-': return ops::sub(a, b);
    case '*': return ops::mul(a, b);
    default: return ops::div(a, b);
  }
}

void check_broadcast(const BroadcastCase& c, DType dtype) {
  SCOPED_TRACE(std::string("dtype ") + std::to_string(static_cast<int>(dtype)) + ", op " + c.op + ", rows " +
               std::to_string(c.rows) + ", cols " + std::to_string(c.cols) + (c.per_row ? " per row" : " per column") +
               (c.p_first ? ", broadcast first" : ""));
  const int64_t np = c.per_row ? c.rows : c.cols;
  Generator gen(static_cast<uint64_t>(c.rows * 131 + c.cols));
  std::vector<float> xv(static_cast<std::size_t>(c.rows * c.cols)), pv(static_cast<std::size_t>(np)), dv(xv.size());
  gen.fill_uniform(xv.data(), static_cast<int64_t>(xv.size()), 0.25f, 2.0f);  // as a divisor, in f16's range
  for (std::size_t i = 0; i < xv.size(); i += 2) xv[i] = -xv[i];
  gen.fill_uniform(pv.data(), np, 0.5f, 2.0f);
  gen.fill_uniform(dv.data(), static_cast<int64_t>(dv.size()), -1.0f, 1.0f);
  if (xv.size() > 3) xv[1] = NAN, xv[2] = INFINITY;  // a NaN and an inf in the sums they reach
  xv = rounded(xv, dtype), pv = rounded(pv, dtype), dv = rounded(dv, dtype);
  const Shape xs{c.rows, c.cols}, ps = c.per_row ? Shape{c.rows, 1} : Shape{c.cols};
  std::vector<float> y(xv.size()), gx(xv.size());
  std::vector<double> gp(static_cast<std::size_t>(np), 0.0);
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t j = 0; j < c.cols; ++j) {
      const std::size_t i = static_cast<std::size_t>(r * c.cols + j), k = static_cast<std::size_t>(c.per_row ? r : j);
      const float a = c.p_first ? pv[k] : xv[i], b = c.p_first ? xv[i] : pv[k];
      y[i] = apply(c.op, a, b);
      gx[i] = grad_of(c.op, c.p_first ? 1 : 0, dv[i], a, b);
      gp[k] += grad_of(c.op, c.p_first ? 0 : 1, dv[i], a, b);
    }
  std::vector<float> gpf(gp.begin(), gp.end());
  if ((c.per_row ? c.cols : c.rows) == 1)  // not broadcast after all: its one term, no sum (-0 stays)
    for (int64_t i = 0; i < np; ++i) {
      const float a = c.p_first ? pv[i] : xv[i], b = c.p_first ? xv[i] : pv[i];
      gpf[i] = grad_of(c.op, c.p_first ? 0 : 1, dv[i], a, b);
    }
  for (int threads : {1, 2}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    set_cpu_threads(threads);
    const Tensor x = Tensor::from_vector(xv, xs).to(dtype).set_requires_grad(true);
    const Tensor p = Tensor::from_vector(pv, ps).to(dtype).set_requires_grad(true);
    const Tensor dy = Tensor::from_vector(dv, xs).to(dtype);
    for (float times : {1.0f, 2.0f}) {  // the second backward adds into the gradients (beta 1)
      const Tensor out = c.p_first ? binary(c.op, p, x) : binary(c.op, x, p);
      expect_same_values(out.to(DType::f32).to_vector<float>(), rounded(y, dtype), "forward");
      ops::sum(ops::cast(ops::mul(out, dy), DType::f32)).backward();
      std::vector<float> want_x = rounded(gx, dtype), want_p = rounded(gpf, dtype);
      for (float& v : want_x) v *= times;
      for (float& v : want_p) v *= times;
      expect_same_values(x.grad().to(DType::f32).to_vector<float>(), want_x, "the full operand's gradient");
      expect_same_values(p.grad().to(DType::f32).to_vector<float>(), want_p, "the broadcast operand's gradient");
    }
  }
}

// The broadcasts with a fast path (one scalar per row, a row vector over the rows) give the
// element rules' bits, their gradient sums broadcast_grad_element's: every op, either operand
// broadcast, sizes around the vector widths and their tails, a NaN and an inf, beta 0 and 1, 16-bit
// types, one thread and two (and, through tests/CMakeLists.txt, each CPU capability).
TEST(CpuBroadcast, RowScalarsAndRowVectorsGiveTheElementRulesBits) {
  const int threads = cpu_threads();
  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (char op : {'+', '-', '*', '/'})
      for (bool per_row : {true, false})
        for (bool p_first : {false, true})
          for (int64_t rows : {1, 3, 8, 17, 40})
            for (int64_t cols : {1, 2, 7, 8, 9, 33, 65}) check_broadcast({rows, cols, per_row, p_first, op}, dtype);
  set_cpu_threads(threads);
}

// The f32 rows of the forward (vec::binary_f32 at each capability): a same-shape op and an op
// with a one-element operand, at lengths around both vector widths and their tails, with a NaN, an
// inf and a zero divisor among the values, give the element rule's bits.
TEST(CpuBroadcast, SameShapeAndScalarOperandsGiveTheElementRulesBits) {
  for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1000}) {
    Generator gen(static_cast<uint64_t>(n));
    std::vector<float> av(static_cast<std::size_t>(n)), bv(av.size());
    gen.fill_uniform(av.data(), n, -2.0f, 2.0f);
    gen.fill_uniform(bv.data(), n, -2.0f, 2.0f);
    av[0] = n > 2 ? NAN : av[0];
    bv[static_cast<std::size_t>(n - 1)] = n > 3 ? INFINITY : bv[static_cast<std::size_t>(n - 1)];
    if (n > 4) bv[2] = 0.0f;
    const Tensor a = Tensor::from_vector(av, Shape{n}), b = Tensor::from_vector(bv, Shape{n});
    const Tensor s = Tensor::from_vector(std::vector<float>{1.7f}, Shape{1});
    for (char op : {'+', '-', '*', '/'}) {
      SCOPED_TRACE(std::string("op ") + op + ", n " + std::to_string(n));
      std::vector<float> same(av.size()), by_scalar(av.size()), scalar_by(av.size());
      for (std::size_t i = 0; i < av.size(); ++i) {
        same[i] = apply(op, av[i], bv[i]);
        by_scalar[i] = apply(op, av[i], 1.7f);
        scalar_by[i] = apply(op, 1.7f, bv[i]);
      }
      expect_same_values(binary(op, a, b).to_vector<float>(), same, "same shape");
      expect_same_values(binary(op, a, s).to_vector<float>(), by_scalar, "a op scalar");
      expect_same_values(binary(op, s, b).to_vector<float>(), scalar_by, "scalar op b");
    }
  }
}

// ReLU's f32 forward (vec::relu_f32 at each capability) gives the scalar rule's bits: -0 to +0, a
// NaN kept (its payload too), at lengths around both vector widths.
TEST(CpuActivations, ReluForwardGivesTheScalarRulesBits) {
  for (int64_t n : {1, 7, 8, 9, 16, 17, 33, 1000}) {
    Generator gen(static_cast<uint64_t>(n) + 11);
    std::vector<float> xv(static_cast<std::size_t>(n));
    gen.fill_uniform(xv.data(), n, -2.0f, 2.0f);
    const float specials[] = {-0.0f, 0.0f, NAN, -INFINITY, INFINITY, -1e-40f};
    for (std::size_t i = 0; i < 6 && i < xv.size(); ++i) xv[xv.size() - 1 - i] = specials[i];
    std::vector<uint32_t> want(xv.size());
    for (std::size_t i = 0; i < xv.size(); ++i) {
      const float y = xv[i] <= 0.0f ? 0.0f : xv[i];
      std::memcpy(&want[i], &y, sizeof y);
    }
    const std::vector<float> got = ops::relu(Tensor::from_vector(xv, Shape{n})).to_vector<float>();
    for (std::size_t i = 0; i < got.size(); ++i) {
      uint32_t bits = 0;
      std::memcpy(&bits, &got[i], sizeof bits);
      EXPECT_EQ(bits, want[i]) << "n " << n << ", element " << i << " of " << xv[i];
    }
  }
}

// The AVX2 rows of sigmoid, silu and silu's gradient (vec_math_avx2.cpp's one_plus_exp_minus: 2^n
// added to the exponent field) give the AVX-512 rows' bits (scalef's one rounding of p 2^n), so a
// change of either shows: over the clamps' edges (-104, -87.34, -86), the overflow of p 2^128
// (sigmoid's subnormal results near -88.5, silu's near 88.5), signed zeros, infinities, NaN payloads
// (quiet and signalling, both signs), subnormal inputs and random bit patterns. Called directly,
// whatever the capability cap: on a CPU with both instruction sets.
TEST(CpuActivations, SigmoidAndSiluAvx2RowsGiveTheAvx512RowsBits) {
#if defined(__x86_64__)
  if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx512f")))
    GTEST_SKIP() << "needs AVX2, FMA and AVX-512F";
  std::vector<float> x;
  for (float v = -120.0f; v <= 120.0f; v += 0.0625f) x.push_back(v);
  for (float edge : {104.0f, 87.34f, 87.33654f, 86.0f, 17.0f, 88.37626f, 88.5f, 88.72f, 88.73f, 89.0f}) {
    float up = edge, down = edge;
    for (int i = 0; i < 200; ++i, up = std::nextafter(up, INFINITY), down = std::nextafter(down, 0.0f))
      for (float v : {up, -up, down, -down}) x.push_back(v);
  }
  for (uint32_t bits : {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u, 0x7FC12345u,
                        0xFFC54321u, 0x7F800001u, 0xFF800123u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x00800000u, 0x80800000u,
                        0x00000001u, 0x80000001u, 0x000A0000u, 0x3F800000u, 0xBF800000u}) {
    float v;
    std::memcpy(&v, &bits, sizeof v);
    x.push_back(v);
  }
  uint32_t state = 20261129u;
  for (int i = 0; i < (1 << 16); ++i) {
    state = state * 1664525u + 1013904223u;
    float v;
    std::memcpy(&v, &state, sizeof v);
    x.push_back(v);
  }
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> dy(x.size());
  Generator gen(29);
  gen.fill_uniform(dy.data(), n, -2.0f, 2.0f);
  std::vector<float> a(x.size()), b(x.size());
  const auto expect_same_bits = [&](const char* what) {
    int shown = 0;
    for (std::size_t i = 0; i < x.size() && shown < 10; ++i)
      if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
        ADD_FAILURE() << what << "(" << x[i] << "): AVX2 " << a[i] << ", AVX-512 " << b[i];
        ++shown;
      }
  };
  kernels::vec::sigmoid_f32(x.data(), a.data(), n);
  kernels::vec512::sigmoid_f32(x.data(), b.data(), n);
  expect_same_bits("sigmoid");
  kernels::vec::silu_f32(x.data(), a.data(), n);
  kernels::vec512::silu_f32(x.data(), b.data(), n);
  expect_same_bits("silu");
  kernels::vec::silu_grad_f32(x.data(), dy.data(), a.data(), n);
  kernels::vec512::silu_grad_f32(x.data(), dy.data(), b.data(), n);
  expect_same_bits("silu_grad");
#else
  GTEST_SKIP() << "x86-64 only";
#endif
}

// ReLU's gradient rows (vec::relu_grad_f32, vec512::relu_grad_f32) give the scalar rule's bits,
// y <= 0 ? +0 : dy: signed zeros, NaN outputs (which pass dy on), infinities and subnormals, at
// lengths around the vector widths, out of place and in place over dy.
TEST(CpuActivations, ReluGradientRowsGiveTheScalarRulesBits) {
#if defined(__x86_64__)
  const auto float_of = [](uint32_t bits) {
    float v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  };
  const auto bits_of = [](float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    return bits;
  };
  if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")))
    GTEST_SKIP() << "needs AVX2 and FMA";
  std::vector<float> y;
  for (uint32_t bits : {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u, 0x00000001u,
                        0x80000001u, 0x3F800000u, 0xBF800000u})
    y.push_back(float_of(bits));
  Generator gen(31);
  std::vector<float> more(77);
  gen.fill_uniform(more.data(), static_cast<int64_t>(more.size()), -1.0f, 1.0f);
  y.insert(y.end(), more.begin(), more.end());
  std::vector<float> dy(y.size());
  gen.fill_uniform(dy.data(), static_cast<int64_t>(dy.size()), -2.0f, 2.0f);
  dy[3] = -0.0f;
  using Rows = void (*)(const float*, const float*, float*, int64_t);
  std::vector<std::pair<const char*, Rows>> paths = {{"AVX2", kernels::vec::relu_grad_f32}};
  if (__builtin_cpu_supports("avx512f")) paths.emplace_back("AVX-512", kernels::vec512::relu_grad_f32);
  for (const auto& [name, rows] : paths)
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{15}, int64_t{16}, int64_t{17},
                      static_cast<int64_t>(y.size())}) {
      std::vector<float> out(static_cast<std::size_t>(n)), in_place(dy.begin(), dy.begin() + n);
      rows(y.data(), dy.data(), out.data(), n);
      rows(y.data(), in_place.data(), in_place.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const float want = y[i] <= 0.0f ? 0.0f : dy[i];
        EXPECT_EQ(bits_of(out[i]), bits_of(want)) << name << " n " << n << " y " << y[i];
        EXPECT_EQ(bits_of(in_place[i]), bits_of(want)) << name << " in place, n " << n;
      }
    }
#else
  GTEST_SKIP() << "x86-64 only";
#endif
}

// A Linear's bias gradient (sum_rows_cpu: the vector column sums at each capability) gives the bits
// of the scalar loop, each column's float adds in row order, at widths around the vector blocks and
// at one thread and two; terms of mixed magnitudes make the order show in the bits.
TEST(CpuLinear, BiasGradientSumsGiveTheRowOrderLoopsBits) {
  const int threads = cpu_threads();
  for (int64_t cols : {1, 7, 16, 17, 127, 128, 129, 384, 1000})
    for (int64_t rows : {1, 5, 512})
      for (float beta : {0.0f, 1.0f, 0.5f}) {
        Generator gen(static_cast<uint64_t>(cols * 1000 + rows));
        std::vector<float> x(static_cast<std::size_t>(rows * cols)), start(static_cast<std::size_t>(cols));
        gen.fill_uniform(x.data(), rows * cols, -1.0f, 1.0f);
        gen.fill_uniform(start.data(), cols, -1.0f, 1.0f);
        for (std::size_t i = 0; i < x.size(); i += 3) x[i] *= 4096.0f;
        std::vector<float> want = start;
        for (int64_t c = 0; c < cols; ++c) {
          float sum = beta == 0.0f ? 0.0f : start[c] * beta;
          for (int64_t r = 0; r < rows; ++r) sum += x[r * cols + c];
          want[c] = sum;
        }
        for (int t : {1, 2}) {
          set_cpu_threads(t);
          std::vector<float> got = start;
          kernels::sum_rows_cpu(x.data(), rows, cols, beta, got.data());
          EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)))
              << cols << " columns, " << rows << " rows, beta " << beta << ", " << t << " threads";
        }
      }
  set_cpu_threads(threads);
}

// Enough rows for several threads' chunks: the same bits at one thread and two.
TEST(CpuBroadcast, LargeBroadcastsGiveTheElementRulesBits) {
  const int threads = cpu_threads();
  for (bool per_row : {true, false}) check_broadcast({700, 129, per_row, false, '*'}, DType::f32);
  set_cpu_threads(threads);
}

// The activations' vector code (Note [Vector erf], sigmoid's exp) and the scalar rules stay within
// a few roundings of the exact functions, over the erf table's intervals and past them, at every
// tail length, with the special values the scalar rules give.
TEST(CpuActivations, GeluAndSigmoidAreWithinAFewRoundings) {
  std::vector<float> xv;
  for (float x = -12.0f; x <= 12.0f; x += 0.01953125f * 1.37f) xv.push_back(x);
  for (float x : {0.0f, -0.0f, 1e-30f, -1e-30f, 3.92f, 4.0f, -4.0f, 5.657f, 100.0f, -100.0f, 0.5f, 1.0f, 3.5f})
    xv.push_back(x);
  const double eps = std::ldexp(1.0, -24);
  for (std::size_t n : {xv.size(), std::size_t{1}, std::size_t{7}, std::size_t{9}, std::size_t{17}}) {
    const std::vector<float> part(xv.begin(), xv.begin() + static_cast<std::ptrdiff_t>(n));
    const Tensor x = Tensor::from_vector(part, Shape{static_cast<int64_t>(n)}).set_requires_grad(true);
    const Tensor g = ops::gelu(x), s = ops::sigmoid(x);
    ops::sum(ops::add(g, s)).backward();
    const auto gv = g.to_vector<float>(), sv = s.to_vector<float>(), dx = x.grad().to_vector<float>();
    for (std::size_t i = 0; i < n; ++i) {
      const double v = part[i], cdf = 0.5 * (1.0 + std::erf(v / std::sqrt(2.0)));
      const double pdf = std::exp(-0.5 * v * v) / std::sqrt(2.0 * M_PI), sig = 1.0 / (1.0 + std::exp(-v));
      EXPECT_NEAR(gv[i], v * cdf, 4 * eps * std::fabs(v)) << "gelu(" << v << ")";
      EXPECT_NEAR(sv[i], sig, 6 * eps * sig + 1e-38) << "sigmoid(" << v << ")";  // below FLT_MIN: 0
      EXPECT_NEAR(dx[i], cdf + v * pdf + sig * (1.0 - sig), 8 * eps) << "the gradient at " << v;
    }
  }
  const std::vector<float> specials{NAN, INFINITY, -INFINITY};
  const Tensor x = Tensor::from_vector(specials, Shape{3});
  const auto gv = ops::gelu(x).to_vector<float>(), sv = ops::sigmoid(x).to_vector<float>();
  EXPECT_TRUE(std::isnan(gv[0]) && std::isnan(sv[0]));
  EXPECT_EQ(gv[1], INFINITY);
  EXPECT_TRUE(std::isnan(gv[2]));  // -inf * 0, as the scalar rule
  EXPECT_EQ(sv[1], 1.0f);
  EXPECT_EQ(sv[2], 0.0f);
}

// silu's vector path (the vector sigmoid, then x * s) and the scalar rule (x / (1 + exp(-x))) stay
// within a few roundings of x sigmoid(x) and its derivative s (1 + x (1 - s)), at every tail
// length, in f32 and bf16 (widened a block at a time); the special values are PyTorch's.
TEST(CpuActivations, SiluIsWithinAFewRoundings) {
  std::vector<float> xv;
  for (float x = -30.0f; x <= 30.0f; x += 0.0371f) xv.push_back(x);
  for (float x : {0.0f, -0.0f, 1e-30f, -1e-30f, 88.0f, -88.0f, -100.0f}) xv.push_back(x);
  const double eps = std::ldexp(1.0, -24);
  for (std::size_t n : {xv.size(), std::size_t{1}, std::size_t{7}, std::size_t{9}, std::size_t{17}}) {
    const std::vector<float> part(xv.begin(), xv.begin() + static_cast<std::ptrdiff_t>(n));
    const Tensor x = Tensor::from_vector(part, Shape{static_cast<int64_t>(n)}).set_requires_grad(true);
    const Tensor y = ops::silu(x);
    ops::sum(y).backward();
    const auto yv = y.to_vector<float>(), dx = x.grad().to_vector<float>();
    for (std::size_t i = 0; i < n; ++i) {
      const double v = part[i], sig = 1.0 / (1.0 + std::exp(-v));
      EXPECT_NEAR(yv[i], v * sig, 8 * eps * std::fabs(v * sig) + 1e-38) << "silu(" << v << ")";
      EXPECT_NEAR(dx[i], sig * (1.0 + v * (1.0 - sig)), 16 * eps * (1.0 + std::fabs(v) * sig)) << "at " << v;
    }
  }
  const Tensor specials = Tensor::from_vector(std::vector<float>{NAN, INFINITY, -INFINITY, -1000.0f}, Shape{4});
  const auto sv = ops::silu(specials).to_vector<float>();
  EXPECT_TRUE(std::isnan(sv[0]));
  EXPECT_EQ(sv[1], INFINITY);
  EXPECT_TRUE(std::isnan(sv[2]));  // -inf / inf, as PyTorch's
  EXPECT_EQ(sv[3], 0.0f);
  const Tensor h = Tensor::from_vector(std::vector<float>{-3.0f, 0.5f, 2.0f}, Shape{3}).to(DType::bf16);
  const auto hv = ops::silu(h).to(DType::f32).to_vector<float>();
  for (std::size_t i = 0; i < hv.size(); ++i) {
    const double v = std::vector<float>{-3.0f, 0.5f, 2.0f}[i];
    EXPECT_NEAR(hv[i], v / (1.0 + std::exp(-v)), std::ldexp(1.0, -8) * std::fabs(v)) << "bf16 silu(" << v << ")";
  }
}

// Cross-entropy's rows (kernels/cpu/cross_entropy_row.h): the loss within a few roundings of the
// double result and each gradient row softmax minus the label's one-hot, at widths around the
// vector widths, the label anywhere in the row (the tail included), large logits.
TEST(CpuCrossEntropy, RowsMatchTheDoubleResult) {
  for (int64_t classes : {1, 2, 7, 8, 9, 16, 17, 65, 300})
    for (float spread : {1.0f, 80.0f}) {
      SCOPED_TRACE("classes " + std::to_string(classes) + ", spread " + std::to_string(spread));
      constexpr int64_t kRows = 11;
      Generator gen(static_cast<uint64_t>(classes));
      std::vector<float> xv(static_cast<std::size_t>(kRows * classes));
      gen.fill_uniform(xv.data(), kRows * classes, -spread, spread);
      std::vector<int32_t> labels(kRows);
      for (int64_t r = 0; r < kRows; ++r) labels[r] = static_cast<int32_t>((r * 7 + classes - 1) % classes);
      const Tensor x = Tensor::from_vector(xv, Shape{kRows, classes}).set_requires_grad(true);
      const Tensor loss = ops::cross_entropy(x, Tensor::from_vector(labels, Shape{kRows}), ops::Reduction::Sum);
      loss.backward();
      const auto dx = x.grad().to_vector<float>();
      double want = 0.0;
      for (int64_t r = 0; r < kRows; ++r) {
        const float* row = xv.data() + r * classes;
        double m = row[0], s = 0.0;
        for (int64_t j = 0; j < classes; ++j) m = std::max(m, static_cast<double>(row[j]));
        for (int64_t j = 0; j < classes; ++j) s += std::exp(row[j] - m);
        want += m + std::log(s) - row[labels[r]];
        for (int64_t j = 0; j < classes; ++j) {
          const double p = std::exp(row[j] - m) / s - (j == labels[r] ? 1.0 : 0.0);
          EXPECT_NEAR(dx[static_cast<std::size_t>(r * classes + j)], p, 1e-6) << "row " << r << ", class " << j;
        }
      }
      EXPECT_NEAR(loss.to_vector<float>()[0], want, 1e-6 * std::max(1.0, std::fabs(want)));
    }
}

// The backward reads the rows' maxima and log sums the forward saved: its gradient has the bits of
// the kernel that computes them again (stats null), with an ignored row, summed and per-row losses,
// beside the tails of both vector widths.
TEST(CpuCrossEntropy, SavedRowStatisticsGiveTheRecomputedGradientsBits) {
  for (int64_t classes : {1, 9, 17, 65})
    for (ops::Reduction reduction : {ops::Reduction::Sum, ops::Reduction::None}) {
      SCOPED_TRACE("classes " + std::to_string(classes));
      constexpr int64_t kRows = 7, kIgnore = -100;
      Generator gen(static_cast<uint64_t>(classes) + 3);
      std::vector<float> xv(static_cast<std::size_t>(kRows * classes)), dv(kRows);
      gen.fill_uniform(xv.data(), kRows * classes, -20.0f, 20.0f);
      gen.fill_uniform(dv.data(), kRows, 0.5f, 2.0f);
      std::vector<int32_t> labels(kRows);
      for (int64_t r = 0; r < kRows; ++r) labels[r] = r == 2 ? kIgnore : static_cast<int32_t>((r * 5) % classes);
      const Tensor x = Tensor::from_vector(xv, Shape{kRows, classes}).set_requires_grad(true);
      const Tensor loss = ops::cross_entropy(x, Tensor::from_vector(labels, Shape{kRows}), reduction, kIgnore);
      const bool per_row = reduction == ops::Reduction::None;
      if (per_row) run_backward(loss, Tensor::from_vector(dv, Shape{kRows}));
      else loss.backward();
      std::vector<float> want(xv.size());
      const float one = 1.0f;
      kernels::cross_entropy_rows_backward_cpu(xv.data(), labels.data(), kRows, classes, kIgnore,
                                               per_row ? dv.data() : &one, per_row ? 1 : 0, 1.0f, 0.0f, want.data());
      expect_same_values(x.grad().to_vector<float>(), want, "dx");
    }
}

// cpu_capability() names the widest vector code the kernels run, capped by CUMULUS_CPU_CAPABILITY
// (tests/CMakeLists.txt runs this binary again under avx2 and under scalar).
TEST(CpuCapability, FollowsTheEnvironmentCap) {
  const std::string got = cpu_capability();
  ASSERT_TRUE(got == "avx512" || got == "avx2" || got == "scalar") << got;
  const char* cap = std::getenv("CUMULUS_CPU_CAPABILITY");
  const std::string want = cap != nullptr ? cap : "";
  if (want == "scalar") EXPECT_EQ(got, "scalar");
  if (want == "avx2") EXPECT_NE(got, "avx512");
#if defined(__x86_64__)
  if (want.empty() || want == "avx512") {
    if (__builtin_cpu_supports("avx512f")) EXPECT_EQ(got, "avx512");
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) EXPECT_EQ(got, "avx2");
  }
#endif
}

// OpenBLAS runs the widest kernels the CPU has, also where its build does not know the CPU (Note
// [OpenBLAS kernels on an unrecognized CPU]: SSE3 kernels on an AVX-512 Xeon, 6.8x slower), and its
// Haswell kernels on AMD Zen 4 (measured faster there than its AVX-512 ones). cumulus sets
// OPENBLAS_CORETYPE only to SkylakeX or Haswell; another value is the environment's choice.
#if defined(__x86_64__)
// AMD family 0x19 with AVX-512, read from the vendor string and the processor signature.
bool zen4() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  __get_cpuid(0, &a, &b, &c, &d);
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  __get_cpuid(1, &a, &b, &c, &d);
  const unsigned family = ((a >> 8) & 0xf) + ((a >> 20) & 0xff);
  return std::string(vendor) == "AuthenticAMD" && family == 0x19 && __builtin_cpu_supports("avx512f");
}
#endif

TEST(BlasCore, IsTheWidestTheCpuRuns) {
#if defined(__x86_64__)
  const std::string core = blas_core();
  const auto is_one_of = [&core](std::initializer_list<const char*> names) {
    for (const char* name : names)
      if (strcasecmp(core.c_str(), name) == 0) return true;
    return false;
  };
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  if (zen4()) {
    if (env != nullptr && strcasecmp(env, "Haswell") != 0) GTEST_SKIP() << "OPENBLAS_CORETYPE=" << env;
    EXPECT_TRUE(is_one_of({"Haswell"})) << core;
  } else if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl")) {
    if (env != nullptr && strcasecmp(env, "SkylakeX") != 0) GTEST_SKIP() << "OPENBLAS_CORETYPE=" << env;
    EXPECT_TRUE(is_one_of({"SkylakeX", "Cooperlake", "SapphireRapids"})) << core;
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    if (env != nullptr && strcasecmp(env, "Haswell") != 0) GTEST_SKIP() << "OPENBLAS_CORETYPE=" << env;
    EXPECT_TRUE(is_one_of({"Haswell", "Zen", "Excavator"})) << core;
  }
#else
  GTEST_SKIP() << "OpenBLAS's x86-64 kernels only";
#endif
}

}  // namespace
}  // namespace cumulus::testing
