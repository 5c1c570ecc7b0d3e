// own_llama: a Llama-style model written by a user from the library's parts, as one writes it in
// PyTorch (own_llama.py beside it is the twin, line for line): RMSNorm, rotary position tables as
// non-persistent buffers, a SwiGLU MLP, no biases, the head tied to the embedding, blocks in a
// ModuleList whose forward takes the tables; trained with the Trainer, 8 x 4 accumulation counted
// in tokens, AdamW with decay on matrices only, warmup and cosine, clipping.
//   own_llama CORPUS [steps] [cpu|cuda] [INIT_OUT]   (INIT_OUT: the initial weights, for the twin)
#include <chrono>
#include <fstream>

#include <cumulus/cumulus.h>
#include <cumulus/models/text.h>

using namespace cumulus;
constexpr int64_t kDim = 128, kHeads = 4, kLayers = 4, kHidden = 352, kContext = 64;
constexpr int64_t kBatch = 8, kAccum = 4;

struct Block : nn::CustomModule<Block> {
  Block(Generator& gen, Device d)
      : attn_norm(register_module("attn_norm", std::make_shared<nn::RMSNorm>(Shape{kDim}, std::nullopt, true, d))),
        qkv(register_module("qkv", std::make_shared<nn::Linear>(kDim, 3 * kDim, gen, d, false))),
        out(register_module("out", std::make_shared<nn::Linear>(kDim, kDim, gen, d, false))),
        mlp_norm(register_module("mlp_norm", std::make_shared<nn::RMSNorm>(Shape{kDim}, std::nullopt, true, d))),
        gate_up(register_module("gate_up", std::make_shared<nn::Linear>(kDim, 2 * kHidden, gen, d, false))),
        down(register_module("down", std::make_shared<nn::Linear>(kHidden, kDim, gen, d, false))) {}
  Tensor forward(const Tensor& x, const Tensor& cos, const Tensor& sin) {
    const int64_t B = x.size(0), T = x.size(1);
    auto heads = [&](const Tensor& t) { return t.reshape({B, T, kHeads, -1}).transpose(1, 2); };
    const std::vector<Tensor> q = ops::chunk((*qkv)((*attn_norm)(x)), 3, -1);
    const Tensor a = ops::scaled_dot_product_attention(ops::apply_rotary(heads(q[0]), cos, sin),
                                                       ops::apply_rotary(heads(q[1]), cos, sin), heads(q[2]), true);
    const Tensor h = x + (*out)(a.transpose(1, 2).reshape({B, T, kDim}));
    const std::vector<Tensor> gate = ops::chunk((*gate_up)((*mlp_norm)(h)), 2, -1);
    return h + (*down)(ops::silu(gate[0]) * gate[1]);
  }
  std::shared_ptr<nn::RMSNorm> attn_norm;
  std::shared_ptr<nn::Linear> qkv, out;
  std::shared_ptr<nn::RMSNorm> mlp_norm;
  std::shared_ptr<nn::Linear> gate_up, down;
};

struct Llama : nn::Module {
  Llama(int64_t vocab, Generator& gen, Device d)
      : embed(register_module("embed", std::make_shared<nn::Embedding>(vocab, kDim, gen, d))),
        layers(register_module("layers", std::make_shared<nn::ModuleList>())),
        norm(register_module("norm", std::make_shared<nn::RMSNorm>(Shape{kDim}, std::nullopt, true, d))),
        head(register_module("head", std::make_shared<nn::Linear>(kDim, vocab, gen, d, false))) {
    for (int64_t i = 0; i < kLayers; ++i) layers->add(std::make_shared<Block>(gen, d));
    nn::init::normal_(embed->weight(), 0.0f, 0.02f, gen);
    share_parameter("head.weight", embed->weight());
    const ops::RotaryTables rope = ops::rotary_tables(kContext, kDim / kHeads, 10000.0, d);
    cos = register_buffer("cos", rope.cos, false);  // not persistent: out of the state dict
    sin = register_buffer("sin", rope.sin, false);
  }
  Tensor forward(const Tensor& tokens) override {
    Tensor x = (*embed)(tokens);
    for (std::size_t i = 0; i < layers->size(); ++i) x = layers->at<Block>(i)(x, cos, sin);
    return (*head)((*norm)(x));
  }
  std::shared_ptr<nn::Embedding> embed;
  std::shared_ptr<nn::ModuleList> layers;
  std::shared_ptr<nn::RMSNorm> norm;
  std::shared_ptr<nn::Linear> head;
  Tensor cos, sin;
};

int main(int argc, char** argv) try {
  if (argc < 2) throw InvalidArgument("usage: own_llama CORPUS [steps] [cpu|cuda] [INIT_OUT]");
  const int64_t steps = argc > 2 ? std::stoll(argv[2]) : 100;
  const Device device = argc > 3 ? Device::parse(argv[3]) : Device::cpu();
  use_cpu_threads(0);  // every core, or OMP_NUM_THREADS where set, as PyTorch
  std::ifstream file(argv[1], std::ios::binary);
  if (!file) throw Error(std::string("cannot read ") + argv[1]);
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const models::CharVocabulary vocab = models::CharVocabulary::of_text(text);
  const models::TokenSplit split = models::split_tokens(vocab.encode(text), 0.9, kContext + 1);
  const data::TokenWindows train(split.train, kContext, /*seed=*/1337, device);

  Generator gen(1337);
  Llama model(vocab.size(), gen, device);
  if (argc > 4) io::save_safetensors(argv[4], model.state_dict());
  optim::AdamWOptions adamw{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
  auto optimizer = std::make_shared<optim::AdamW>(std::make_shared<nn::FlatParameters>(model), adamw);
  optimizer->set_param_groups(optim::decay_matrices_only(model.named_parameters(), adamw.weight_decay));
  train::TrainerOptions options;
  options.accum_steps = kAccum;
  options.clip_grad_norm = 1.0f;
  auto start = std::chrono::steady_clock::now();
  options.on_step = [&](const train::StepLog& s) {
    if (s.step == 1) start = std::chrono::steady_clock::now();  // the first step warms the caches
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::printf("step %4lld  loss %.7f  lr %.6e  ms/step %.2f\n", static_cast<long long>(s.step), s.loss, s.lr,
                s.step > 1 ? ms / static_cast<double>(s.step - 1) : 0.0);
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
  std::fprintf(stderr, "own_llama: %s\n", e.what());
  return 1;
}
