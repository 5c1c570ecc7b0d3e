// models::GPT (nanoGPT's model on cumulus) and data::TokenWindows: the state dict has nanoGPT's
// names with the LM head tied to the token embedding; GPT-2's initialization; recompute per block
// changes no gradient; the key/value cache gives the full forward's logits; sampling is seeded; the
// token windows are a function of (seed, batch, row) with targets the inputs shifted by one.
#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "cumulus/core/error.h"
#include "cumulus/core/precision.h"
#include "cumulus/data/token_windows.h"
#include "cumulus/models/gpt.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/ops/loss.h"
#include "cumulus/ops/shape.h"
#include "cumulus/optim/adamw.h"
#include "cumulus/plan/planner.h"
#include "cumulus/train/trainer.h"
#include "test_util.h"

namespace cumulus {
namespace {

using testing::DeviceTest;

models::GPTConfig tiny_config() {
  models::GPTConfig c;
  c.vocab_size = 11;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  return c;
}

Tensor tokens(const std::vector<int64_t>& values, int64_t b, int64_t t, Device device) {
  return Tensor::from_vector(values, Shape{b, t}, device);
}

std::vector<int64_t> counting(int64_t n, int64_t vocab) {
  std::vector<int64_t> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = (i * 7 + 3) % vocab;
  return v;
}

TEST(Gpt, StateDictHasNanoGptsNamesAndTheHeadIsTheTokenEmbedding) {
  Generator gen(1);
  models::GPT model(tiny_config(), gen);
  std::vector<std::string> names;
  for (const auto& [name, t] : model.state_dict()) names.push_back(name);
  const std::vector<std::string> block = {
      "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
      "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
  std::vector<std::string> expected = {"transformer.wte.weight", "transformer.wpe.weight"};
  for (int i = 0; i < 2; ++i)
    for (const std::string& n : block) expected.push_back("transformer.h." + std::to_string(i) + "." + n);
  expected.insert(expected.end(), {"transformer.ln_f.weight", "transformer.ln_f.bias", "lm_head.weight"});
  EXPECT_EQ(names, expected);
  const auto sd = model.state_dict();
  EXPECT_EQ(sd.front().second.raw_data(), sd.back().second.raw_data());
  // Counted once: 2 embeddings + 2 blocks + ln_f, the head adding nothing.
  const int64_t c = 8, v = 11, t = 8;
  const int64_t per_block = 2 * c + (c * 3 * c + 3 * c) + (c * c + c) + 2 * c + (c * 4 * c + 4 * c) + (4 * c * c + c);
  EXPECT_EQ(model.num_parameters(), v * c + t * c + 2 * per_block + 2 * c);
}

TEST(Gpt, InitializationIsGpt2s) {
  models::GPTConfig config = tiny_config();
  config.n_embd = 64;
  config.n_head = 4;
  config.n_layer = 8;
  Generator gen(2);
  models::GPT model(config, gen);
  auto stddev = [](const Tensor& t) {
    const std::vector<float> v = t.to_vector<float>();
    double s = 0.0, s2 = 0.0;
    for (float x : v) s += x, s2 += double(x) * x;
    const double m = s / double(v.size());
    return std::sqrt(s2 / double(v.size()) - m * m);
  };
  for (const auto& [name, t] : model.state_dict()) {
    if (name.find("bias") != std::string::npos) {
      const float expect = 0.0f;
      for (float x : t.to_vector<float>()) ASSERT_EQ(x, expect) << name;
    } else if (name.find("ln_") != std::string::npos) {
      for (float x : t.to_vector<float>()) ASSERT_EQ(x, 1.0f) << name;
    } else if (name.find("c_proj.weight") != std::string::npos) {
      EXPECT_NEAR(stddev(t), 0.02 / std::sqrt(16.0), 0.0008) << name;
    } else {
      EXPECT_NEAR(stddev(t), 0.02, 0.002) << name;
    }
  }
}

TEST(Gpt, BadConfigsAndInputsAreErrorsNamingTheValue) {
  Generator gen(1);
  models::GPTConfig c = tiny_config();
  c.n_head = 3;
  EXPECT_THROW(models::GPT(c, gen), InvalidArgument);
  models::GPT model(tiny_config(), gen);
  EXPECT_THROW(model(tokens(counting(9, 11), 1, 9, Device::cpu())), InvalidArgument);  // past block_size
  EXPECT_THROW(model.set_recompute_segments(4u), InvalidArgument);                     // only 2 blocks
}

TEST_P(DeviceTest, GptLossAtInitIsNearLogVocabAndRecomputeChangesNoGradient) {
  Generator gen(3);
  models::GPT model(tiny_config(), gen, device());
  const Tensor x = tokens(counting(16, 11), 2, 8, device());
  const Tensor y = tokens(counting(16, 5), 2, 8, device());  // any labels
  auto grads = [&]() {
    model.zero_grad();
    const Tensor loss = model.loss(x, y, ops::Reduction::Mean);
    loss.backward();
    std::vector<std::vector<float>> g{{loss.to(Device::cpu()).item()}};
    for (const Tensor& p : model.parameters()) g.push_back(p.grad().to(Device::cpu()).to_vector<float>());
    return g;
  };
  const auto stored = grads();
  EXPECT_NEAR(stored[0][0], std::log(11.0), 0.1);
  model.set_recompute_segments(2u);  // block 1 only
  EXPECT_EQ(grads(), stored);
  model.set_recompute(true);
  EXPECT_EQ(model.recompute_segment_names(), (std::vector<std::string>{"h.0", "h.1"}));
  EXPECT_EQ(grads(), stored);
}

TEST_P(DeviceTest, GptKeyValueCacheGivesTheFullForwardsLogits) {
  Generator gen(4);
  models::GPT model(tiny_config(), gen, device());
  model.eval();
  const std::vector<int64_t> seq = counting(8, 11);
  const std::vector<float> full = model(tokens(seq, 1, 8, device())).to(Device::cpu()).to_vector<float>();
  models::KVCache cache = model.make_cache(1);
  std::vector<float> cached = model.forward_cached(tokens({seq.begin(), seq.begin() + 3}, 1, 3, device()), cache)
                                  .to(Device::cpu())
                                  .to_vector<float>();
  for (int64_t i = 3; i < 8; ++i) {
    const std::vector<float> step =
        model.forward_cached(tokens({seq[static_cast<std::size_t>(i)]}, 1, 1, device()), cache)
            .to(Device::cpu())
            .to_vector<float>();
    cached.insert(cached.end(), step.begin(), step.end());
  }
  EXPECT_EQ(cache.length, 8);
  ASSERT_EQ(cached.size(), full.size());
  for (std::size_t i = 0; i < full.size(); ++i) EXPECT_NEAR(cached[i], full[i], 1e-5) << i;
  EXPECT_THROW(model.forward_cached(tokens({1}, 1, 1, device()), cache), InvalidArgument);  // full
}

// The loss and every parameter's gradient of one micro-batch, the model computing in `dtype`.
std::vector<std::vector<float>> loss_and_grads(DType dtype, Device device) {
  Generator gen(3);
  models::GPT model(tiny_config(), gen, device);
  model.set_compute_dtype(dtype);
  const Tensor x = tokens(counting(16, 11), 2, 8, device);
  const Tensor logits = model(x);
  EXPECT_EQ(logits.dtype(), dtype);
  const Tensor loss = ops::cross_entropy(logits, tokens(counting(16, 5), 2, 8, device), ops::Reduction::Mean);
  loss.backward();
  std::vector<std::vector<float>> out{{loss.to(Device::cpu()).item()}};
  for (const Tensor& p : model.parameters()) {
    EXPECT_EQ(p.dtype(), DType::f32);
    EXPECT_EQ(p.grad().dtype(), DType::f32);
    out.push_back(p.grad().to(Device::cpu()).to_vector<float>());
  }
  return out;
}

double relative_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    diff += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    norm += double(ref[i]) * ref[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

// bf16 keeps 8 bits of mantissa, f16 11: the loss to a few 1e-3, each gradient to a few percent.
TEST_P(DeviceTest, GptInSixteenBitsFollowsF32WithF32ParametersAndGradients) {
  const auto ref = loss_and_grads(DType::f32, device());
  for (DType dtype : {DType::bf16, DType::f16}) {
    const auto got = loss_and_grads(dtype, device());
    ASSERT_EQ(got.size(), ref.size());
    EXPECT_NEAR(got[0][0], ref[0][0], 1e-2 * ref[0][0]) << dtype_name(dtype);
    const double tolerance = dtype == DType::bf16 ? 0.06 : 0.01;
    for (std::size_t i = 1; i < ref.size(); ++i)
      EXPECT_LT(relative_l2(got[i], ref[i]), tolerance) << dtype_name(dtype) << " parameter " << i;
  }
  Generator gen(3);
  models::GPT model(tiny_config(), gen, device());
  EXPECT_THROW(model.set_compute_dtype(DType::i32), InvalidArgument);
}

TEST_P(DeviceTest, GptKeyValueCacheInBf16GivesTheFullForwardsLogits) {
  Generator gen(4);
  models::GPT model(tiny_config(), gen, device());
  model.set_compute_dtype(DType::bf16).eval();
  const std::vector<int64_t> seq = counting(8, 11);
  const Tensor full = ops::cast(model(tokens(seq, 1, 8, device())), DType::f32);
  models::KVCache cache = model.make_cache(1);
  EXPECT_EQ(cache.k[0].dtype(), DType::bf16);
  model.forward_cached(tokens({seq.begin(), seq.begin() + 7}, 1, 7, device()), cache);
  const Tensor last = ops::cast(model.forward_cached(tokens({seq[7]}, 1, 1, device()), cache), DType::f32);
  const std::vector<float> want = ops::narrow(full, 1, 7, 1).to(Device::cpu()).to_vector<float>();
  const std::vector<float> got = last.to(Device::cpu()).to_vector<float>();
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LT(relative_l2(got, want), 0.02);
  EXPECT_EQ(models::generate(model, {1, 2}, 12, 0.0, 0, 1).size(), 14u);
}

// Per-step losses of the tiny GPT trained 2 x 2 with AdamW on one fixed batch, computing in `dtype`
// (f16 with dynamic loss scaling).
std::vector<float> training_losses(DType dtype, int steps) {
  Generator gen(6);
  models::GPT model(tiny_config(), gen, Device::cpu());
  model.set_compute_dtype(dtype);
  auto flat = std::make_shared<nn::FlatParameters>(model);
  optim::AdamWOptions adamw;
  adamw.lr = 1e-2f;
  train::TrainerOptions options;
  options.accum_steps = 2;
  // Dynamic scaling from 2^8: this model's gradients times the default 2^16 overflow f16, and the
  // skipped steps would shift the losses against f32's.
  options.loss_scaling.dynamic = needs_loss_scaling(dtype == DType::f16 ? Precision::fp16 : Precision::fp32);
  options.loss_scaling.initial_scale = 256.0f;
  std::vector<float> losses;
  options.on_step = [&](const train::StepLog& log) { losses.push_back(log.loss); };
  train::Trainer trainer(std::make_shared<optim::AdamW>(flat, adamw), options);
  const Tensor x = tokens(counting(16, 11), 2, 8, Device::cpu());
  const std::vector<int64_t> next = counting(17, 11);
  const Tensor y = tokens({next.begin() + 1, next.end()}, 2, 8, Device::cpu());  // the next token of x's
  for (int i = 0; i < 2 * steps; ++i) {
    trainer.micro_batch(16, [&] { return model.loss(x, y, ops::Reduction::Sum); });
    trainer.step_if_ready();
  }
  EXPECT_EQ(trainer.counters().skipped_steps, 0) << dtype_name(dtype);
  return losses;
}

TEST(Gpt, TrainsInBf16AndFp16AsInF32) {
  const std::vector<float> f32 = training_losses(DType::f32, 30);
  ASSERT_EQ(f32.size(), 30u);
  EXPECT_LT(f32.back(), 0.5f * f32.front());  // it learns the batch
  for (DType dtype : {DType::bf16, DType::f16}) {
    const std::vector<float> got = training_losses(dtype, 30);
    ASSERT_EQ(got.size(), f32.size()) << dtype_name(dtype);
    for (std::size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], f32[i], 0.05 * f32[i] + 0.02) << dtype_name(dtype) << " step " << i;
  }
}

// --recompute auto: the planner weighs recomputing the first k of the L equal blocks, k = 0..L, and
// leaves its choice in place; masks past the segments are refused.
TEST(Gpt, ThePlannerWeighsRecomputingTheFirstKBlocks) {
  Generator gen(7);
  models::GPT model(tiny_config(), gen, Device::cpu());  // 2 blocks
  optim::AdamW adamw(std::make_shared<nn::FlatParameters>(model), optim::AdamWOptions{});
  const std::vector<int64_t> text = counting(400, 11);
  const data::TokenWindows windows(Tensor::from_vector(text, Shape{400}, Device::cpu()), 8, 1);
  plan::PlanRequest request = models::plan_request(model, adamw, windows, 4 * 8, 0, true);
  EXPECT_EQ(request.recompute_masks, (std::vector<uint32_t>{0u, 1u, 3u}));
  const plan::Plan plan = plan::plan_batch(request);
  std::set<uint32_t> weighed;
  for (const plan::Plan::Weighed& w : plan.weighed) weighed.insert(w.setting.recompute);
  EXPECT_EQ(weighed, (std::set<uint32_t>{0u, 1u, 3u}));
  ASSERT_GT(plan.micro_batch, 0);
  EXPECT_EQ(model.recompute_segments(), plan.setting.recompute);
  request.recompute_masks = {4u};
  EXPECT_THROW(plan::plan_batch(request), InvalidArgument);
}

TEST(Gpt, SamplingIsSeededGreedyAtTemperatureZeroAndSlidesPastTheContext) {
  Generator gen(5);
  models::GPT model(tiny_config(), gen);
  const std::vector<int64_t> prompt = {1, 2, 3};
  const std::vector<int64_t> a = models::generate(model, prompt, 20, 1.0, 5, 42);
  EXPECT_EQ(a, models::generate(model, prompt, 20, 1.0, 5, 42));
  EXPECT_NE(a, models::generate(model, prompt, 20, 1.0, 5, 43));
  ASSERT_EQ(a.size(), 23u);  // past block_size 8: the window slides
  EXPECT_EQ(std::vector<int64_t>(a.begin(), a.begin() + 3), prompt);
  // Greedy: each token is the argmax of the full forward over the (cropped) context.
  const std::vector<int64_t> g = models::generate(model, prompt, 10, 0.0, 0, 0);
  for (std::size_t n = 3; n < g.size(); ++n) {
    const std::size_t first = n > 8 ? n - 8 : 0;
    const std::vector<int64_t> context(g.begin() + static_cast<std::ptrdiff_t>(first),
                                       g.begin() + static_cast<std::ptrdiff_t>(n));
    const Tensor logits = model(tokens(context, 1, static_cast<int64_t>(context.size()), Device::cpu()));
    const std::vector<float> last = ops::narrow(logits, 1, logits.size(1) - 1, 1).contiguous().to_vector<float>();
    const auto best = std::max_element(last.begin(), last.end()) - last.begin();
    EXPECT_EQ(g[n], best) << n;
  }
  // top_k = 1 is greedy whatever the temperature.
  EXPECT_EQ(models::generate(model, prompt, 10, 2.0, 1, 7), g);
}

TEST_P(DeviceTest, TokenWindowsAreAFunctionOfSeedBatchAndRow) {
  std::vector<int32_t> stream(100);
  for (int i = 0; i < 100; ++i) stream[static_cast<std::size_t>(i)] = i;
  const data::TokenWindows windows(Tensor::from_vector(stream, Shape{100}), 10, 7, device());
  const std::vector<int64_t> o = windows.random_offsets(3, 4);
  EXPECT_EQ(o, windows.random_offsets(3, 4));
  EXPECT_NE(o, windows.random_offsets(4, 4));
  const std::vector<int64_t> six = windows.random_offsets(3, 6);
  EXPECT_EQ(std::vector<int64_t>(six.begin(), six.begin() + 4), o);  // row r's offset does not depend on B
  std::set<int64_t> seen;
  for (int64_t i = 0; i < 200; ++i)
    for (int64_t off : windows.random_offsets(i, 8)) {
      ASSERT_GE(off, 0);
      ASSERT_LE(off, 89);  // the last window [89, 100)
      seen.insert(off);
    }
  EXPECT_GT(seen.size(), 80u);
  const data::Batch b = windows.random_batch(3, 4);
  ASSERT_EQ(b.x.shape(), (Shape{4, 10}));
  EXPECT_EQ(b.units, 40);
  EXPECT_EQ(b.x.device(), device());
  const std::vector<int32_t> x = b.x.to(Device::cpu()).to_vector<int32_t>(),
                             y = b.y.to(Device::cpu()).to_vector<int32_t>();
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t i = 0; i < 10; ++i) {
      EXPECT_EQ(x[static_cast<std::size_t>(r * 10 + i)], o[static_cast<std::size_t>(r)] + i);
      EXPECT_EQ(y[static_cast<std::size_t>(r * 10 + i)], o[static_cast<std::size_t>(r)] + i + 1);
    }
  EXPECT_EQ(windows.num_sequential_windows(), 9);
  const data::Batch last = windows.sequential_batch(8, 4);  // one window left
  ASSERT_EQ(last.x.shape(), (Shape{1, 10}));
  EXPECT_EQ(last.y.to(Device::cpu()).to_vector<int32_t>().back(), 90);
}

TEST(TokenWindows, BadInputsAreErrors) {
  EXPECT_THROW(data::TokenWindows(Tensor::zeros(Shape{10}, DType::f32), 4, 0), InvalidArgument);
  EXPECT_THROW(data::TokenWindows(Tensor::zeros(Shape{4}, DType::i32), 4, 0), InvalidArgument);
  EXPECT_THROW(data::TokenWindows(Tensor::zeros(Shape{10}, DType::i32), 0, 0), InvalidArgument);
  const data::TokenWindows w(Tensor::zeros(Shape{10}, DType::i32), 4, 0);
  EXPECT_THROW(w.windows_at({6}), InvalidArgument);
  EXPECT_THROW(w.sequential_batch(2, 1), InvalidArgument);
}

// The offsets another framework must reproduce (bench/pytorch/gpt.py computes these too).
TEST(TokenWindows, OffsetsArePinned) {
  std::vector<int64_t> first;
  for (int64_t r = 0; r < 4; ++r) first.push_back(data::token_window_offset(1337, 5, r, 4551414));
  EXPECT_EQ(first, (std::vector<int64_t>{3048077, 3973353, 1724472, 3497191}));  // from Python
}

CUMULUS_INSTANTIATE_DEVICES(DeviceTest);

}  // namespace
}  // namespace cumulus
