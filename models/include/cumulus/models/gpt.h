// A GPT-2-style decoder, as nanoGPT's `GPT` class: token and learned position embeddings, pre-
// LayerNorm blocks of causal multi-head self-attention and a GELU MLP with residuals, a final
// LayerNorm, and an LM head tied to the token embedding. state_dict() keys are nanoGPT's
// (transformer.wte.weight, transformer.wpe.weight, transformer.h.<i>.ln_1.weight, .attn.c_attn.weight,
// .attn.c_proj.weight, .ln_2.*, .mlp.c_fc.*, .mlp.c_proj.*, transformer.ln_f.*, lm_head.weight), so a
// checkpoint loads into that PyTorch class with strict=True and back (bench/pytorch/gpt.py).
// GELU is the tanh form (GPT-2's; nanoGPT's nn.GELU() is the erf form: the twin says which).
// Initialization as GPT-2's: weights N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 layers)),
// biases 0, LayerNorms 1 and 0, drawn from the generator in state-dict order.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cumulus/data/token_windows.h"
#include "cumulus/models/text.h"
#include "cumulus/nn/embedding.h"
#include "cumulus/nn/layers.h"
#include "cumulus/nn/model.h"
#include "cumulus/nn/norm_layers.h"
#include "cumulus/plan/planner.h"
#include "cumulus/tensor/random.h"

namespace cumulus::models {

struct GPTConfig {
  int64_t vocab_size = 84;
  int64_t block_size = 64;  // the longest context, T (position embeddings)
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;  // the width, C; a multiple of n_head
  // The checks a config must pass, as an InvalidArgument naming the field.
  void validate() const;
  int64_t head_size() const { return n_embd / n_head; }
};

// Keys and values of every layer for incremental decoding: [B, H, block_size, D] each, filled up to
// `length` positions.
struct KVCache {
  std::vector<Tensor> k, v;
  int64_t length = 0;
};

class CausalSelfAttention : public nn::Module {
 public:
  CausalSelfAttention(const GPTConfig& config, Generator& gen, Device device);
  // x: [B, T, C] -> [B, T, C]
  Tensor forward(const Tensor& x) override;
  // The same for the new positions x [B, t, C] given the cache of layer `layer` (no gradient).
  Tensor forward_cached(const Tensor& x, KVCache& cache, std::size_t layer);

 private:
  int64_t n_head_, n_embd_;
  std::shared_ptr<nn::Linear> c_attn_, c_proj_;
};

class GPTMLP : public nn::Module {
 public:
  GPTMLP(const GPTConfig& config, Generator& gen, Device device);
  Tensor forward(const Tensor& x) override;

 private:
  std::shared_ptr<nn::Linear> c_fc_, c_proj_;
};

class Block : public nn::Module {
 public:
  Block(const GPTConfig& config, Generator& gen, Device device);
  Tensor forward(const Tensor& x) override;
  Tensor forward_cached(const Tensor& x, KVCache& cache, std::size_t layer);

 private:
  std::shared_ptr<nn::LayerNorm> ln_1_, ln_2_;
  std::shared_ptr<CausalSelfAttention> attn_;
  std::shared_ptr<GPTMLP> mlp_;
};

class GPT : public nn::Model {
 public:
  GPT(const GPTConfig& config, Generator& gen, Device device = Device::cpu());
  // idx: [B, T] token indices (i32 or i64), T <= block_size -> logits [B, T, vocab_size]
  Tensor forward(const Tensor& idx) override;
  // loss(): the default, cross_entropy over [B, T, V] logits and [B, T] labels: summed over tokens
  // for the Trainer (ops::Reduction::Sum), so the token is the unit of accumulation.
  std::string name() const override { return "gpt"; }
  const GPTConfig& config() const { return config_; }

  // Recompute per block (Note [Recompute] in engine/autograd/checkpoint.cpp): a recomputed block
  // keeps only its input; segment i is block i ("h.<i>").
  bool offers_recompute() const override { return true; }
  GPT& set_recompute(bool on) override;
  bool recompute() const override { return recompute_mask_ != 0; }
  std::vector<std::string> recompute_segment_names() const override;
  GPT& set_recompute_segments(uint32_t mask) override;
  uint32_t recompute_segments() const { return recompute_mask_; }

  // The type the activations are computed and stored in: f32 (the default), bf16 or f16 (each
  // position's embedding is rounded to it; every op then computes in its input's type, products
  // summed in f32). Parameters, their gradients and the optimizer state stay f32; the logits come out
  // in this type and cross_entropy sums in f32. fp16 needs the Trainer's loss scaling
  // (needs_loss_scaling in cumulus/core/precision.h). Unlike PyTorch's autocast, the residual stream is
  // in this type too, as the rest of cumulus's mixed precision (Note [Mixed precision] in
  // engine/ops/linear.cpp): half the activation bytes.
  GPT& set_compute_dtype(DType dtype);
  DType compute_dtype() const { return compute_dtype_; }

  // Incremental decoding: an empty cache for `batch` sequences, and the logits [B, t, V] of the
  // next t positions given what the cache holds (the first call may pass a whole prompt; the cache
  // must have room: length + t <= block_size). Runs without recording gradients.
  KVCache make_cache(int64_t batch) const;
  Tensor forward_cached(const Tensor& idx, KVCache& cache);

 private:
  Tensor embed(const Tensor& idx, int64_t first_position);
  GPTConfig config_;
  uint32_t recompute_mask_ = 0;
  DType compute_dtype_ = DType::f32;
  std::shared_ptr<nn::Module> transformer_;  // holds wte, wpe, h, ln_f (nanoGPT's ModuleDict)
  std::shared_ptr<nn::Embedding> wte_, wpe_;
  std::vector<std::shared_ptr<Block>> blocks_;
  std::shared_ptr<nn::LayerNorm> ln_f_;
  std::shared_ptr<nn::Linear> lm_head_;  // its weight is wte's (Note [Shared parameters])
};

// Sampling as nanoGPT's generate(): `length` new tokens after `prompt` ([T0] i64, T0 >= 1), each
// drawn from softmax(logits / temperature) restricted to the top_k most likely (0: all), with the
// key/value cache, so each new token costs one position. temperature 0 takes the most likely token.
// When the context is full, the window slides and the cache is rebuilt from the last block_size - 1
// tokens. Deterministic for a seed. Returns the prompt followed by the new tokens.
std::vector<int64_t> generate(GPT& model, const std::vector<int64_t>& prompt, int64_t length, double temperature,
                              int64_t top_k, uint64_t seed);

// The mean per-token cross-entropy of `model` over the first `max_windows` (0: all) non-overlapping
// windows of `windows`, `batch` windows at a time, in evaluation mode without gradients (the mode
// is restored after); one device read per batch.
double validation_loss(GPT& model, const data::TokenWindows& windows, int64_t batch, int64_t max_windows = 0);

// A planner request (cumulus/plan/planner.h) for training `model` with `optimizer` on `windows`, counted in
// tokens: every micro-batch weighed is a whole number of windows (units_per_row = T), a probe of
// u tokens is random batch 0 of u / T windows, its loss summed over tokens backward into the
// gradient buffers, the gradients then discarded. `effective_batch` tokens (a multiple of T) under
// `budget` reserved bytes (0: none). With `weigh_recompute`, recomputing the first k blocks is
// weighed for every k from 0 (everything stored) to all of them (the blocks are equal: which ones
// matters little, how many sets the peak); the planner leaves the chosen one in place. require_fit is set (plan_batch
// throws OutOfMemory with its reason when nothing fits).
plan::PlanRequest plan_request(GPT& model, optim::Optimizer& optimizer, const data::TokenWindows& windows,
                               int64_t effective_batch, int64_t budget, bool weigh_recompute);

// A GPT's checkpoint: its state dict (nanoGPT's names) with the config and the vocabulary in the
// metadata ("gpt.vocab_size", "gpt.block_size", "gpt.n_layer", "gpt.n_head", "gpt.n_embd",
// "gpt.vocabulary": the symbols' bytes in hex), beside `metadata` of the caller's; written
// atomically. read_gpt_checkpoint reads the config and vocabulary back from the header (an Error
// names the file and the key when one is missing, malformed or outside GPTLimits); load_gpt_weights
// fills a model made from them.
std::map<std::string, std::string> gpt_metadata(const GPTConfig& config, const CharVocabulary& vocabulary);
struct GPTCheckpointInfo {
  GPTConfig config;
  CharVocabulary vocabulary;
  std::map<std::string, std::string> metadata;  // everything the file's header holds
};
GPTCheckpointInfo read_gpt_checkpoint(const std::string& path);

// The largest GPT a checkpoint may describe (the train command's flag ranges): a forged config is
// refused by key before a model of its size is allocated.
struct GPTLimits {
  static constexpr int64_t vocab_size = 256;  // a character (byte) vocabulary
  static constexpr int64_t block_size = 1 << 16;
  static constexpr int64_t n_layer = 32;
  static constexpr int64_t n_head = 1024;
  static constexpr int64_t n_embd = 1 << 16;
};

// The tensors a GPT of `config` holds, by nanoGPT's state-dict names, each f32 of its shape:
// what GPT(config).state_dict() gives, known without allocating the model.
struct GPTTensorLayout {
  std::string name;
  Shape shape;
};
std::vector<GPTTensorLayout> gpt_state_layout(const GPTConfig& config);

// A weights file's header against the layout of `config`, before any data is read or a model of
// that size allocated: every tensor present with its shape and a floating dtype, nothing else
// ("lm_head.weight" may be absent, as PyTorch's save_model leaves out the tied copy). An Error names
// the file and the tensor.
void check_gpt_weights(const std::string& path, const GPTConfig& config);

// Weights from a safetensors file, treated as untrusted: check_gpt_weights, then every value must
// be finite. Errors name the file and the tensor; the model is unchanged on one.
void load_gpt_weights(const std::string& path, GPT& model);

// Weights a run starts from (gpt train --init): a file that describes its GPT (any "gpt." key, as
// every file cumulus writes does) must describe this one, config and vocabulary, or the token ids
// would mean other characters; each difference is named ("gpt.n_head 4, this run's 2"). A file
// without such keys (PyTorch's save_model) is taken as made for `vocabulary`. Then load_gpt_weights.
void load_gpt_initial_weights(const std::string& path, GPT& model, const CharVocabulary& vocabulary);

}  // namespace cumulus::models
