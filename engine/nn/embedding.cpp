#include "cumulus/nn/embedding.h"

#include "cumulus/ops/shape.h"

namespace cumulus::nn {

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator& gen, Device device, DType dtype)
    : dtype_(dtype) {
  CUMULUS_CHECK(num_embeddings > 0 && embedding_dim > 0, InvalidArgument, "Embedding(", num_embeddings, ", ",
                embedding_dim, "): sizes must be positive");
  register_parameter("weight", weight_, normal(Shape{num_embeddings, embedding_dim}, 0.0f, 1.0f, gen), device);
}

Tensor Embedding::forward(const Tensor& indices) { return ops::embedding(indices, weight_, dtype_); }

}  // namespace cumulus::nn
