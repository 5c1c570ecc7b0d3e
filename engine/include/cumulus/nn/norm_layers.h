// Modules for the structural ops that hold parameters (ops/tensor_ops.h), with PyTorch's
// state-dict names and initialization.
#pragma once

#include "cumulus/nn/module.h"
#include "cumulus/tensor/random.h"

namespace cumulus::nn {

// PyTorch's nn.LayerNorm over the last dimension: "weight" (ones) and "bias" (zeros), f32, when
// elementwise_affine; none otherwise. The input may be f32, bf16 or f16.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t normalized_size, float eps = 1e-5f, bool elementwise_affine = true,
                     Device device = Device::cpu());
  Tensor forward(const Tensor& x) override;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  int64_t normalized_size_;
  float eps_;
  Tensor weight_, bias_;
};

// PyTorch's nn.Embedding: "weight" [num_embeddings, embedding_dim] f32 drawn from N(0, 1). forward
// takes i32 indices of any shape up to 3-D and returns [..., embedding_dim] in `dtype`.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator& gen, Device device = Device::cpu(),
            DType dtype = DType::f32);
  Tensor forward(const Tensor& indices) override;
  const Tensor& weight() const { return weight_; }

 private:
  DType dtype_;
  Tensor weight_;
};

}  // namespace cumulus::nn
