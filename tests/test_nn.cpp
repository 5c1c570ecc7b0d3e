// Modules and the seed model: PyTorch's parameter names and shapes, memory attribution of
// parameters and gradient buffers, forward shapes, identical initialization on every device, and a
// short training run that must actually learn.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "cumulus/autograd/grad_mode.h"
#include "cumulus/autograd/node.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/models/mlp.h"
#include "cumulus/nn/activation_layers.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/layers.h"
#include "cumulus/ops/linear.h"
#include "cumulus/ops/loss.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/optim/sgd.h"
#include "cumulus/tensor/random.h"
#include "cumulus/train/trainer.h"
#include "test_util.h"

namespace cumulus {
namespace {

using testing::DeviceTest;
using testing::max_rel_diff;

class NnTest : public DeviceTest {};

TEST_P(NnTest, SeedMLPNamesShapesAndCount) {
  Generator gen(0);
  models::SeedMLP model(gen, device());
  const auto named = model.named_parameters();
  const std::vector<std::string> names = {"linear_relu_stack.0.weight", "linear_relu_stack.0.bias",
                                          "linear_relu_stack.2.weight", "linear_relu_stack.2.bias",
                                          "linear_relu_stack.4.weight", "linear_relu_stack.4.bias"};
  const std::vector<Shape> shapes = {{512, 784}, {512}, {512, 512}, {512}, {10, 512}, {10}};
  ASSERT_EQ(named.size(), names.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(named[i].first, names[i]) << "PyTorch state_dict key " << i;
    EXPECT_EQ(named[i].second.shape(), shapes[i]) << names[i];
    EXPECT_EQ(named[i].second.device(), device()) << names[i];
    EXPECT_EQ(named[i].second.dtype(), DType::f32) << names[i];
    EXPECT_TRUE(named[i].second.requires_grad()) << names[i];
    EXPECT_TRUE(named[i].second.is_leaf()) << names[i];
  }
  EXPECT_EQ(model.num_parameters(), 669706);
  EXPECT_EQ(model.parameters().size(), 6u);
  EXPECT_EQ(model.stack().size(), 5u) << "Linear, ReLU, Linear, ReLU, Linear";
  // parameters() and named_parameters() are the same tensors, in the same order.
  const auto ps = model.parameters();
  for (std::size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(ps[i].raw_data(), named[i].second.raw_data());
}

TEST_P(NnTest, SequentialNamesChildrenByIndex) {
  Generator gen(1);
  nn::Sequential seq;
  seq.add(std::make_shared<nn::Linear>(4, 3, gen, device()))
      .add(std::make_shared<nn::ReLU>())
      .add(std::make_shared<nn::Linear>(3, 2, gen, device(), /*bias=*/false));
  EXPECT_EQ(seq.size(), 3u);
  std::vector<std::string> names;
  for (const auto& [n, t] : seq.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "2.weight"}));
  EXPECT_EQ(seq.num_parameters(), 4 * 3 + 3 + 3 * 2);

  // forward = linear -> relu -> linear, as the ops compute it.
  Tensor x = uniform({5, 4}, -1, 1, gen, device());
  auto& l0 = dynamic_cast<nn::Linear&>(seq[0]);
  auto& l2 = dynamic_cast<nn::Linear&>(seq[2]);
  const auto expected =
      ops::linear(ops::relu(ops::linear(x, l0.weight(), l0.bias())), l2.weight(), Tensor()).to_vector<float>();
  Tensor y = seq(x);
  EXPECT_EQ(y.shape(), Shape({5, 2}));
  EXPECT_EQ(y.to_vector<float>(), expected);

  nn::Flatten flat;
  EXPECT_EQ(flat(Tensor::zeros({2, 3, 4}, DType::f32, device())).shape(), Shape({2, 12}));
  EXPECT_EQ(flat.num_parameters(), 0);
}

// nn::Linear on [..., in]: the leading dimensions are the GEMM's rows, so a [2, 3, 4] input gives the
// bits of the same rows as [6, 4] (through the fused linear + relu too), and gradients of the input's
// shape and the same weight gradients.
TEST_P(NnTest, LinearTakesLeadingDimensions) {
  Generator gen(3);
  nn::Sequential seq;
  seq.add(std::make_shared<nn::Linear>(4, 3, gen, device())).add(std::make_shared<nn::ReLU>());
  seq.add(std::make_shared<nn::Linear>(3, 2, gen, device()));
  const Tensor x = uniform({2, 3, 4}, -1, 1, gen, device());
  auto run = [&](const Tensor& input) {
    Tensor leaf = input.clone();
    leaf.set_requires_grad(true);
    seq.zero_grad();
    Tensor y = seq(leaf);
    ops::sum(y).backward();
    return std::make_tuple(y, leaf.grad(), seq.parameters()[0].grad().to_vector<float>());
  };
  const auto [y3, dx3, dw3] = run(x);
  const auto [y2, dx2, dw2] = run(x.reshape({6, 4}));
  EXPECT_EQ(y3.shape(), Shape({2, 3, 2}));
  EXPECT_EQ(y3.to_vector<float>(), y2.to_vector<float>());
  EXPECT_EQ(dx3.shape(), Shape({2, 3, 4}));
  EXPECT_EQ(dx3.to_vector<float>(), dx2.to_vector<float>());
  EXPECT_EQ(dw3, dw2);
  const Tensor v = uniform({4}, -1, 1, gen, device());
  auto& l0 = dynamic_cast<nn::Linear&>(seq[0]);
  EXPECT_EQ(l0(v).shape(), Shape({3}));
  EXPECT_EQ(l0(v).to_vector<float>(), l0(v.reshape({1, 4})).to_vector<float>());
}

TEST_P(NnTest, ParameterAndGradientMemoryIsAttributed) {
  CachingAllocator& A = allocator_for(device());
  const MemoryStats before = A.stats();
  const auto P = MemoryCategory::parameters, G = MemoryCategory::gradients, O = MemoryCategory::other,
             ACT = MemoryCategory::activations;
  // Exact sizes of the six tensors, and the most 512-B rounding can add (per tensor).
  const int64_t exact = 669706 * 4, slack = 6 * 511;
  {
    Generator gen(0);
    models::SeedMLP model(gen, device());
    const MemoryStats s = A.stats();
    const int64_t dp = s[P].current - before[P].current, dg = s[G].current - before[G].current;
    EXPECT_GE(dp, exact) << "parameter bytes";
    EXPECT_LE(dp, exact + slack) << "parameter bytes";
    EXPECT_GE(dg, exact) << "gradient buffers are allocated with the parameters";
    EXPECT_LE(dg, exact + slack) << "gradient bytes";
    EXPECT_EQ(s[O].current, before[O].current) << "initialization temporaries were freed";
    EXPECT_EQ(s[ACT].current, before[ACT].current) << "building a model is not a forward";
    for (const Tensor& p : model.parameters()) {
      EXPECT_EQ(p.memory_category(), P);
      ASSERT_TRUE(p.grad_buffer().defined());
      EXPECT_EQ(p.grad_buffer().memory_category(), G);
      EXPECT_EQ(p.grad_buffer().shape(), p.shape());
      EXPECT_TRUE(p.grad_stale());
    }
  }
  const MemoryStats after = A.stats();
  EXPECT_EQ(after[P].current, before[P].current) << "parameters are freed with the model";
  EXPECT_EQ(after[G].current, before[G].current) << "gradient buffers are freed with the model";
}

TEST_P(NnTest, ForwardShapes) {
  Generator gen(0);
  models::SeedMLP model(gen, device());
  Generator data(5);
  const int64_t B = 3;
  Tensor images = uniform({B, 28, 28}, 0, 1, data, device());
  Tensor logits = model(images);
  EXPECT_EQ(logits.shape(), Shape({B, 10}));
  EXPECT_EQ(logits.device(), device());
  EXPECT_TRUE(logits.requires_grad());
  Tensor flat = model(images.reshape({B, 784}));
  EXPECT_EQ(flat.shape(), Shape({B, 10}));
  EXPECT_EQ(flat.to_vector<float>(), logits.to_vector<float>()) << "[B,28,28] and [B,784] are the same input";
  Tensor one = model(uniform({1, 784}, 0, 1, data, device()));
  EXPECT_EQ(one.shape(), Shape({1, 10}));
  {
    NoGradGuard no_grad;
    Tensor eval = model(images);
    EXPECT_FALSE(eval.requires_grad());
    EXPECT_EQ(eval.to_vector<float>(), logits.to_vector<float>());
  }
  EXPECT_THROW(model(uniform({B, 783}, 0, 1, data, device())), ShapeError) << "wrong input width";
}

TEST_P(NnTest, SameSeedSameModelOnEveryDevice) {
  Generator g_cpu(1234), g_dev(1234);
  models::SeedMLP on_cpu(g_cpu, Device::cpu());
  models::SeedMLP on_dev(g_dev, device());
  const auto pc = on_cpu.parameters(), pd = on_dev.parameters();
  ASSERT_EQ(pc.size(), pd.size());
  for (std::size_t i = 0; i < pc.size(); ++i) {
    const auto a = pc[i].to_vector<float>(), b = pd[i].to_vector<float>();
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "parameter " << i;
  }
  // Different seeds give different models.
  Generator g_other(1235);
  models::SeedMLP other(g_other, Device::cpu());
  EXPECT_NE(other.parameters()[0].to_vector<float>(), pc[0].to_vector<float>());

  Generator data(9);
  Tensor x = uniform({8, 28, 28}, 0, 1, data);
  const auto lc = on_cpu(x).to_vector<float>();
  const auto ld = on_dev(x.to(device())).to_vector<float>();
  EXPECT_LT(max_rel_diff(ld, lc), 1e-5) << "same weights, same input, same logits";
}

TEST_P(NnTest, ModuleZeroGradMarksEveryParameterStale) {
  Generator gen(2);
  models::SeedMLP model(gen, device());
  Generator data(3);
  Tensor x = uniform({4, 784}, 0, 1, data, device());
  Tensor y = Tensor::from_vector<int32_t>({1, 7, 3, 3}, {4}, device());
  ops::cross_entropy(model(x), y, ops::Reduction::Sum).backward();
  for (const Tensor& p : model.parameters()) EXPECT_TRUE(p.grad().defined());
  model.zero_grad();
  for (const Tensor& p : model.parameters()) {
    EXPECT_TRUE(p.grad_stale());
    EXPECT_FALSE(p.grad().defined());
    EXPECT_TRUE(p.grad_buffer().defined());
  }
}

// Decision 8: after FlatParameters, every parameter and gradient is a view into one buffer, values
// are kept, and the memory held is the flat buffers' (the per-tensor blocks are freed).
TEST_P(NnTest, FlatParametersPackTheModel) {
  CachingAllocator& A = allocator_for(device());
  const MemoryStats before = A.stats();
  Generator gen(0);
  models::SeedMLP model(gen, device());
  Generator data(4);
  Tensor x = uniform({4, 784}, 0, 1, data, device());
  std::vector<float> logits_before;
  {
    NoGradGuard no_grad;
    logits_before = model(x).to_vector<float>();
  }
  std::vector<std::vector<float>> values_before;
  for (const Tensor& p : model.parameters()) values_before.push_back(p.to_vector<float>());

  auto flat = std::make_shared<nn::FlatParameters>(model);
  EXPECT_EQ(flat->num_parameters(), 669706);
  EXPECT_EQ(flat->slots().size(), 6u);
  EXPECT_EQ(flat->device(), device());
  int64_t padded = 0;
  const auto params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& slot = flat->slots()[i];
    EXPECT_EQ(slot.name, model.named_parameters()[i].first);
    EXPECT_EQ(slot.offset % nn::FlatParameters::kAlignElements, 0) << slot.name;
    EXPECT_EQ(slot.offset, padded) << slot.name << ": slots are packed in order";
    padded += (slot.numel + 63) / 64 * 64;
    EXPECT_EQ(params[i].raw_data(), static_cast<char*>(flat->values().raw_data()) + slot.offset * 4)
        << slot.name << " is a view into the flat values";
    EXPECT_EQ(params[i].grad_buffer().raw_data(),
              static_cast<char*>(flat->gradients().raw_data()) + slot.offset * 4)
        << slot.name << "'s gradient is a view into the flat gradients";
    EXPECT_EQ(params[i].to_vector<float>(), values_before[i]) << slot.name << ": values kept";
    EXPECT_TRUE(params[i].grad_stale());
  }
  EXPECT_EQ(flat->size(), padded);
  const MemoryStats s = A.stats();
  EXPECT_GE(s[MemoryCategory::parameters].current - before[MemoryCategory::parameters].current, padded * 4);
  EXPECT_LE(s[MemoryCategory::parameters].current - before[MemoryCategory::parameters].current, padded * 4 + 511)
      << "only the flat buffer holds parameters now";
  EXPECT_LE(s[MemoryCategory::gradients].current - before[MemoryCategory::gradients].current, padded * 4 + 511)
      << "only the flat buffer holds gradients now";
  {
    NoGradGuard no_grad;
    EXPECT_EQ(model(x).to_vector<float>(), logits_before) << "the model computes the same after packing";
  }
  // A backward writes into the flat gradient buffer.
  ops::cross_entropy(model(x), Tensor::from_vector<int32_t>({0, 1, 2, 3}, {4}, device()),
                     ops::Reduction::Sum).backward();
  EXPECT_TRUE(flat->any_gradient());
  const auto g = flat->gradients().to_vector<float>();
  const auto g4 = params[4].grad().to_vector<float>();
  const auto& slot4 = flat->slots()[4];
  EXPECT_TRUE(std::equal(g4.begin(), g4.end(), g.begin() + slot4.offset));
  double norm = 0;
  for (float v : g) norm += double(v) * v;
  EXPECT_GT(norm, 0.0);
  EXPECT_NEAR(flat->gradient_sum_of_squares(), norm, 1e-5 * norm);
  flat->mark_gradients_stale();
  for (const Tensor& p : params) EXPECT_FALSE(p.grad().defined());
  EXPECT_FALSE(flat->any_gradient());
}

// 10 classes, each a fixed random pattern in [-0.5, 0.5)^784; a sample is its class pattern plus
// fresh noise of the same amplitude, so every pixel is heavily corrupted and only the whole image
// identifies the class. Centred inputs, as a normalized image would be.
void make_dataset(int n, uint64_t seed, const std::vector<float>& patterns, std::vector<float>& x,
                  std::vector<int32_t>& y) {
  Generator g(seed);
  x.assign(std::size_t(n) * 784, 0.0f);
  y.assign(n, 0);
  std::vector<float> noise(784);
  for (int i = 0; i < n; ++i) {
    y[i] = i % 10;
    g.fill_uniform(noise.data(), 784, 0, 1);
    for (int k = 0; k < 784; ++k) x[i * 784 + k] = (patterns[y[i] * 784 + k] - 0.5f) + (noise[k] - 0.5f);
  }
}

double accuracy(models::SeedMLP& model, const Tensor& x, const std::vector<int32_t>& y) {
  NoGradGuard no_grad;
  const auto pred = ops::argmax(model(x)).to_vector<int32_t>();
  int correct = 0;
  for (std::size_t i = 0; i < y.size(); ++i) correct += pred[i] == y[i];
  return double(correct) / double(y.size());
}

// FlatParameters(model) packs only the parameters that train (issue 28): one frozen before the pack
// keeps its own storage and, through training, its values; a model with nothing to train is refused.
TEST_P(NnTest, FlatParametersSkipFrozenParameters) {
  Generator gen(0);
  models::SeedMLP model(gen, device());
  const auto named = model.named_parameters();
  Tensor frozen = named[0].second;  // linear_relu_stack.0.weight
  frozen.set_requires_grad(false);
  const std::vector<float> before = frozen.to_vector<float>();
  const void* address = frozen.raw_data();
  std::shared_ptr<nn::FlatParameters> flat;
  ASSERT_NO_THROW(flat = std::make_shared<nn::FlatParameters>(model));
  ASSERT_EQ(flat->slots().size(), named.size() - 1);
  for (const auto& slot : flat->slots()) EXPECT_NE(slot.name, named[0].first);
  EXPECT_EQ(flat->num_parameters(), 669706 - 512 * 784);
  EXPECT_EQ(frozen.raw_data(), address) << "a frozen parameter is not moved into the flat buffers";

  optim::SGDOptions so;
  so.lr = 0.1f;
  so.momentum = 0.9f;
  so.weight_decay = 0.1f;
  train::Trainer acc(std::make_shared<optim::SGD>(flat, so), train::TrainerOptions{});
  Generator data(1);
  const Tensor x = uniform({8, 784}, 0.0f, 1.0f, data, device());
  const Tensor y = Tensor::from_vector<int32_t>({0, 1, 2, 3, 4, 5, 6, 7}, {8}, device());
  const std::vector<float> trained_before = named[2].second.to_vector<float>();
  for (int step = 0; step < 2; ++step) {
    acc.backward(ops::cross_entropy(model(x), y, ops::Reduction::Sum), 8);
    ASSERT_TRUE(acc.step_if_ready());
  }
  EXPECT_EQ(frozen.to_vector<float>(), before);
  EXPECT_NE(named[2].second.to_vector<float>(), trained_before) << "the other parameters train";

  for (auto [name, p] : named) p.set_requires_grad(false);
  try {
    nn::FlatParameters none(model);
    ADD_FAILURE() << "a model with every parameter frozen was packed";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("every parameter of the model is frozen"), std::string::npos) << e.what();
  }
}

TEST_P(NnTest, SGDTrainingReducesTheLoss) {
  const Device d = device();
  Generator pg(100);
  std::vector<float> patterns(10 * 784);
  pg.fill_uniform(patterns.data(), int64_t(patterns.size()), 0, 1);
  std::vector<float> xv, xt;
  std::vector<int32_t> yv, yt;
  make_dataset(64, 1, patterns, xv, yv);
  make_dataset(100, 2, patterns, xt, yt);  // held out
  Tensor x = Tensor::from_vector(xv, {64, 28, 28}, d), xtest = Tensor::from_vector(xt, {100, 784}, d);
  Tensor y = Tensor::from_vector(yv, {64}, d);

  Generator gen(0);
  models::SeedMLP model(gen, d);
  optim::SGDOptions options;
  options.lr = 0.1f;
  optim::SGD opt(std::make_shared<nn::FlatParameters>(model), options);
  const double chance_accuracy = accuracy(model, xtest, yt);
  float first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    Tensor loss = ops::cross_entropy(model(x), y, ops::Reduction::Mean);
    last = loss.item();
    if (step == 0) first = last;
    ASSERT_TRUE(std::isfinite(last)) << "step " << step;
    loss.backward();
    opt.step();
  }
  {
    NoGradGuard no_grad;
    last = ops::cross_entropy(model(x), y, ops::Reduction::Mean).item();
  }
  EXPECT_NEAR(first, std::log(10.0), 0.3) << "an untrained model is close to uniform over 10 classes";
  EXPECT_LT(last, 0.5 * first) << "30 SGD steps must at least halve the loss (first " << first << ")";
  EXPECT_GT(accuracy(model, x, yv), 0.9) << "training accuracy";
  EXPECT_GT(accuracy(model, xtest, yt), 0.8) << "held-out accuracy (chance was " << chance_accuracy << ")";
}

// ---- Linear followed by ReLU in a Sequential runs fused ----------------------------------------

// The seed MLP's layer pattern at a small size: Linear, ReLU, Linear, ReLU, Linear.
std::shared_ptr<nn::Sequential> small_mlp(Generator& gen, Device d) {
  auto seq = std::make_shared<nn::Sequential>();
  seq->add(std::make_shared<nn::Linear>(12, 16, gen, d))
      .add(std::make_shared<nn::ReLU>())
      .add(std::make_shared<nn::Linear>(16, 9, gen, d))
      .add(std::make_shared<nn::ReLU>())
      .add(std::make_shared<nn::Linear>(9, 4, gen, d));
  return seq;
}

// The same network written with the unfused ops on the Sequential's own parameters.
Tensor unfused_forward(const nn::Sequential& seq, const Tensor& x) {
  auto lin = [&](std::size_t i, const Tensor& h) {
    const auto& l = dynamic_cast<const nn::Linear&>(seq[i]);
    return ops::linear(h, l.weight(), l.bias());
  };
  return lin(4, ops::relu(lin(2, ops::relu(lin(0, x)))));
}

// Loss, then every parameter's gradient, after one backward (overwrite) and a second (accumulate).
std::vector<std::vector<float>> two_backwards(nn::Sequential& seq, const Tensor& x, const Tensor& labels, bool fused) {
  std::vector<std::vector<float>> out;
  seq.zero_grad();
  for (int pass = 0; pass < 2; ++pass) {
    Tensor loss = ops::cross_entropy(fused ? seq(x) : unfused_forward(seq, x), labels, ops::Reduction::Sum);
    out.push_back({loss.item()});
    loss.backward();
    for (const Tensor& p : seq.parameters()) out.push_back(p.grad().to_vector<float>());
  }
  return out;
}

TEST_P(NnTest, SequentialFusesLinearReluWithTheSameResults) {
  const Device d = device();
  Generator gen(5);
  auto seq = small_mlp(gen, d);
  std::vector<float> xv(7 * 12);
  gen.fill_uniform(xv.data(), static_cast<int64_t>(xv.size()), -1.0f, 1.0f);
  const Tensor x = Tensor::from_vector(xv, Shape{7, 12}, d);
  const Tensor labels = Tensor::from_vector<int32_t>({0, 1, 2, 3, 0, 1, 2}, Shape{7}, d);
  // Segments inside which the pairs fuse ([0, 4): the recompute walk hands the segment's output
  // gradient in, shared, so the fused node masks into a temporary), and segments whose boundaries
  // fall between a Linear and its ReLU (no fusion there).
  const std::vector<std::vector<nn::LayerRange>> segmentations = {
      {}, {{0, 4}}, {{0, 1}}, {{1, 3}}, {{0, 2}, {2, 5}}, {{0, 5}, {1, 4}}};
  for (const auto& segments : segmentations) {
    SCOPED_TRACE("segments: " + std::to_string(segments.size()) +
                 (segments.empty() ? std::string() : " first [" + std::to_string(segments[0].begin) + ", " +
                                                         std::to_string(segments[0].end) + ")"));
    seq->set_recompute(segments);
    const auto fused = two_backwards(*seq, x, labels, true);
    const auto plain = two_backwards(*seq, x, labels, false);
    ASSERT_EQ(fused.size(), plain.size());
    for (std::size_t i = 0; i < fused.size(); ++i) {
      if (d.is_cpu()) EXPECT_EQ(fused[i], plain[i]) << "value " << i << " (0 and 7 are the losses)";
      else EXPECT_LT(max_rel_diff(fused[i], plain[i]), 1e-5) << "value " << i;
    }
  }
  seq->set_recompute({});
  NoGradGuard no_grad;  // evaluation runs the fused op too
  EXPECT_EQ((*seq)(x).to_vector<float>(), unfused_forward(*seq, x).to_vector<float>());
}

TEST_P(NnTest, SequentialFusesOnlyALinearFollowedByAReluInsideOneSegment) {
  const Device d = device();
  Generator gen(6);
  auto pair = [&] {
    auto seq = std::make_shared<nn::Sequential>();
    seq->add(std::make_shared<nn::Linear>(3, 4, gen, d)).add(std::make_shared<nn::ReLU>());
    return seq;
  };
  Tensor x = Tensor::full(Shape{2, 3}, 0.5f, d);
  auto seq = pair();
  EXPECT_STREQ((*seq)(x).grad_fn()->name(), "linear+relu");
  EXPECT_EQ(seq->named_parameters().size(), 2u);
  EXPECT_EQ(seq->named_parameters()[0].first, "0.weight") << "names are the unfused modules'";
  seq->set_recompute({{0, 1}});  // a boundary between the Linear and the ReLU
  EXPECT_STREQ((*seq)(x).grad_fn()->name(), "relu");
  seq->set_recompute({{1, 2}});
  EXPECT_STREQ((*seq)(x).grad_fn()->name(), "checkpoint");
  seq->set_recompute({{0, 2}});  // both inside one segment: fused within its recomputation
  EXPECT_STREQ((*seq)(x).grad_fn()->name(), "checkpoint");
  // ReLU then Linear is not the pattern.
  auto swapped = std::make_shared<nn::Sequential>();
  swapped->add(std::make_shared<nn::ReLU>()).add(std::make_shared<nn::Linear>(3, 4, gen, d));
  EXPECT_STREQ((*swapped)(x).grad_fn()->name(), "linear");
}

// Kernel launches of one eager micro-batch of the seed MLP (forward, summed cross-entropy,
// Trainer::backward), counted by the launchers. Before the fused Linear + ReLU it was 23:
// forward 10 (per Linear a broadcast and a GEMM, 2 ReLUs, cross-entropy's 2), backward 12 (the
// seed fill, cross-entropy, 2 ReLU masks, dx x2, dW x3, db x3), the micro-batch record 1.
// Each Linear's two epilogue GEMMs have one of two outcomes, and cumulus::cuda_epilogue_calls says
// which: fused, or declined (cuBLASLt offered no algorithm) with the unfused kernels, one launch
// more. The count is predicted from those outcomes, never loosened to a range.
TEST(NnLaunches, SeedMLPEagerMicroBatch) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device d = Device::cuda(0);
  Generator gen(0);
  models::SeedMLP model(gen, d);
  train::TrainerOptions o;
  o.accum_steps = 1 << 30;  // never steps: the test decides when gradients are stale
  train::Trainer acc(std::make_shared<optim::SGD>(std::make_shared<nn::FlatParameters>(model), optim::SGDOptions{}),
                         o);
  const int64_t b = 16;
  std::vector<float> xv(static_cast<std::size_t>(b * 784), 0.5f);
  std::vector<int32_t> yv(static_cast<std::size_t>(b), 3);
  const Tensor x = Tensor::from_vector(xv, Shape{b, 1, 28, 28}, d);
  const Tensor y = Tensor::from_vector(yv, Shape{b}, d);
  struct Outcome {
    int64_t launches;
    CudaEpilogueCalls bias, bias_gradient;  // this micro-batch's
  };
  auto since = [](CudaEpilogue e, const CudaEpilogueCalls& before) {
    const CudaEpilogueCalls now = cuda_epilogue_calls(e);
    return CudaEpilogueCalls{now.fused - before.fused, now.declined - before.declined};
  };
  auto micro_batch = [&] {
    const CudaEpilogueCalls bias = cuda_epilogue_calls(CudaEpilogue::bias);
    const CudaEpilogueCalls grad = cuda_epilogue_calls(CudaEpilogue::bias_gradient);
    const int64_t before = cuda_kernel_launches();
    acc.backward(ops::cross_entropy(model(x), y, ops::Reduction::Sum), b);
    return Outcome{cuda_kernel_launches() - before, since(CudaEpilogue::bias, bias),
                   since(CudaEpilogue::bias_gradient, grad)};
  };
  acc.optimizer().zero_grad();
  micro_batch();  // warm-up: handles, workspace, cuBLASLt plans, step buffers
  acc.optimizer().zero_grad();
  const Outcome overwrite = micro_batch();
  const Outcome accumulate = micro_batch();
  for (const Outcome* m : {&overwrite, &accumulate}) {
    EXPECT_EQ(m->bias.fused + m->bias.declined, 3) << "one forward GEMM per Linear, with the BIAS epilogue";
    EXPECT_EQ(m->bias_gradient.fused + m->bias_gradient.declined, 3) << "one dW GEMM per Linear, with BGRADB";
  }
  // Forward 6 when every BIAS epilogue is fused: one cuBLASLt GEMM per Linear (the bias added in
  // it), our ReLU kernel after the two hidden ones (Note [ReLU epilogues and NaN] in
  // engine/ops/linear.cpp), cross-entropy's one (rows and sum in one block at this size). Each
  // declined one adds the bias broadcast. Backward 8 when the bias gradients' sinks overwrite: no
  // seed fill (the Trainer keeps its seed), cross-entropy, 2 ReLU masks, dx x2, dW x3 with db
  // in the same GEMM (BGRADB); each declined BGRADB adds db's sum_rows. When they accumulate,
  // BGRADB writes each db into a temporary and one launch at the end of backward adds all of them
  // (Note [Deferred gradient adds]), if there is any. Plus the micro-batch record.
  EXPECT_EQ(overwrite.launches, 6 + overwrite.bias.declined + 8 + overwrite.bias_gradient.declined + 1);
  EXPECT_EQ(accumulate.launches, 6 + accumulate.bias.declined + 8 + accumulate.bias_gradient.declined +
                                     (accumulate.bias_gradient.fused > 0 ? 1 : 0) + 1);
  EXPECT_LT(overwrite.launches, 23);
}

CUMULUS_INSTANTIATE_DEVICES(NnTest);

}  // namespace
}  // namespace cumulus
