#include "cumulus/models/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "cumulus/autograd/checkpoint.h"
#include "cumulus/autograd/grad_mode.h"
#include "cumulus/core/error.h"
#include "cumulus/io/safetensors.h"
#include "cumulus/io/state_dict.h"
#include "cumulus/nn/embedding.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/init.h"
#include "cumulus/ops/attention.h"
#include "cumulus/ops/compare.h"
#include "cumulus/ops/loss.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/ops/shape.h"
#include "cumulus/optim/optimizer.h"
#include "cumulus/train/trainer.h"

namespace cumulus::models {

namespace {

constexpr float kInitStd = 0.02f;

// nanoGPT's `transformer` ModuleDict and `h` ModuleList: named children, no forward of their own.
class Container : public nn::Module {
 public:
  Tensor forward(const Tensor&) override {
    throw InvalidArgument("a GPT's module container (transformer, transformer.h) has no forward of its own");
  }
  template <typename M>
  std::shared_ptr<M> add(const std::string& name, std::shared_ptr<M> module) {
    return register_module(name, std::move(module));
  }
};

// [B, T, C] -> [B, H, T, D]: a view of x.
Tensor split_heads(const Tensor& x, int64_t n_head) {
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
  return ops::permute(ops::reshape(x, {b, t, n_head, c / n_head}), {0, 2, 1, 3});
}

// [B, H, T, D] -> [B, T, C]: a view of the attention's output, which is laid out [B, T, H, D].
Tensor merge_heads(const Tensor& y) {
  const int64_t b = y.size(0), h = y.size(1), t = y.size(2), d = y.size(3);
  return ops::reshape(ops::permute(y, {0, 2, 1, 3}), {b, t, h * d});
}

void init_linear(nn::Linear& layer, float std, Generator& gen) {
  nn::init::normal_(layer.weight(), 0.0f, std, gen);
  if (layer.bias().defined()) nn::init::zeros_(layer.bias());
}

}  // namespace

void GPTConfig::validate() const {
  CUMULUS_CHECK(vocab_size > 0, InvalidArgument, "GPT: vocab_size must be positive, got ", vocab_size);
  CUMULUS_CHECK(block_size > 0, InvalidArgument, "GPT: block_size must be positive, got ", block_size);
  CUMULUS_CHECK(n_layer > 0 && n_layer <= 32, InvalidArgument, "GPT: n_layer must be in [1, 32], got ", n_layer);
  CUMULUS_CHECK(n_head > 0, InvalidArgument, "GPT: n_head must be positive, got ", n_head);
  CUMULUS_CHECK(n_embd > 0 && n_embd % n_head == 0, InvalidArgument, "GPT: n_embd (", n_embd,
                ") must be a positive multiple of n_head (", n_head, ")");
}

CausalSelfAttention::CausalSelfAttention(const GPTConfig& config, Generator& gen, Device device)
    : n_head_(config.n_head), n_embd_(config.n_embd) {
  c_attn_ = register_module("c_attn", std::make_shared<nn::Linear>(n_embd_, 3 * n_embd_, gen, device));
  c_proj_ = register_module("c_proj", std::make_shared<nn::Linear>(n_embd_, n_embd_, gen, device));
  init_linear(*c_attn_, kInitStd, gen);
  init_linear(*c_proj_, kInitStd / std::sqrt(2.0f * static_cast<float>(config.n_layer)), gen);
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  // The attention reads q, k and v where the projection left them and writes their gradients into
  // the projection's gradient: no copies either way.
  return c_proj_->forward(ops::packed_qkv_attention(c_attn_->forward(x), n_head_, true));
}

Tensor CausalSelfAttention::forward_cached(const Tensor& x, KVCache& cache, std::size_t layer) {
  const int64_t t = x.size(1), start = cache.length;
  CUMULUS_CHECK(start == 0 || t == 1, InvalidArgument,
                "GPT::forward_cached: after the first call, one position at a time (got ", t, " with ", start,
                " cached)");
  const std::vector<Tensor> qkv = ops::split(c_attn_->forward(x), n_embd_, -1);
  ops::narrow(cache.k[layer], 2, start, t).copy_from(split_heads(qkv[1], n_head_));
  ops::narrow(cache.v[layer], 2, start, t).copy_from(split_heads(qkv[2], n_head_));
  const Tensor k = ops::narrow(cache.k[layer], 2, 0, start + t), v = ops::narrow(cache.v[layer], 2, 0, start + t);
  // The first call is causal over its own positions; later, the one new position sees them all.
  const Tensor y = ops::scaled_dot_product_attention(split_heads(qkv[0], n_head_), k, v, start == 0);
  return c_proj_->forward(merge_heads(y));
}

GPTMLP::GPTMLP(const GPTConfig& config, Generator& gen, Device device) {
  c_fc_ = register_module("c_fc", std::make_shared<nn::Linear>(config.n_embd, 4 * config.n_embd, gen, device));
  c_proj_ = register_module("c_proj", std::make_shared<nn::Linear>(4 * config.n_embd, config.n_embd, gen, device));
  init_linear(*c_fc_, kInitStd, gen);
  init_linear(*c_proj_, kInitStd / std::sqrt(2.0f * static_cast<float>(config.n_layer)), gen);
}

Tensor GPTMLP::forward(const Tensor& x) {
  return c_proj_->forward(ops::gelu(c_fc_->forward(x), ops::GeluApproximation::tanh));
}

Block::Block(const GPTConfig& config, Generator& gen, Device device) {
  ln_1_ = register_module("ln_1", std::make_shared<nn::LayerNorm>(config.n_embd, 1e-5f, true, device));
  attn_ = register_module("attn", std::make_shared<CausalSelfAttention>(config, gen, device));
  ln_2_ = register_module("ln_2", std::make_shared<nn::LayerNorm>(config.n_embd, 1e-5f, true, device));
  mlp_ = register_module("mlp", std::make_shared<GPTMLP>(config, gen, device));
}

Tensor Block::forward(const Tensor& x) {
  const Tensor h = x + attn_->forward(ln_1_->forward(x));
  return h + mlp_->forward(ln_2_->forward(h));
}

Tensor Block::forward_cached(const Tensor& x, KVCache& cache, std::size_t layer) {
  const Tensor h = x + attn_->forward_cached(ln_1_->forward(x), cache, layer);
  return h + mlp_->forward(ln_2_->forward(h));
}

GPT::GPT(const GPTConfig& config, Generator& gen, Device device) : config_(config) {
  config_.validate();
  auto transformer = std::make_shared<Container>();
  transformer_ = register_module("transformer", transformer);
  wte_ = transformer->add("wte", std::make_shared<nn::Embedding>(config_.vocab_size, config_.n_embd, gen, device));
  wpe_ = transformer->add("wpe", std::make_shared<nn::Embedding>(config_.block_size, config_.n_embd, gen, device));
  nn::init::normal_(wte_->weight(), 0.0f, kInitStd, gen);
  nn::init::normal_(wpe_->weight(), 0.0f, kInitStd, gen);
  auto h = transformer->add("h", std::make_shared<Container>());
  for (int64_t i = 0; i < config_.n_layer; ++i)
    blocks_.push_back(h->add(std::to_string(i), std::make_shared<Block>(config_, gen, device)));
  ln_f_ = transformer->add("ln_f", std::make_shared<nn::LayerNorm>(config_.n_embd, 1e-5f, true, device));
  lm_head_ = register_module("lm_head", std::make_shared<nn::Linear>(config_.n_embd, config_.vocab_size, gen, device,
                                                                     /*bias=*/false));
  share_parameter("lm_head.weight", wte_->weight());
}

Tensor GPT::embed(const Tensor& idx, int64_t first_position) {
  CUMULUS_CHECK(idx.ndim() == 2, InvalidArgument, "GPT: indices must be [batch, time], got ", idx.shape().str());
  const int64_t t = idx.size(1);
  CUMULUS_CHECK(t >= 1 && first_position + t <= config_.block_size, InvalidArgument, "GPT: ", first_position + t,
                " positions, but the context (block_size) is ", config_.block_size);
  const Tensor positions = ops::narrow(ops::arange(config_.block_size, idx.device()), 0, first_position, t);
  return ops::embedding(idx, wte_->weight(), compute_dtype_) +
         ops::embedding(positions, wpe_->weight(), compute_dtype_);
}

Tensor GPT::forward(const Tensor& idx) {
  Tensor x = embed(idx, 0);
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    Block& block = *blocks_[i];
    if (recompute_mask_ & (1u << i))
      x = checkpoint([&block](const Tensor& in) { return block.forward(in); }, x, block.parameters());
    else x = block.forward(x);
  }
  return lm_head_->forward(ln_f_->forward(x));
}

GPT& GPT::set_compute_dtype(DType dtype) {
  CUMULUS_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16, InvalidArgument,
                "GPT: the compute type must be f32, bf16 or f16, got ", dtype_name(dtype));
  compute_dtype_ = dtype;
  return *this;
}

GPT& GPT::set_recompute(bool on) {
  recompute_mask_ = on ? static_cast<uint32_t>((uint64_t{1} << blocks_.size()) - 1) : 0;
  return *this;
}

std::vector<std::string> GPT::recompute_segment_names() const {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < blocks_.size(); ++i) names.push_back("h." + std::to_string(i));
  return names;
}

GPT& GPT::set_recompute_segments(uint32_t mask) {
  CUMULUS_CHECK((static_cast<uint64_t>(mask) >> blocks_.size()) == 0, InvalidArgument, "GPT: recompute mask ", mask,
                " names a block past its ", blocks_.size());
  recompute_mask_ = mask;
  return *this;
}

KVCache GPT::make_cache(int64_t batch) const {
  KVCache cache;
  const Shape shape{batch, config_.n_head, config_.block_size, config_.head_size()};
  const Device device = wte_->weight().device();
  for (int64_t i = 0; i < config_.n_layer; ++i) {
    cache.k.push_back(Tensor::zeros(shape, compute_dtype_, device));
    cache.v.push_back(Tensor::zeros(shape, compute_dtype_, device));
  }
  return cache;
}

Tensor GPT::forward_cached(const Tensor& idx, KVCache& cache) {
  CUMULUS_CHECK(cache.k.size() == blocks_.size(), InvalidArgument, "GPT::forward_cached: the cache has ",
                cache.k.size(), " layers, the model ", blocks_.size(), " (make it with make_cache)");
  NoGradGuard no_grad;
  Tensor x = embed(idx, cache.length);
  for (std::size_t i = 0; i < blocks_.size(); ++i) x = blocks_[i]->forward_cached(x, cache, i);
  cache.length += idx.size(1);
  return lm_head_->forward(ln_f_->forward(x));
}

namespace {

// The next token from the logits of one position ([V], in the model's compute type).
int64_t pick_token(const Tensor& last_logits, double temperature, int64_t top_k, uint64_t seed, int64_t draw) {
  if (temperature <= 0.0) return ops::argmax(last_logits, 0).to(Device::cpu()).to_vector<int64_t>()[0];
  Tensor logits = ops::cast(last_logits, DType::f32) * static_cast<float>(1.0 / temperature);
  if (top_k > 0 && top_k < logits.size(0)) {
    // Everything below the k-th largest is -inf, as nanoGPT's generate().
    const Tensor kth = ops::narrow(ops::topk(logits, top_k).values, 0, top_k - 1, 1);
    logits = ops::masked_fill(logits, ops::lt(logits, kth), -std::numeric_limits<float>::infinity());
  }
  const Tensor probs = ops::softmax(logits, -1);
  return ops::multinomial(probs, 1, false, seed + static_cast<uint64_t>(draw))
      .to(Device::cpu())
      .to_vector<int64_t>()[0];
}

Tensor tokens_tensor(const std::vector<int64_t>& tokens, std::size_t first, Device device) {
  const std::vector<int64_t> window(tokens.begin() + static_cast<std::ptrdiff_t>(first), tokens.end());
  return Tensor::from_vector(window, Shape{1, static_cast<int64_t>(window.size())}).to(device);
}

}  // namespace

std::vector<int64_t> generate(GPT& model, const std::vector<int64_t>& prompt, int64_t length, double temperature,
                              int64_t top_k, uint64_t seed) {
  CUMULUS_CHECK(!prompt.empty(), InvalidArgument, "generate: the prompt must hold at least one token");
  CUMULUS_CHECK(length >= 0 && top_k >= 0, InvalidArgument, "generate: length (", length, ") and top_k (", top_k,
                ") must not be negative");
  const int64_t block = model.config().block_size;
  const Device device = model.parameters().front().device();
  const bool was_training = model.is_training();
  model.eval();
  std::vector<int64_t> tokens = prompt;
  KVCache cache = model.make_cache(1);
  // The prompt, cropped to the context as nanoGPT crops it.
  std::size_t first = tokens.size() > static_cast<std::size_t>(block) ? tokens.size() - block : 0;
  Tensor logits = model.forward_cached(tokens_tensor(tokens, first, device), cache);
  for (int64_t i = 0; i < length; ++i) {
    const Tensor last = ops::reshape(ops::narrow(logits, 1, logits.size(1) - 1, 1), {model.config().vocab_size});
    tokens.push_back(pick_token(last, temperature, top_k, seed, i));
    if (i + 1 == length) break;
    if (cache.length < block) {
      logits = model.forward_cached(tokens_tensor(tokens, tokens.size() - 1, device), cache);
    } else {  // the context is full: slide it, rebuilding the cache from the last block_size tokens
      cache = model.make_cache(1);
      first = tokens.size() - static_cast<std::size_t>(block);
      logits = model.forward_cached(tokens_tensor(tokens, first, device), cache);
    }
  }
  model.train(was_training);
  return tokens;
}

double validation_loss(GPT& model, const data::TokenWindows& windows, int64_t batch, int64_t max_windows) {
  CUMULUS_CHECK(batch >= 1 && max_windows >= 0, InvalidArgument, "validation_loss: batch (", batch,
                ") must be >= 1 and max_windows (", max_windows, ") >= 0");
  const int64_t available = windows.num_sequential_windows();
  const int64_t count = max_windows > 0 ? std::min(max_windows, available) : available;
  CUMULUS_CHECK(count >= 1, InvalidArgument, "validation_loss: no window of ", windows.context() + 1, " tokens in ",
                windows.num_tokens());
  const bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  double sum = 0.0;
  int64_t tokens = 0;
  for (int64_t first = 0; first < count; first += batch) {
    const data::Batch b = windows.sequential_batch(first, std::min(batch, count - first));
    sum += static_cast<double>(model.loss(b.x, b.y, ops::Reduction::Sum).to(Device::cpu()).item());
    tokens += b.x.numel();
  }
  model.train(was_training);
  return sum / static_cast<double>(tokens);
}

plan::PlanRequest plan_request(GPT& model, optim::Optimizer& optimizer, const data::TokenWindows& windows,
                               int64_t effective_batch, int64_t budget, bool weigh_recompute) {
  const int64_t t = windows.context();
  CUMULUS_CHECK(effective_batch > 0 && effective_batch % t == 0, InvalidArgument, "plan_request: the effective batch (",
                effective_batch, " tokens) must be a positive multiple of the context (", t, ")");
  plan::PlanRequest r;
  r.device = optimizer.parameters().device();
  r.effective_batch = effective_batch;
  r.units_per_row = t;
  r.budget = budget;
  r.optimizer = &optimizer;
  r.loop_state = train::Trainer::state_to_allocate();  // the Trainer's
  r.require_fit = true;
  r.model = &model;
  r.setting.recompute = model.recompute_segments();
  if (weigh_recompute) {
    // The blocks are equal, so how many are recomputed is what matters: the first k, k = 0..L.
    r.recompute_segments = model.recompute_segment_names();
    for (std::size_t k = 0; k <= r.recompute_segments.size(); ++k)
      r.recompute_masks.push_back(static_cast<uint32_t>((uint64_t{1} << k) - 1));
    r.apply = [&model](const plan::PlanSetting& s) { model.set_recompute_segments(s.recompute); };
  }
  nn::FlatParameters* params = &optimizer.parameters();
  r.micro_batch = [&model, &windows, params, t](int64_t units) {
    const data::Batch b = windows.random_batch(0, units / t);
    model.loss(b.x, b.y, ops::Reduction::Sum).backward();
    params->mark_gradients_stale();  // the probe's gradients are discarded
  };
  return r;
}

std::map<std::string, std::string> gpt_metadata(const GPTConfig& config, const CharVocabulary& vocabulary) {
  static const char* kHex = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : vocabulary.symbols()) hex += {kHex[c >> 4], kHex[c & 15]};
  return {{"gpt.vocab_size", std::to_string(config.vocab_size)}, {"gpt.block_size", std::to_string(config.block_size)},
          {"gpt.n_layer", std::to_string(config.n_layer)},       {"gpt.n_head", std::to_string(config.n_head)},
          {"gpt.n_embd", std::to_string(config.n_embd)},         {"gpt.vocabulary", hex}};
}

namespace {

const std::string& metadata_value(const std::map<std::string, std::string>& m, const std::string& path,
                                  const std::string& key) {
  const auto it = m.find(key);
  CUMULUS_CHECK(it != m.end(), Error, "file '", path, "': no metadata '", key, "' (not a GPT checkpoint of cumulus?)");
  return it->second;
}

// A config field: decimal digits only, within [1, limit].
int64_t metadata_int(const std::map<std::string, std::string>& m, const std::string& path, const std::string& key,
                     int64_t limit) {
  const std::string& text = metadata_value(m, path, key);
  const bool digits = !text.empty() && text.size() <= 18 && text.find_first_not_of("0123456789") == std::string::npos;
  const long long v = digits ? std::stoll(text) : -1;
  CUMULUS_CHECK(v >= 1 && v <= limit, Error, "file '", path, "': metadata '", key, "' is '", excerpt(text),
                "'; expected an integer in [1, ", limit, "]");
  return v;
}

bool is_float_dtype(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

}  // namespace

void check_gpt_weights(const std::string& path, const GPTConfig& config) {
  const io::SafetensorsHeader header = io::read_safetensors_header(path);
  std::map<std::string, Shape> expected;
  for (const GPTTensorLayout& t : gpt_state_layout(config)) expected.emplace(t.name, t.shape);
  std::map<std::string, bool> seen;
  for (const io::SafetensorsTensorInfo& t : header.tensors) {
    const auto it = expected.find(t.name);
    CUMULUS_CHECK(it != expected.end(), Error, "file '", path, "': tensor '", excerpt(t.name),
                  "' is not a weight of this GPT (", config.n_layer,
                  " layers); weights files hold the model's "
                  "tensors alone");
    CUMULUS_CHECK(t.shape == it->second, Error, "file '", path, "': tensor '", t.name, "' has shape ", t.shape.str(),
                  "; this GPT's is ", it->second.str());
    CUMULUS_CHECK(is_float_dtype(t.dtype), Error, "file '", path, "': tensor '", t.name, "' is ", dtype_name(t.dtype),
                  "; weights are floating point (F32, BF16, F16 or F64)");
    seen[t.name] = true;
  }
  for (const auto& [name, shape] : expected)
    CUMULUS_CHECK(seen.count(name) == 1 || name == "lm_head.weight", Error, "file '", path, "': no tensor '", name,
                  "' (shape ", shape.str(), "); is it a GPT of another size?");
}

GPTCheckpointInfo read_gpt_checkpoint(const std::string& path) {
  GPTCheckpointInfo info;
  info.metadata = io::read_safetensors_header(path).metadata;
  const auto& m = info.metadata;
  info.config.vocab_size = metadata_int(m, path, "gpt.vocab_size", GPTLimits::vocab_size);
  info.config.block_size = metadata_int(m, path, "gpt.block_size", GPTLimits::block_size);
  info.config.n_layer = metadata_int(m, path, "gpt.n_layer", GPTLimits::n_layer);
  info.config.n_head = metadata_int(m, path, "gpt.n_head", GPTLimits::n_head);
  info.config.n_embd = metadata_int(m, path, "gpt.n_embd", GPTLimits::n_embd);
  const std::string& hex = metadata_value(m, path, "gpt.vocabulary");
  std::string symbols;
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw Error("file '" + path + "': metadata 'gpt.vocabulary' is not hexadecimal");
  };
  CUMULUS_CHECK(hex.size() % 2 == 0, Error, "file '", path, "': metadata 'gpt.vocabulary' has an odd length");
  for (std::size_t i = 0; i < hex.size(); i += 2)
    symbols.push_back(static_cast<char>(nibble(hex[i]) * 16 + nibble(hex[i + 1])));
  try {
    info.vocabulary = CharVocabulary::from_symbols(symbols);
    info.config.validate();
  } catch (const Error& e) {
    throw Error("file '" + path + "': " + e.what());
  }
  CUMULUS_CHECK(info.vocabulary.size() == info.config.vocab_size, Error, "file '", path, "': a vocabulary of ",
                info.vocabulary.size(), " symbols for vocab_size ", info.config.vocab_size);
  return info;
}

std::vector<GPTTensorLayout> gpt_state_layout(const GPTConfig& config) {
  const int64_t c = config.n_embd;
  std::vector<GPTTensorLayout> out{{"transformer.wte.weight", Shape{config.vocab_size, c}},
                                   {"transformer.wpe.weight", Shape{config.block_size, c}}};
  for (int64_t i = 0; i < config.n_layer; ++i) {
    const std::string block = "transformer.h." + std::to_string(i) + ".";
    for (const GPTTensorLayout& t : std::vector<GPTTensorLayout>{{"ln_1.weight", Shape{c}},
                                                                 {"ln_1.bias", Shape{c}},
                                                                 {"attn.c_attn.weight", Shape{3 * c, c}},
                                                                 {"attn.c_attn.bias", Shape{3 * c}},
                                                                 {"attn.c_proj.weight", Shape{c, c}},
                                                                 {"attn.c_proj.bias", Shape{c}},
                                                                 {"ln_2.weight", Shape{c}},
                                                                 {"ln_2.bias", Shape{c}},
                                                                 {"mlp.c_fc.weight", Shape{4 * c, c}},
                                                                 {"mlp.c_fc.bias", Shape{4 * c}},
                                                                 {"mlp.c_proj.weight", Shape{c, 4 * c}},
                                                                 {"mlp.c_proj.bias", Shape{c}}})
      out.push_back({block + t.name, t.shape});
  }
  out.push_back({"transformer.ln_f.weight", Shape{c}});
  out.push_back({"transformer.ln_f.bias", Shape{c}});
  out.push_back({"lm_head.weight", Shape{config.vocab_size, c}});
  return out;
}

void load_gpt_weights(const std::string& path, GPT& model) {
  check_gpt_weights(path, model.config());
  io::LoadStateDictOptions options;
  options.require_finite = true;  // a NaN weight makes every loss and every sample NaN
  options.allow_missing_shared = true;
  io::load_state_dict(path, model, options);
}

namespace {

// A vocabulary's symbols as a reader sees them: printable bytes as they are, others as \xNN.
std::string printable_symbols(const std::string& symbols) {
  std::string out;
  for (unsigned char c : symbols) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

}  // namespace

void load_gpt_initial_weights(const std::string& path, GPT& model, const CharVocabulary& vocabulary) {
  const std::map<std::string, std::string> metadata = io::read_safetensors_header(path).metadata;
  const bool describes_a_gpt =
      std::any_of(metadata.begin(), metadata.end(), [](const auto& kv) { return kv.first.rfind("gpt.", 0) == 0; });
  if (describes_a_gpt) {
    const GPTCheckpointInfo file = read_gpt_checkpoint(path);
    const GPTConfig& run = model.config();
    std::string differences;
    auto compare = [&](const char* key, int64_t in_file, int64_t in_run) {
      if (in_file != in_run)
        differences += std::string(differences.empty() ? "" : ", ") + key + " " + std::to_string(in_file) +
                       ", this run's " + std::to_string(in_run);
    };
    compare("gpt.n_layer", file.config.n_layer, run.n_layer);
    compare("gpt.n_head", file.config.n_head, run.n_head);
    compare("gpt.n_embd", file.config.n_embd, run.n_embd);
    compare("gpt.block_size", file.config.block_size, run.block_size);
    CUMULUS_CHECK(differences.empty(), Error, "file '", path, "' describes another GPT: ", differences);
    CUMULUS_CHECK(file.vocabulary.symbols() == vocabulary.symbols(), Error, "file '", path,
                  "' was made for a vocabulary of ", file.vocabulary.size(), " symbols \"",
                  excerpt(printable_symbols(file.vocabulary.symbols())), "\"; this text's is ", vocabulary.size(),
                  " symbols \"", excerpt(printable_symbols(vocabulary.symbols())),
                  "\": its token ids would mean other characters");
  }
  load_gpt_weights(path, model);
}

}  // namespace cumulus::models
