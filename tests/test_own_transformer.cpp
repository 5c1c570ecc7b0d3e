// docs/library.md's "Your own transformer", compiled and run: a Llama-style model written on the
// public API (RMSNorm, rotary tables as non-persistent buffers, a SwiGLU MLP with silu and chunk,
// no biases, the head tied to the embedding, blocks in a ModuleList called with their own
// arguments) trained by a loop written by hand with clip_grad_norm. Keep the two in step.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "cumulus/cumulus.h"
#include "test_util.h"

namespace cumulus::testing {
namespace {

// ---- the docs' example, from here ----
struct Config {
  int64_t vocab = 32, dim = 16, heads = 2, layers = 2, hidden = 32, context = 8;
};

class Block : public nn::CustomModule<Block> {
 public:
  Block(const Config& c, Generator& gen, Device device) : c_(c) {
    attn_norm = register_module("attn_norm", std::make_shared<nn::RMSNorm>(Shape{c.dim}, 1e-5f, true, device));
    qkv = register_module("qkv", std::make_shared<nn::Linear>(c.dim, 3 * c.dim, gen, device, false));
    out = register_module("out", std::make_shared<nn::Linear>(c.dim, c.dim, gen, device, false));
    mlp_norm = register_module("mlp_norm", std::make_shared<nn::RMSNorm>(Shape{c.dim}, 1e-5f, true, device));
    gate_up = register_module("gate_up", std::make_shared<nn::Linear>(c.dim, 2 * c.hidden, gen, device, false));
    down = register_module("down", std::make_shared<nn::Linear>(c.hidden, c.dim, gen, device, false));
  }
  Tensor forward(const Tensor& x, const Tensor& cos, const Tensor& sin) {
    const int64_t B = x.size(0), T = x.size(1), H = c_.heads, D = c_.dim / c_.heads;
    auto heads = [&](const Tensor& t) { return ops::transpose(ops::reshape(t, {B, T, H, D}), 1, 2); };
    const std::vector<Tensor> q_k_v = ops::chunk((*qkv)((*attn_norm)(x)), 3, -1);
    const Tensor a = ops::scaled_dot_product_attention(ops::apply_rotary(heads(q_k_v[0]), cos, sin),
                                                       ops::apply_rotary(heads(q_k_v[1]), cos, sin), heads(q_k_v[2]),
                                                       true);
    const Tensor h = ops::add(x, (*out)(ops::reshape(ops::transpose(a, 1, 2), {B, T, c_.dim})));
    const std::vector<Tensor> gate_and_up = ops::chunk((*gate_up)((*mlp_norm)(h)), 2, -1);
    return ops::add(h, (*down)(ops::mul(ops::silu(gate_and_up[0]), gate_and_up[1])));
  }
  std::shared_ptr<nn::RMSNorm> attn_norm, mlp_norm;
  std::shared_ptr<nn::Linear> qkv, out, gate_up, down;

 private:
  Config c_;
};

class Llama : public nn::Module {
 public:
  Llama(const Config& c, Generator& gen, Device device) {
    embed = register_module("embed", std::make_shared<nn::Embedding>(c.vocab, c.dim, gen, device));
    layers = register_module("layers", std::make_shared<nn::ModuleList>());
    for (int64_t i = 0; i < c.layers; ++i) layers->add(std::make_shared<Block>(c, gen, device));
    norm = register_module("norm", std::make_shared<nn::RMSNorm>(Shape{c.dim}, 1e-5f, true, device));
    head = register_module("head", std::make_shared<nn::Linear>(c.dim, c.vocab, gen, device, false));
    share_parameter("head.weight", embed->weight());  // tied before the optimizer exists
    // cos and sin [context, D] (Llama's rotate_half layout); not persistent: recomputed from the
    // configuration, not in the state dict.
    const ops::RotaryTables rope = ops::rotary_tables(c.context, c.dim / c.heads, 10000.0, device);
    cos = register_buffer("cos", rope.cos, false);
    sin = register_buffer("sin", rope.sin, false);
  }
  Tensor forward(const Tensor& tokens) override {  // [B, T] i32 -> logits [B, T, vocab]
    Tensor x = (*embed)(tokens);
    for (std::size_t i = 0; i < layers->size(); ++i) x = layers->at<Block>(i)(x, cos, sin);  // tables' first T rows
    return (*head)((*norm)(x));
  }
  std::shared_ptr<nn::Embedding> embed;
  std::shared_ptr<nn::ModuleList> layers;
  std::shared_ptr<nn::RMSNorm> norm;
  std::shared_ptr<nn::Linear> head;
  Tensor cos, sin;
};
// ---- to here ----

class OwnTransformerTest : public DeviceTest {};

TEST_P(OwnTransformerTest, TrainsByHandWithClipping) {
  const Config c;
  Generator gen(0);
  Llama model(c, gen, device());
  auto params = std::make_shared<nn::FlatParameters>(model);
  optim::AdamW optimizer(params, optim::AdamWOptions{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f});
  // The docs' loop: next-token prediction of a fixed sequence, 4 windows of 8 tokens.
  std::vector<int32_t> x_v, y_v;
  for (int b = 0; b < 4; ++b)
    for (int t = 0; t < 8; ++t) {
      x_v.push_back((3 * b + 5 * t) % 32);
      y_v.push_back((3 * b + 5 * (t + 1)) % 32);
    }
  const Tensor x = Tensor::from_vector(x_v, {4, 8}, device()), y = Tensor::from_vector(y_v, {32}, device());
  std::vector<float> losses;
  for (int step = 0; step < 30; ++step) {
    const Tensor logits = ops::reshape(model(x), {32, c.vocab});
    const Tensor loss = ops::div(ops::cross_entropy(logits, y, ops::Reduction::Sum), 32.0f);
    loss.backward();
    const float norm = nn::clip_grad_norm(*params, 1.0f);
    ASSERT_TRUE(std::isfinite(norm));
    optimizer.step();
    optimizer.zero_grad();
    losses.push_back(loss.to(Device::cpu()).item());
  }
  EXPECT_LT(losses.back(), 0.5f * losses.front()) << "first " << losses.front() << ", last " << losses.back();
  // One parameter for the tied pair, the tables out of the state dict, both names in it.
  std::vector<std::string> names, state;
  for (const auto& [name, t] : model.named_parameters()) names.push_back(name);
  for (const auto& [name, t] : model.state_dict()) state.push_back(name);
  EXPECT_EQ(std::count(names.begin(), names.end(), "head.weight"), 0);
  EXPECT_EQ(std::count(state.begin(), state.end(), "head.weight"), 1);
  EXPECT_EQ(std::count(state.begin(), state.end(), "cos"), 0);
  EXPECT_EQ(names.front(), "embed.weight");
  EXPECT_EQ(names[1], "layers.0.attn_norm.weight");
}

CUMULUS_INSTANTIATE_DEVICES(OwnTransformerTest);

}  // namespace
}  // namespace cumulus::testing
