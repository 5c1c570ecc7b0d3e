// PyTorch's nn.Embedding, with its parameter name ("weight") and initialization.
#pragma once

#include <cstdint>

#include "cumulus/nn/module.h"
#include "cumulus/tensor/random.h"

namespace cumulus::nn {

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
