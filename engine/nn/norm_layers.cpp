#include "cumulus/nn/norm_layers.h"

#include "cumulus/ops/tensor_ops.h"

namespace cumulus::nn {

LayerNorm::LayerNorm(int64_t normalized_size, float eps, bool elementwise_affine, Device device)
    : normalized_size_(normalized_size), eps_(eps) {
  CUMULUS_CHECK(normalized_size > 0, InvalidArgument, "LayerNorm(", normalized_size, "): the size must be positive");
  if (!elementwise_affine) return;
  register_parameter("weight", weight_, Tensor::full(Shape{normalized_size}, 1.0f), device);
  register_parameter("bias", bias_, Tensor::zeros(Shape{normalized_size}), device);
}

Tensor LayerNorm::forward(const Tensor& x) { return ops::layer_norm(x, normalized_size_, weight_, bias_, eps_); }

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator& gen, Device device, DType dtype)
    : dtype_(dtype) {
  CUMULUS_CHECK(num_embeddings > 0 && embedding_dim > 0, InvalidArgument, "Embedding(", num_embeddings, ", ",
                embedding_dim, "): sizes must be positive");
  register_parameter("weight", weight_, normal(Shape{num_embeddings, embedding_dim}, 0.0f, 1.0f, gen), device);
}

Tensor Embedding::forward(const Tensor& indices) { return ops::embedding(indices, weight_, dtype_); }

}  // namespace cumulus::nn
