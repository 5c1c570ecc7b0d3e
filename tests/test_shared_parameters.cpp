// Shared parameters (weight tying, Note [Shared parameters] in nn/module.h): a tiny language model
// whose embedding weight is also its output layer's weight, as GPT-2's. The tensor is one
// parameter (counted, flattened, allocated and stepped once), its gradient is the sum over both
// uses (checked against a hand computation), and its state dict has both names, as PyTorch's:
// save/load round trips, and files with both names, or one, load as PyTorch's rules say.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "cumulus/core/error.h"
#include "cumulus/io/safetensors.h"
#include "cumulus/io/state_dict.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/memory/tracker.h"
#include "cumulus/nn/activation_layers.h"
#include "cumulus/nn/embedding.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/init.h"
#include "cumulus/nn/layers.h"
#include "cumulus/nn/norm_layers.h"
#include "cumulus/ops/loss.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/optim/adamw.h"
#include "cumulus/optim/sgd.h"
#include "test_util.h"

namespace cumulus {
namespace {

using testing::DeviceTest;
using testing::TempDir;

constexpr int64_t kVocab = 7, kDim = 4;

// logits = wte(indices) wte.weight^T: nanoGPT's tying, `lm_head.weight = wte.weight`.
class TiedLM : public nn::Module {
 public:
  TiedLM(uint64_t seed, Device device) {
    Generator gen(seed);
    wte = register_module("wte", std::make_shared<nn::Embedding>(kVocab, kDim, gen, device));
    lm_head = register_module("lm_head", std::make_shared<nn::Linear>(kDim, kVocab, gen, device, false));
    share_parameter("lm_head.weight", wte->weight());
  }
  Tensor forward(const Tensor& indices) override { return (*lm_head)(wte->forward(indices)); }
  std::shared_ptr<nn::Embedding> wte;
  std::shared_ptr<nn::Linear> lm_head;
};

int64_t held(Device device, MemoryCategory c) { return allocator_for(device).stats()[c].current; }

std::vector<std::string> names(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<std::string> out;
  for (const auto& [name, t] : named) out.push_back(name);
  return out;
}

// The sum over samples of the cross entropy of W W[x_n] against y_n, and its gradient in W (both
// uses: the output layer's and the embedding's), in double on the host.
std::vector<double> hand_gradient(const std::vector<float>& w, const std::vector<int32_t>& x,
                                  const std::vector<int32_t>& y) {
  std::vector<double> g(w.size(), 0.0);
  for (std::size_t n = 0; n < x.size(); ++n) {
    const float* h = &w[static_cast<std::size_t>(x[n]) * kDim];
    std::vector<double> z(kVocab), dz(kVocab);
    double zmax = -1e300, sum = 0.0;
    for (int64_t v = 0; v < kVocab; ++v) {
      z[v] = 0.0;
      for (int64_t d = 0; d < kDim; ++d) z[v] += static_cast<double>(w[v * kDim + d]) * h[d];
      zmax = std::max(zmax, z[v]);
    }
    for (int64_t v = 0; v < kVocab; ++v) sum += std::exp(z[v] - zmax);
    for (int64_t v = 0; v < kVocab; ++v) dz[v] = std::exp(z[v] - zmax) / sum - (v == y[n] ? 1.0 : 0.0);
    for (int64_t v = 0; v < kVocab; ++v)
      for (int64_t d = 0; d < kDim; ++d) {
        g[v * kDim + d] += dz[v] * h[d];                // lm_head: dz h^T
        g[x[n] * kDim + d] += dz[v] * w[v * kDim + d];  // wte: row x_n gets W^T dz
      }
  }
  return g;
}

class SharedParametersTest : public DeviceTest {};

TEST_P(SharedParametersTest, OneTensorUnderTwoNames) {
  TiedLM model(0, device());
  EXPECT_TRUE(model.lm_head->weight().is_same(model.wte->weight()));
  // PyTorch: named_parameters() and parameters() list it once, under its first name; state_dict()
  // and named_parameters(remove_duplicate=False) under both.
  EXPECT_EQ(names(model.named_parameters()), std::vector<std::string>{"wte.weight"});
  EXPECT_EQ(names(model.named_parameters(false)), (std::vector<std::string>{"wte.weight", "lm_head.weight"}));
  EXPECT_EQ(names(model.state_dict()), (std::vector<std::string>{"wte.weight", "lm_head.weight"}));
  EXPECT_EQ(model.parameters().size(), 1u);
  EXPECT_EQ(model.num_parameters(), kVocab * kDim);
}

TEST_P(SharedParametersTest, AllocatedOnce) {
  // The Linear's own weight (and its gradient buffer) is freed when the tie replaces it: the model
  // holds what an embedding alone holds, which is what the memory tracker reads.
  const int64_t params_before = held(device(), MemoryCategory::parameters);
  const int64_t grads_before = held(device(), MemoryCategory::gradients);
  TiedLM model(0, device());
  EXPECT_EQ(held(device(), MemoryCategory::parameters) - params_before,
            static_cast<int64_t>(model.wte->weight().allocated_bytes()));
  EXPECT_EQ(held(device(), MemoryCategory::gradients) - grads_before,
            static_cast<int64_t>(model.wte->weight().grad_buffer().allocated_bytes()));
}

TEST_P(SharedParametersTest, TrackerCountsItOnce) {
  // The tracker's fixed costs are the allocator's counts: with the parameters flattened, one slot
  // of values and one of gradients (an untied model would hold two of each).
  const int64_t params_before = held(device(), MemoryCategory::parameters);
  const int64_t grads_before = held(device(), MemoryCategory::gradients);
  TiedLM model(0, device());
  nn::FlatParameters flat(model);
  memory::MemoryTracker tracker(device(), memory::MemoryTracker::Options{});
  const memory::MemorySummary summary = tracker.summary();
  EXPECT_EQ(summary.parameters_bytes - params_before, static_cast<int64_t>(flat.values().allocated_bytes()));
  EXPECT_EQ(summary.gradients_bytes - grads_before, static_cast<int64_t>(flat.gradients().allocated_bytes()));
  EXPECT_EQ(flat.values().numel(), nn::FlatParameters::kAlignElements);
}

TEST_P(SharedParametersTest, FlatBuffersHoldItOnce) {
  TiedLM model(0, device());
  nn::FlatParameters flat(model);
  ASSERT_EQ(flat.slots().size(), 1u);
  EXPECT_EQ(flat.slots()[0].name, "wte.weight");
  EXPECT_EQ(flat.num_parameters(), kVocab * kDim);
  EXPECT_EQ(flat.size(), nn::FlatParameters::kAlignElements);
  // Both modules' handles now point into the flat buffer.
  EXPECT_EQ(model.lm_head->weight().raw_data(), flat.values().raw_data());
  // The tensor listed twice by hand is refused, naming both names.
  try {
    nn::FlatParameters twice(model.named_parameters(false));
    ADD_FAILURE() << "a tensor listed twice was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'lm_head.weight' is the tensor 'wte.weight' again"), std::string::npos)
        << e.what();
  }
}

TEST_P(SharedParametersTest, SgdStepsTheSummedGradientOnce) {
  TiedLM model(0, device());
  nn::init::normal_(model.wte->weight(), 0.0f, 0.5f, 3);  // both uses matter at this scale
  const std::vector<float> w0 = model.wte->weight().to_vector<float>();
  const std::vector<int32_t> x = {0, 3, 3, 6, 1}, y = {2, 3, 5, 0, 6};
  const std::vector<double> g = hand_gradient(w0, x, y);

  auto params = std::make_shared<nn::FlatParameters>(model);
  optim::SGDOptions options;
  options.lr = 0.1f;
  optim::SGD sgd(params, options);
  sgd.zero_grad();
  const Tensor xs = Tensor::from_vector(x, Shape{5}, device()), ys = Tensor::from_vector(y, Shape{5}, device());
  ops::cross_entropy(model(xs), ys, ops::Reduction::Sum).backward();
  const std::vector<float> grad = model.lm_head->weight().grad().to_vector<float>();
  ASSERT_EQ(grad.size(), g.size());
  for (std::size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(grad[i], g[i], 1e-5 + 1e-5 * std::fabs(g[i])) << i;
  sgd.step();
  const std::vector<float> w1 = model.wte->weight().to_vector<float>();
  for (std::size_t i = 0; i < g.size(); ++i)
    EXPECT_NEAR(w1[i], w0[i] - 0.1 * g[i], 1e-6 + 1e-5 * std::fabs(w0[i])) << "w - lr g, element " << i;
  EXPECT_EQ(model.lm_head->weight().to_vector<float>(), w1);
}

TEST_P(SharedParametersTest, AdamWStepsOnceWithOneState) {
  // AdamW's first step moves each element by about lr (m / sqrt(v) = sign(g)): a tensor stepped
  // twice would move 2 lr. Weight decay 0 keeps the hand value simple.
  TiedLM model(1, device());
  const std::vector<float> w0 = model.wte->weight().to_vector<float>();
  const std::vector<int32_t> x = {1, 2, 4}, y = {4, 1, 1};
  const std::vector<double> g = hand_gradient(w0, x, y);
  auto params = std::make_shared<nn::FlatParameters>(model);
  optim::AdamWOptions options;
  options.lr = 0.01f;
  options.weight_decay = 0.0f;
  optim::AdamW adamw(params, options);
  EXPECT_EQ(adamw.state_to_allocate(), (std::vector<int64_t>{params->size() * 4, params->size() * 4}));
  adamw.zero_grad();
  const Tensor xs = Tensor::from_vector(x, Shape{3}, device()), ys = Tensor::from_vector(y, Shape{3}, device());
  ops::cross_entropy(model(xs), ys, ops::Reduction::Sum).backward();
  adamw.step();
  const std::vector<float> w1 = model.wte->weight().to_vector<float>();
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double step = 0.01 * g[i] / (std::fabs(g[i]) + 1e-8);
    EXPECT_NEAR(w1[i], w0[i] - step, 1e-6) << "element " << i << ", gradient " << g[i];
  }
}

// The same model untied, to be tied after its optimizer exists (Note [Tied after the optimizer]).
class UntiedLM : public nn::Module {
 public:
  UntiedLM(uint64_t seed, Device device) {
    Generator gen(seed);
    wte = register_module("wte", std::make_shared<nn::Embedding>(kVocab, kDim, gen, device));
    lm_head = register_module("lm_head", std::make_shared<nn::Linear>(kDim, kVocab, gen, device, false));
  }
  Tensor forward(const Tensor& indices) override { return (*lm_head)(wte->forward(indices)); }
  std::shared_ptr<nn::Embedding> wte;
  std::shared_ptr<nn::Linear> lm_head;
};

// Three AdamW steps (weight decay on) of `model` through `params`, tied or not by then.
template <typename Model>
void train_adamw(Model& model, const std::shared_ptr<nn::FlatParameters>& params, Device device) {
  optim::AdamWOptions options;
  options.lr = 0.01f;
  options.weight_decay = 0.1f;
  optim::AdamW adamw(params, options);
  const std::vector<std::vector<int32_t>> xs = {{1, 2, 4}, {0, 6, 3}, {5, 5, 2}}, ys = {{4, 1, 1}, {2, 2, 6}, {0, 3, 1}};
  for (std::size_t step = 0; step < xs.size(); ++step) {
    adamw.zero_grad();
    ops::cross_entropy(model(Tensor::from_vector(xs[step], Shape{3}, device)),
                       Tensor::from_vector(ys[step], Shape{3}, device), ops::Reduction::Sum)
        .backward();
    adamw.step();
  }
}

TEST_P(SharedParametersTest, TiedAfterTheOptimizerTrainsAsTiedFirst) {
  TiedLM first(1, device());
  train_adamw(first, std::make_shared<nn::FlatParameters>(first), device());

  UntiedLM late(1, device());
  auto params = std::make_shared<nn::FlatParameters>(late);  // two slots: wte.weight, lm_head.weight
  const Tensor dropped = late.lm_head->weight();
  const std::vector<float> dropped_before = dropped.to_vector<float>();
  late.share_parameter("lm_head.weight", late.wte->weight());
  EXPECT_FALSE(dropped.requires_grad()) << "the replaced tensor is frozen";
  EXPECT_TRUE(late.wte->weight().requires_grad());
  train_adamw(late, params, device());

  // AdamW is elementwise, so the shared tensor's bits do not depend on where its slot lies.
  EXPECT_EQ(late.wte->weight().to_vector<float>(), first.wte->weight().to_vector<float>());
  EXPECT_EQ(late.lm_head->weight().to_vector<float>(), first.wte->weight().to_vector<float>());
  EXPECT_EQ(dropped.to_vector<float>(), dropped_before) << "no update (weight decay included) reaches the old slot";
}

TEST_P(SharedParametersTest, AReplacedTensorStillUsedElsewhereKeepsTraining) {
  // lm_head.weight first shares wte's tensor, then a fresh one: wte still holds the tensor the
  // second tie drops, so it stays trainable.
  UntiedLM model(2, device());
  const Tensor shared = model.wte->weight();
  model.share_parameter("lm_head.weight", shared);
  Tensor fresh = Tensor::zeros(Shape{kVocab, kDim}, DType::f32, device());
  fresh.set_requires_grad(true);
  model.share_parameter("lm_head.weight", fresh);
  EXPECT_TRUE(shared.requires_grad());
  EXPECT_TRUE(fresh.requires_grad());
}

TEST_P(SharedParametersTest, SaveLoadRoundTripWithBothNames) {
  TempDir dir;
  const std::string path = dir.file("tied.safetensors");
  TiedLM saved(0, device()), loaded(1, device());
  ASSERT_NE(saved.wte->weight().to_vector<float>(), loaded.wte->weight().to_vector<float>());
  io::save_state_dict(path, saved);
  const io::SafetensorsContents file = io::load_safetensors(path);
  ASSERT_EQ(file.tensors.size(), 2u);
  EXPECT_EQ(names(file.tensors), (std::vector<std::string>{"wte.weight", "lm_head.weight"}));
  EXPECT_EQ(file.tensors[0].second.to_vector<float>(), file.tensors[1].second.to_vector<float>());
  const io::LoadedStateDict result = io::load_state_dict(path, loaded);
  EXPECT_TRUE(result.missing.empty());
  EXPECT_EQ(loaded.wte->weight().to_vector<float>(), saved.wte->weight().to_vector<float>());
  EXPECT_TRUE(loaded.lm_head->weight().is_same(loaded.wte->weight()));  // still tied
}

TEST_P(SharedParametersTest, LoadsAFileWrittenWithBothNames) {
  // What PyTorch's save_file({k: v.clone()}) writes for a tied model: two tensors, equal values.
  TempDir dir;
  std::vector<float> w(kVocab * kDim);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.125f * static_cast<float>(i) - 1.0f;
  const Tensor a = Tensor::from_vector(w, Shape{kVocab, kDim});
  io::save_safetensors(dir.file("both.safetensors"), {{"lm_head.weight", a}, {"wte.weight", a.clone()}});
  TiedLM model(0, device());
  io::load_state_dict(dir.file("both.safetensors"), model);
  EXPECT_EQ(model.wte->weight().to_vector<float>(), w);
  EXPECT_EQ(model.lm_head->weight().to_vector<float>(), w);

  // Values that differ under the two names are not a tied model's: refused, the module untouched.
  std::vector<float> other = w;
  other[5] += 1.0f;
  io::save_safetensors(dir.file("differ.safetensors"),
                       {{"wte.weight", a}, {"lm_head.weight", Tensor::from_vector(other, Shape{kVocab, kDim})}});
  TiedLM fresh(2, device());
  const std::vector<float> before = fresh.wte->weight().to_vector<float>();
  try {
    io::load_state_dict(dir.file("differ.safetensors"), fresh);
    ADD_FAILURE() << "differing values for one shared tensor were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'lm_head.weight': differs from 'wte.weight'"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(fresh.wte->weight().to_vector<float>(), before);
}

TEST_P(SharedParametersTest, AFileWithOneNameLoadsAsPyTorchSays) {
  // Hugging Face's GPT-2 file holds wte.weight alone (safetensors' save_model writes one name per
  // shared tensor). PyTorch's strict load_state_dict requires both keys, so the default refuses it,
  // saying how to load it; safetensors' load_model accepts it, as allow_missing_shared does.
  TempDir dir;
  const std::string path = dir.file("one.safetensors");
  std::vector<float> w(kVocab * kDim, 0.5f);
  io::save_safetensors(path, {{"wte.weight", Tensor::from_vector(w, Shape{kVocab, kDim})}});
  TiedLM model(0, device());
  try {
    io::load_state_dict(path, model);
    ADD_FAILURE() << "a missing name was accepted under strict loading";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("tensor 'lm_head.weight': not in the file"), std::string::npos) << m;
    EXPECT_NE(m.find("shares it with 'wte.weight'"), std::string::npos) << m;
    EXPECT_NE(m.find("allow_missing_shared"), std::string::npos) << m;
  }
  io::LoadStateDictOptions options;
  options.allow_missing_shared = true;
  const io::LoadedStateDict result = io::load_state_dict(path, model, options);
  EXPECT_TRUE(result.missing.empty());
  EXPECT_EQ(model.lm_head->weight().to_vector<float>(), w);
  // PyTorch's strict=False loads it too, and reports the name among the missing keys.
  TiedLM other(1, device());
  io::LoadStateDictOptions lenient;
  lenient.allow_missing = true;
  EXPECT_EQ(io::load_state_dict(path, other, lenient).missing, std::vector<std::string>{"lm_head.weight"});
  EXPECT_EQ(other.lm_head->weight().to_vector<float>(), w);
  // allow_missing_shared excuses a shared name only: a file without the tensor at all is refused.
  io::save_safetensors(dir.file("none.safetensors"), {});
  EXPECT_THROW(io::load_state_dict(dir.file("none.safetensors"), model, options), Error);
}

// Gradients of a Sequential whose first and last Linear share a weight, with every activation stored
// or the whole run recomputed (Note [Recompute]; the checkpoint's parameter list then holds the
// shared tensor twice, once per layer): the same summed gradient.
std::vector<float> sequential_gradient(Device device, bool recompute) {
  Generator gen(4);
  nn::Sequential seq;
  auto first = std::make_shared<nn::Linear>(kDim, kDim, gen, device, false);
  seq.add(first).add(std::make_shared<nn::ReLU>()).add(std::make_shared<nn::Linear>(kDim, kDim, gen, device, false));
  seq.share_parameter("2.weight", first->weight());
  if (recompute) seq.set_recompute({{0, 3}});
  const Tensor x = nn::init::normal_(Tensor::zeros(Shape{3, kDim}, DType::f32, device), 0.0f, 1.0f, 5);
  ops::sum(seq(x)).backward();
  return first->weight().grad().to_vector<float>();
}

TEST_P(SharedParametersTest, RecomputedSegmentSumsTheSharedGradientOnce) {
  const std::vector<float> stored = sequential_gradient(device(), false);
  const std::vector<float> recomputed = sequential_gradient(device(), true);
  ASSERT_EQ(stored.size(), recomputed.size());
  for (std::size_t i = 0; i < stored.size(); ++i) EXPECT_NEAR(recomputed[i], stored[i], 1e-6f) << i;
}

// A module that registers its parameter without a slot: it reads `w_`, which a replacement in the
// registry would not reach.
class NoSlot : public nn::Module {
 public:
  NoSlot() { w_ = register_parameter("w", Tensor::zeros(Shape{kVocab, kDim}), Device::cpu()); }
  Tensor forward(const Tensor& x) override { return x; }

 private:
  Tensor w_;
};

TEST(SharedParameters, ShareParameterErrorsNameTheParameter) {
  TiedLM model(0, Device::cpu());
  auto message = [&](const std::string& name, const Tensor& t) -> std::string {
    try {
      model.share_parameter(name, t);
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "no error";
  };
  const Tensor w = model.wte->weight();
  EXPECT_NE(message("head.weight", w).find("Module::share_parameter(\"head.weight\"): no child module 'head'"),
            std::string::npos);
  EXPECT_NE(message("lm_head.bias", w).find("no parameter of that name"), std::string::npos);
  EXPECT_NE(message("lm_head.weight", Tensor::zeros(Shape{kDim, kVocab})).find("leaf that requires grad"),
            std::string::npos);
  Tensor wrong_shape = Tensor::zeros(Shape{kDim, kVocab});
  wrong_shape.set_requires_grad(true);
  EXPECT_NE(message("lm_head.weight", wrong_shape).find("the parameter Tensor[7, 4]"), std::string::npos)
      << message("lm_head.weight", wrong_shape);
  NoSlot no_slot;
  try {
    no_slot.share_parameter("w", w);
    ADD_FAILURE() << "a parameter without a slot was replaced";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("without a slot"), std::string::npos) << e.what();
  }
  // The refused calls changed nothing.
  EXPECT_TRUE(model.lm_head->weight().is_same(w));
}

CUMULUS_INSTANTIATE_DEVICES(SharedParametersTest);

}  // namespace
}  // namespace cumulus
