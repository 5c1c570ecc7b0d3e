// own_gpt: a GPT written by a user from the library's parts, as nanoGPT writes it in PyTorch (the
// same model as models::GPT and bench/pytorch/gpt.py, without either): modules for attention, MLP
// and block, the fused causal attention on views of the qkv projection, weight tying, and training
// with the Trainer, the token as the unit of accumulation.
//   own_gpt CORPUS [steps] [cpu|cuda]     (e.g. own_gpt ../shared/data/shakespeare/shakespeare.txt 100)
#include <cmath>
#include <fstream>
#include <sstream>

#include <cumulus/cumulus.h>
#include <cumulus/models/text.h>
#include <cumulus/ops/attention.h>

using namespace cumulus;
constexpr int64_t kContext = 64, kWidth = 128, kHeads = 4, kLayers = 4, kBatch = 8, kAccum = 4;

struct Attention : nn::Module {
  Attention(Generator& gen, Device device)
      : c_attn(register_module("c_attn", std::make_shared<nn::Linear>(kWidth, 3 * kWidth, gen, device))),
        c_proj(register_module("c_proj", std::make_shared<nn::Linear>(kWidth, kWidth, gen, device))) {}
  Tensor forward(const Tensor& x) override {
    const int64_t B = x.size(0), T = x.size(1);
    auto heads = [&](const Tensor& t) { return t.reshape({B, T, kHeads, -1}).transpose(1, 2); };
    const std::vector<Tensor> qkv = ops::split((*c_attn)(x), kWidth, 2);
    const Tensor y = ops::scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), true);
    return (*c_proj)(y.transpose(1, 2).reshape({B, T, kWidth}));
  }
  std::shared_ptr<nn::Linear> c_attn, c_proj;
};

struct MLP : nn::Module {
  MLP(Generator& gen, Device device)
      : c_fc(register_module("c_fc", std::make_shared<nn::Linear>(kWidth, 4 * kWidth, gen, device))),
        c_proj(register_module("c_proj", std::make_shared<nn::Linear>(4 * kWidth, kWidth, gen, device))) {}
  Tensor forward(const Tensor& x) override { return (*c_proj)(ops::gelu((*c_fc)(x), ops::GeluApproximation::tanh)); }
  std::shared_ptr<nn::Linear> c_fc, c_proj;
};

struct Block : nn::Module {
  Block(Generator& gen, Device device)
      : ln_1(register_module("ln_1", std::make_shared<nn::LayerNorm>(kWidth, 1e-5f, true, device))),
        attn(register_module("attn", std::make_shared<Attention>(gen, device))),
        ln_2(register_module("ln_2", std::make_shared<nn::LayerNorm>(kWidth, 1e-5f, true, device))),
        mlp(register_module("mlp", std::make_shared<MLP>(gen, device))) {}
  Tensor forward(const Tensor& x) override {
    const Tensor h = x + (*attn)((*ln_1)(x));
    return h + (*mlp)((*ln_2)(h));
  }
  std::shared_ptr<nn::LayerNorm> ln_1, ln_2;
  std::shared_ptr<Attention> attn;
  std::shared_ptr<MLP> mlp;
};

struct GPT : nn::Module {
  GPT(int64_t vocab, Generator& gen, Device device)
      : wte(register_module("wte", std::make_shared<nn::Embedding>(vocab, kWidth, gen, device))),
        wpe(register_module("wpe", std::make_shared<nn::Embedding>(kContext, kWidth, gen, device))),
        ln_f(register_module("ln_f", std::make_shared<nn::LayerNorm>(kWidth, 1e-5f, true, device))),
        lm_head(register_module("lm_head", std::make_shared<nn::Linear>(kWidth, vocab, gen, device, false))) {
    for (int i = 0; i < kLayers; ++i)
      blocks.push_back(register_module("h" + std::to_string(i), std::make_shared<Block>(gen, device)));
    for (const auto& [name, p] : named_parameters())  // GPT-2's initialization
      if (p.ndim() == 2)
        nn::init::normal_(p, 0.0f, name.find("c_proj") != std::string::npos ? 0.02f / std::sqrt(2.0f * kLayers) : 0.02f,
                          gen);
      else if (name.find("ln_") == std::string::npos) nn::init::zeros_(p);
    share_parameter("lm_head.weight", wte->weight());
  }
  Tensor forward(const Tensor& idx) override {
    Tensor x = (*wte)(idx) + (*wpe)(ops::arange(idx.size(1), idx.device()));
    for (const auto& block : blocks) x = (*block)(x);
    return (*lm_head)((*ln_f)(x));
  }
  std::shared_ptr<nn::Embedding> wte, wpe;
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> lm_head;
  std::vector<std::shared_ptr<Block>> blocks;
};

int main(int argc, char** argv) try {
  if (argc < 2) throw InvalidArgument("usage: own_gpt CORPUS [steps] [cpu|cuda]");
  const int64_t steps = argc > 2 ? std::stoll(argv[2]) : 100;
  const Device device = argc > 3 ? Device::parse(argv[3]) : Device::cpu();
  std::ifstream file(argv[1], std::ios::binary);
  if (!file) throw Error(std::string("cannot read ") + argv[1]);
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const models::CharVocabulary vocab = models::CharVocabulary::of_text(text);
  const models::TokenSplit split = models::split_tokens(vocab.encode(text), 0.9, kContext + 1);
  const data::TokenWindows train(split.train, kContext, /*seed=*/1337, device);

  Generator gen(1337);
  GPT model(vocab.size(), gen, device);
  optim::AdamWOptions adamw;
  adamw.lr = 1e-3f;
  adamw.beta2 = 0.99f;
  adamw.weight_decay = 0.1f;
  auto optimizer = std::make_shared<optim::AdamW>(std::make_shared<nn::FlatParameters>(model), adamw);
  optimizer->set_param_groups(optim::decay_matrices_only(model.named_parameters(), adamw.weight_decay));
  train::TrainerOptions options;
  options.accum_steps = kAccum;
  options.clip_grad_norm = 1.0f;
  options.on_step = [](const train::StepLog& s) {
    if (s.step % 10 == 0) std::printf("step %4lld  loss %.4f  lr %.2e\n", static_cast<long long>(s.step), s.loss, s.lr);
  };
  train::Trainer trainer(optimizer, options, std::make_shared<optim::CosineWarmupLR>(adamw.lr, steps / 10, steps));
  trainer.begin_epoch(0, steps * kAccum);
  for (int64_t i = 0; i < steps * kAccum; ++i) {
    const data::Batch b = train.random_batch(i, kBatch);
    trainer.micro_batch(b.units, [&] { return ops::cross_entropy(model(b.x), b.y, ops::Reduction::Sum); });
    trainer.step_if_ready();
  }
  return 0;
} catch (const Error& e) {
  std::fprintf(stderr, "own_gpt: %s\n", e.what());
  return 1;
}
