// The convolutional ops, layers and model. The ops' values and gradients (conv2d, batch_norm2d in
// training and evaluation, max_pool2d, the conv-bn-relu-pool block) against double references, and
// CPU against cuDNN, are the op-case registry's (tests/op_cases/cases_conv.cpp, Note [Op cases]).
// Here:
//  - shapes and argument checks; max pooling's tie rule and NaN;
//  - CPU-versus-cuDNN parity of the running statistics (CUDA only), and the algorithm cache (one
//    entry per shape and direction); which of cuDNN's math types an f32 convolution takes, and (CUDA
//    only, at the end of the binary) the algorithm and math type each convolution ran;
//  - gradients accumulating in the persistent buffers (inside the GEMM / cuDNN), stale overwrite;
//  - batch norm's running statistics and evaluation mode against hand-computed values;
//  - the CNN: PyTorch's state_dict names and order, buffers, train/eval, a safetensors round trip;
//  - batch norm under accumulation: 16 x 4 equals four separate micro-batches of 16, each with its
//    own statistics, and differs from one batch of 64 (which the same model in evaluation mode
//    matches);
//  - the tracker's activation bytes for the CNN against the analytic sum of what its ops save.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cumulus/autograd/grad_mode.h"
#include "cumulus/io/safetensors.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/memory/tracker.h"
#include "cumulus/models/cnn.h"
#include "cumulus/nn/conv_layers.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/norm_layers.h"
#include "cumulus/ops/convolution.h"
#include "cumulus/ops/linear.h"
#include "cumulus/ops/loss.h"
#include "cumulus/ops/normalization.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/ops/shape.h"
#include "cumulus/optim/sgd.h"
#include "cumulus/tensor/random.h"
#include "engine/core/cudnn_context.h"
#include "cumulus/train/trainer.h"
#if CUMULUS_WITH_CUDNN
#include "kernels/cuda/cudnn_kernels.h"
#endif
#include "test_util.h"

namespace cumulus {
namespace {

using testing::DeviceTest;
using testing::max_rel_diff;

std::vector<float> random_values(std::size_t n, Generator& g, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(n);
  g.fill_uniform(v.data(), static_cast<int64_t>(n), lo, hi);
  return v;
}

#if CUMULUS_WITH_CUDNN
// Every CUDA case here names what cuDNN ran: at the end of the binary (each shard's), the algorithm
// and math type chosen for each convolution shape and direction, and f32 never on tensor-op math
// (Note [cuDNN math types] in kernels/cuda/cudnn_conv.cu). Nothing on a machine without a GPU.
class CudnnAlgorithmReport : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const std::string& line : cudnn::conv_algorithm_report()) {
      std::printf("cuDNN conv2d %s\n", line.c_str());
      if (line.find(" f32 ") != std::string::npos)
        EXPECT_TRUE(line.find("CUDNN_FMA_MATH") != std::string::npos ||
                    line.find("CUDNN_DEFAULT_MATH") != std::string::npos)
            << line;
    }
  }
};
[[maybe_unused]] ::testing::Environment* const cudnn_algorithm_report =
    ::testing::AddGlobalTestEnvironment(new CudnnAlgorithmReport);

// Which of cuDNN's ranked math types an f32 convolution takes: FMA or default, tensor-op math only
// when asked; 16-bit data any.
TEST(CudnnConvMath, F32TakesFmaOrDefaultMathAndTensorOpsOnlyWhenAsked) {
  for (cudnnMathType_t m : {CUDNN_FMA_MATH, CUDNN_DEFAULT_MATH})
    EXPECT_TRUE(kernels::conv_math_accepted(DType::f32, m, false)) << kernels::conv_math_name(m);
  for (cudnnMathType_t m : {CUDNN_TENSOR_OP_MATH, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION}) {
    EXPECT_FALSE(kernels::conv_math_accepted(DType::f32, m, false)) << kernels::conv_math_name(m);
    EXPECT_TRUE(kernels::conv_math_accepted(DType::f32, m, true)) << kernels::conv_math_name(m);
    for (DType d : {DType::bf16, DType::f16}) EXPECT_TRUE(kernels::conv_math_accepted(d, m, false));
  }
  EXPECT_STREQ(kernels::conv_math_name(CUDNN_DEFAULT_MATH), "CUDNN_DEFAULT_MATH");
}
#endif

class CnnOpsTest : public DeviceTest {};

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

TEST_P(CnnOpsTest, MaxPoolRoutesGradientsToTheFirstMaximumOrTheLastNaN) {
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
    if (d.is_cpu()) {
      // PyTorch's rule (a NaN replaces the maximum so far): the window's last NaN gets the gradient,
      // as torch.nn.functional.max_pool2d does on these values.
      Tensor two_nans = Tensor::from_vector<float>({NAN, 1, NAN, 2}, {1, 1, 2, 2}, d);
      two_nans.set_requires_grad(true);
      ops::sum(ops::max_pool2d(two_nans, 2, stride)).backward();
      EXPECT_EQ(two_nans.grad().to_vector<float>(), (std::vector<float>{0, 0, 1, 0}));
    }
  }
}

// Every width from 1 to 19 windows (the vector rows' full and masked steps), values drawn from a
// few that tie (+0 and -0 among them) and two NaNs of different payloads: each window's output and
// gradient, bit for bit, against the rule written out here (the last NaN, else the first largest, in
// the order of pool_window_argmax). The CPU's 2x2 fast path at whatever capability runs the binary.
TEST_P(CnnOpsTest, MaxPoolTwoByTwoFollowsItsRuleBitForBitAtEveryWidth) {
  if (!device().is_cpu()) GTEST_SKIP() << "the CPU's rows (cuDNN breaks ties its own way)";
  const float nan_a = std::nanf("1"), nan_b = std::nanf("2");
  const float values[] = {-1.0f, 0.0f, -0.0f, 1.0f, 2.0f, 2.0f, nan_a, nan_b};
  const auto bits = [](float v) {
    uint32_t b;
    std::memcpy(&b, &v, sizeof b);
    return b;
  };
  Generator gen(11);
  for (int64_t out_w = 1; out_w <= 19; ++out_w) {
    SCOPED_TRACE("windows a row " + std::to_string(out_w));
    const int64_t planes = 3, out_h = 2, w = 2 * out_w, h = 2 * out_h;
    std::vector<float> u(static_cast<std::size_t>(planes * h * w)), xv(u.size());
    gen.fill_uniform(u.data(), static_cast<int64_t>(u.size()), 0.0f, 8.0f);
    for (std::size_t i = 0; i < u.size(); ++i) xv[i] = values[std::min<int>(7, static_cast<int>(u[i]))];
    std::vector<float> gv(static_cast<std::size_t>(planes * out_h * out_w));
    for (std::size_t i = 0; i < gv.size(); ++i) gv[i] = 1.0f + static_cast<float>(i);
    Tensor x = Tensor::from_vector(xv, {1, planes, h, w}, Device::cpu());
    x.set_requires_grad(true);
    const Tensor y = ops::max_pool2d(x, 2);
    ops::sum(ops::mul(y, Tensor::from_vector(gv, {1, planes, out_h, out_w}, Device::cpu()))).backward();
    const std::vector<float> yv = y.to_vector<float>(), dx = x.grad().to_vector<float>();
    for (int64_t p = 0; p < planes; ++p)
      for (int64_t oi = 0; oi < out_h; ++oi)
        for (int64_t oj = 0; oj < out_w; ++oj) {
          const int64_t i0 = (p * h + 2 * oi) * w + 2 * oj;
          const int64_t at[4] = {i0, i0 + 1, i0 + w, i0 + w + 1};
          int best = 0;
          for (int k = 1; k < 4; ++k) {
            const float v = xv[static_cast<std::size_t>(at[k])], b = xv[static_cast<std::size_t>(at[best])];
            if (v > b || std::isnan(v)) best = k;
          }
          const std::size_t o = static_cast<std::size_t>((p * out_h + oi) * out_w + oj);
          EXPECT_EQ(bits(yv[o]), bits(xv[static_cast<std::size_t>(at[best])])) << "window " << o;
          for (int k = 0; k < 4; ++k)
            EXPECT_EQ(bits(dx[static_cast<std::size_t>(at[k])]), bits(k == best ? gv[o] : 0.0f))
                << "window " << o << ", element " << k;
        }
  }
}

// ---- parity: CUDA (cuDNN) against the CPU ----------------------------------------------------
// The ops' values and gradients are the registry's (tests/test_op_cases.cpp, CudaMatchesCpu); here
// batch norm's running statistics and the algorithm cache.

TEST_P(CnnOpsTest, CudnnMatchesTheCpu) {
  if (device().is_cpu()) GTEST_SKIP() << "compares CUDA with the CPU";
  if (!cudnn_compiled()) GTEST_SKIP() << "built without cuDNN";
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

  // (a) 16 x 4 through the Trainer: gradients accumulate in the flat buffer, each micro-batch
  // normalized by its own batch-norm statistics.
  Generator gen_a(3);
  models::CNN a(gen_a, device());
  auto flat = std::make_shared<nn::FlatParameters>(a);
  train::TrainerOptions ao;
  ao.accum_steps = 4;
  train::Trainer acc(std::make_shared<optim::SGD>(flat, optim::SGDOptions{}), ao);
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
//   [2 b]                on the CPU, cross_entropy's saved row maxima and log sums
//   loss []              the loss scalar
// Freed during the forward: the batch-norm outputs (read once by the ReLU after them, which saves
// its own output) and the conv's column scratch (category workspace); linear1 and relu3 run as one
// op (Note [Fused linear]), so no pre-activation exists.
int64_t cnn_activation_bytes(int64_t b, Device device) {
  return rounded(b * 32 * 28 * 28 * 4) + 2 * rounded(32 * 4) + rounded(b * 32 * 28 * 28 * 4) +
         rounded(b * 32 * 14 * 14 * 4) + rounded(b * 64 * 14 * 14 * 4) + 2 * rounded(64 * 4) +
         rounded(b * 64 * 14 * 14 * 4) + rounded(b * 64 * 7 * 7 * 4) + rounded(b * 128 * 4) + rounded(b * 10 * 4) +
         (device.is_cpu() ? rounded(b * 2 * 4) : 0) + rounded(4);
}

TEST_P(CnnModelTest, ActivationFootprintIsTheAnalyticSum) {
  const Batch data = make_batch(40, 8, device());
  Generator gen(1);
  models::CNN model(gen, device());
  auto flat = std::make_shared<nn::FlatParameters>(model);
  train::TrainerOptions ao;
  ao.accum_steps = 2;
  train::Trainer acc(std::make_shared<optim::SGD>(flat, optim::SGDOptions{}), ao);
  memory::MemoryTracker::Options o;
  o.model = "cnn";
  o.micro_batch_size = 2;
  o.accum_steps = 2;
  o.timeline_steps = 0;
  memory::MemoryTracker tracker(device(), o);
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
        tracker.end_step(acc.counters().optimizer_steps, acc.optimizer().state_bytes());
      }
      const memory::MicroBatchRecord& r = tracker.last_micro_batch();
      EXPECT_EQ(r.activation_bytes, cnn_activation_bytes(b, device())) << "micro-batch " << i;
      EXPECT_GE(r.peak_bytes, r.activation_bytes);
    }
  }
  EXPECT_EQ(tracker.micro_batches().size(), 12u);
  // The slope over sizes 1, 2, 5: 4 * (2 * 25088 + 6272 + 2 * 12544 + 3136 + 128 + 10) = 339240
  // bytes per sample (~331 KiB), within the allocator's rounding.
  EXPECT_NEAR(tracker.summary().activation_bytes_per_unit, 339240.0, double(kRound));
  EXPECT_EQ(allocator_for(device()).stats()[MemoryCategory::activations].current, 0)
      << "backward released every saved tensor";
}

CUMULUS_INSTANTIATE_DEVICES(CnnOpsTest);
CUMULUS_INSTANTIATE_DEVICES(CnnModelTest);

}  // namespace
}  // namespace cumulus
