// Note [Op families against PyTorch]
// The op families a transformer, the seed MLP and the seed's CNN run, each at one shape a small GPT,
// the MLP or the CNN at micro-batch 16 gives it (and the attention at the large GPT's too: 8 heads
// of 32 over 256 tokens), written once here for bench_ops and once in bench/pytorch/op_families.py with the same
// names, shapes and input ranges, so bench/ops_vs_pytorch.py can time both side by side:
//   families/<name>/forward            the expression under NoGradGuard (no_grad)
//   families/<name>/forward_backward   recorded, and its backward from an upstream gradient of ones
//                                      into the inputs' gradients (overwritten each iteration;
//                                      PyTorch's set to None, as zero_grad does)
// Inputs are uniform in [-1, 1); integer inputs (labels, token ids) are below `classes`.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cumulus/ops/attention.h"
#include "cumulus/ops/convolution.h"
#include "cumulus/ops/linear.h"
#include "cumulus/ops/loss.h"
#include "cumulus/ops/normalization.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/ops/shape.h"
#include "cumulus/tensor/tensor.h"

namespace cumulus::bench {

struct OpFamily {
  std::string name;
  std::vector<Shape> shapes;       // one per input
  std::vector<bool> integer;       // an input of i32 ids below `classes` (no gradient); empty: all float
  int64_t classes = 0;
  std::function<Tensor(const std::vector<Tensor>&)> forward;
};

inline std::vector<OpFamily> op_families() {
  using V = const std::vector<Tensor>&;
  const Shape act{8, 64, 128};         // the small GPT's activations: B 8, T 64, C 128
  const Shape maps{16, 32, 28, 28};    // the CNN's first block at micro-batch 16
  const Shape pooled{16, 32, 14, 14};  // its second block's input
  return {
      {"sum_last", {act}, {}, 0, [](V x) { return ops::sum(x[0], -1); }},
      {"sum_first", {act}, {}, 0, [](V x) { return ops::sum(x[0], 0); }},
      {"mean_middle", {act}, {}, 0, [](V x) { return ops::mean(x[0], 1); }},
      {"mean_square_last", {act}, {}, 0, [](V x) { return ops::mean(ops::mul(x[0], x[0]), -1, true); }},
      {"mul_by_row_scalar", {act, {8, 64, 1}}, {}, 0, [](V x) { return ops::mul(x[0], x[1]); }},
      {"mul_by_channel", {act, {128}}, {}, 0, [](V x) { return ops::mul(x[0], x[1]); }},
      {"add_same_shape", {act, act}, {}, 0, [](V x) { return ops::add(x[0], x[1]); }},
      {"add_bias", {{512, 512}, {512}}, {}, 0, [](V x) { return ops::add(x[0], x[1]); }},
      {"gelu_times", {{8, 64, 344}, {8, 64, 344}}, {}, 0,
       [](V x) { return ops::mul(ops::gelu(x[0], ops::GeluApproximation::none), x[1]); }},
      {"gelu_tanh", {{8, 64, 512}}, {}, 0, [](V x) { return ops::gelu(x[0], ops::GeluApproximation::tanh); }},
      {"sigmoid", {{8, 64, 344}}, {}, 0, [](V x) { return ops::sigmoid(x[0]); }},
      {"silu", {{8, 64, 344}}, {}, 0, [](V x) { return ops::mul(x[0], ops::sigmoid(x[0])); }},
      {"silu_op", {{8, 64, 344}}, {}, 0, [](V x) { return ops::silu(x[0]); }},
      {"relu", {{64, 512}}, {}, 0, [](V x) { return ops::relu(x[0]); }},
      {"softmax_last", {{8, 4, 64, 64}}, {}, 0, [](V x) { return ops::softmax(x[0], -1); }},
      {"layer_norm", {act, {128}, {128}}, {}, 0, [](V x) { return ops::layer_norm(x[0], 128, x[1], x[2]); }},
      {"rms_norm", {act, {128}}, {}, 0, [](V x) { return ops::rms_norm(x[0], Shape{128}, x[1]); }},
      {"rms_norm_4096x1024", {{4096, 1024}, {1024}}, {}, 0, [](V x) { return ops::rms_norm(x[0], Shape{1024}, x[1]); }},
      {"linear_qkv", {{512, 128}, {384, 128}, {384}}, {}, 0, [](V x) { return ops::linear(x[0], x[1], x[2]); }},
      {"linear_mlp", {{64, 784}, {512, 784}, {512}}, {}, 0, [](V x) { return ops::linear(x[0], x[1], x[2]); }},
      {"cross_entropy_sum", {{512, 65}, {512}}, {false, true}, 65,
       [](V x) { return ops::cross_entropy(x[0], x[1], ops::Reduction::Sum); }},
      {"attention_causal", {{8, 4, 64, 32}, {8, 4, 64, 32}, {8, 4, 64, 32}}, {}, 0,
       [](V x) { return ops::scaled_dot_product_attention(x[0], x[1], x[2], true); }},
      {"attention_causal_t256", {{8, 8, 256, 32}, {8, 8, 256, 32}, {8, 8, 256, 32}}, {}, 0,
       [](V x) { return ops::scaled_dot_product_attention(x[0], x[1], x[2], true); }},
      {"permute_heads", {{8, 64, 4, 32}}, {}, 0, [](V x) { return ops::contiguous(ops::permute(x[0], {0, 2, 1, 3})); }},
      {"embedding", {{8, 64}, {65, 128}}, {true, false}, 65, [](V x) { return ops::embedding(x[0], x[1]); }},
      {"conv2d_3x3", {pooled, {64, 32, 3, 3}, {64}}, {}, 0,
       [](V x) { return ops::conv2d(x[0], x[1], x[2], /*stride=*/1, /*padding=*/1); }},
      {"batch_norm2d", {maps, {32}, {32}}, {}, 0,
       [](V x) { return ops::batch_norm2d(x[0], x[1], x[2], Tensor(), Tensor(), Tensor(), ops::BatchNormOptions{}); }},
      {"max_pool2d", {maps}, {}, 0, [](V x) { return ops::max_pool2d(x[0], 2); }},
      {"relu_maps", {maps}, {}, 0, [](V x) { return ops::relu(x[0]); }},
  };
}

}  // namespace cumulus::bench
