// The structural ops (ops/shape.h, normalization.h, linear.h) beyond their op cases
// (tests/op_cases/cases_structural.cpp): argument errors naming the op and the shapes, zero sizes, gradients that must
// add up across pieces and backward calls (split, repeated embedding rows, a second micro-batch), narrow's view, and
// the nn modules' names and initialization. On every device (CUDA skips without a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "cumulus/nn/embedding.h"
#include "cumulus/nn/norm_layers.h"
#include "cumulus/ops/linear.h"
#include "cumulus/ops/normalization.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/ops/shape.h"
#include "test_util.h"

namespace cumulus::testing {
namespace {

// Runs f, expecting exception E whose message contains every one of `parts`.
template <typename E, typename F>
void expect_error(F f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const E& e) {
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

class TensorOpsTest : public DeviceTest {
 protected:
  Tensor values(const std::vector<float>& v, const Shape& s, bool grad = false) const {
    Tensor t = Tensor::from_vector(v, s, device());
    if (grad) t.set_requires_grad(true);
    return t;
  }
  Tensor ints(const std::vector<int32_t>& v, const Shape& s) const { return Tensor::from_vector(v, s, device()); }
};

TEST_P(TensorOpsTest, MatmulErrorsNameTheOpAndShapes) {
  const Tensor a = Tensor::zeros({2, 3, 4}, DType::f32, device()), b = Tensor::zeros({2, 5, 6}, DType::f32, device());
  expect_error<ShapeError>([&] { ops::bmm(a, b); }, {"bmm", "[2, 3, 4]", "[2, 5, 6]"});
  expect_error<ShapeError>([&] { ops::bmm(a, Tensor::zeros({3, 4, 6}, DType::f32, device())); }, {"bmm", "same B"});
  expect_error<ShapeError>(
      [&] {
        ops::matmul(a, Tensor::zeros({3, 4, 6}, DType::f32, device()));
      },
      {"matmul", "batch dimensions"});
  expect_error<ShapeError>([&] { ops::matmul(Tensor::zeros({4}, DType::f32, device()), a); },
                           {"matmul", "do not multiply"});
  expect_error<ShapeError>([&] { ops::matmul(Tensor::zeros({}, DType::f32, device()), a); },
                           {"matmul", "at least 1 dimension"});
  expect_error<InvalidArgument>(
      [&] {
        ops::matmul(a, Tensor::zeros({4, 2}, DType::bf16, device()));
      },
      {"matmul", "f32", "bf16"});
}

// An a repeated over b's batch is read once; its gradient is the sum over the batch of dc b^T, and a
// second backward adds into the leaf's buffer. A 1-D a is a row and drops from the result.
TEST_P(TensorOpsTest, MatmulBroadcastAGradientSumsOverTheBatch) {
  const Tensor a = values({1, 2, 3, 4}, {2, 2}, true);
  const Tensor b = values({1, 0, 0, 1, 2, 0, 0, 2, 0, 1, 1, 0}, {3, 2, 2}, true);
  const Tensor c = ops::matmul(a, b);
  EXPECT_EQ(c.shape(), Shape({3, 2, 2}));
  EXPECT_EQ(c.to(Device::cpu()).to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 2, 4, 6, 8, 2, 1, 4, 3}));
  ops::sum(c).backward();
  // da = sum_p ones [2, 2] b_p^T: each row holds the row sums of every b_p, summed over p.
  EXPECT_EQ(a.grad().to(Device::cpu()).to_vector<float>(), (std::vector<float>{4, 4, 4, 4}));
  EXPECT_EQ(b.grad().to(Device::cpu()).to_vector<float>(), (std::vector<float>{4, 4, 6, 6, 4, 4, 6, 6, 4, 4, 6, 6}));
  ops::sum(ops::matmul(a, b)).backward();
  EXPECT_EQ(a.grad().to(Device::cpu()).to_vector<float>(), (std::vector<float>{8, 8, 8, 8}));
  const Tensor row = ops::matmul(values({1, 1}, {2}), b);
  EXPECT_EQ(row.shape(), Shape({3, 2}));
  EXPECT_EQ(row.to(Device::cpu()).to_vector<float>(), (std::vector<float>{1, 1, 2, 2, 1, 1}));
}

TEST_P(TensorOpsTest, MatmulWithAnEmptySumIsZero) {
  const Tensor a = Tensor::zeros({2, 3, 0}, DType::f32, device()), b = Tensor::zeros({2, 0, 4}, DType::f32, device());
  const Tensor c = ops::bmm(a, b);
  EXPECT_EQ(c.shape(), Shape({2, 3, 4}));
  for (float v : c.to(Device::cpu()).to_vector<float>()) EXPECT_EQ(v, 0.0f);
}

// A weight used by two micro-batches: the second backward adds its GEMM into the persistent buffer.
TEST_P(TensorOpsTest, MatmulGradientAccumulatesAcrossBackwards) {
  const Tensor a = values({1, 2, 3, 4, 5, 6}, {3, 2});
  const Tensor w = values({1, -1, 2, 0.5f}, {2, 2}, true);
  ops::sum(ops::matmul(a, w)).backward();
  const std::vector<float> once = w.grad().to(Device::cpu()).to_vector<float>();
  EXPECT_EQ(once, (std::vector<float>{9, 9, 12, 12}));  // column sums of a, per column of w
  ops::sum(ops::matmul(a, w)).backward();
  EXPECT_EQ(w.grad().to(Device::cpu()).to_vector<float>(), (std::vector<float>{18, 18, 24, 24}));
}

TEST_P(TensorOpsTest, LayerNormErrors) {
  const Tensor x = Tensor::zeros({2, 3}, DType::f32, device());
  expect_error<ShapeError>([&] { ops::layer_norm(x, 4); }, {"layer_norm", "normalized_size 4", "[2, 3]"});
  expect_error<ShapeError>([&] { ops::layer_norm(x, 3, Tensor::zeros({4}, DType::f32, device())); },
                           {"layer_norm", "weight", "[3]", "[4]"});
  expect_error<InvalidArgument>([&] { ops::layer_norm(x, 3, Tensor(), Tensor::zeros({3}, DType::bf16, device())); },
                                {"layer_norm", "bias", "f32"});
  expect_error<InvalidArgument>(
      [&] {
        ops::layer_norm(Tensor::zeros({2, 3}, DType::i32, device()), 3);
      },
      {"layer_norm", "input"});
}

TEST_P(TensorOpsTest, LayerNormOfZeroRowsIsEmpty) {
  const Tensor y = ops::layer_norm(Tensor::zeros({0, 5}, DType::f32, device()), 5);
  EXPECT_EQ(y.shape(), Shape({0, 5}));
}

TEST_P(TensorOpsTest, EmbeddingAddsRepeatedRowsAndAccumulates) {
  const Tensor w = values({1, 2, 3, 4, 5, 6}, {3, 2}, true);
  const Tensor idx = ints({2, 0, 2, 2}, {2, 2});
  const Tensor y = ops::embedding(idx, w);
  EXPECT_EQ(y.shape(), Shape({2, 2, 2}));
  EXPECT_EQ(y.to(Device::cpu()).to_vector<float>(), (std::vector<float>{5, 6, 1, 2, 5, 6, 5, 6}));
  ops::sum(y).backward();
  EXPECT_EQ(w.grad().to(Device::cpu()).to_vector<float>(), (std::vector<float>{1, 1, 0, 0, 3, 3}));
  ops::sum(ops::embedding(ints({1}, {1}), w)).backward();  // beta 1: row 1 added, the others kept
  EXPECT_EQ(w.grad().to(Device::cpu()).to_vector<float>(), (std::vector<float>{1, 1, 1, 1, 3, 3}));
  w.mark_grad_stale();  // beta 0: the rows no index names become 0
  ops::sum(ops::embedding(ints({1}, {1}), w)).backward();
  EXPECT_EQ(w.grad().to(Device::cpu()).to_vector<float>(), (std::vector<float>{0, 0, 1, 1, 0, 0}));
}

TEST_P(TensorOpsTest, IndexErrors) {
  const Tensor w = Tensor::zeros({3, 2}, DType::f32, device());
  expect_error<InvalidArgument>(
      [&] {
        ops::embedding(ints({0}, {1}), Tensor::zeros({3, 2}, DType::bf16, device()));
      },
      {"embedding", "weight", "f32"});
  expect_error<InvalidArgument>([&] { ops::embedding(Tensor::zeros({2}, DType::f32, device()), w); },
                                {"embedding", "indices", "i32"});
  expect_error<ShapeError>([&] { ops::index_select(w, 0, ints({0, 1}, {1, 2})); }, {"index_select", "1-D"});
  expect_error<ShapeError>([&] { ops::index_select(w, 2, ints({0}, {1})); }, {"index_select", "dim 2"});
}

// The CPU checks indices before any work; CUDA documents NaN rows instead (ops/shape.h).
TEST(TensorOpsCpu, OutOfRangeIndicesAreInvalidArguments) {
  const Tensor w = Tensor::zeros({3, 2});
  expect_error<InvalidArgument>(
      [&] {
        ops::embedding(Tensor::from_vector<int32_t>({0, 3}, {2}), w);
      },
      {"embedding", "index 3", "position 1", "[0, 3)"});
  expect_error<InvalidArgument>([&] { ops::index_select(w, 1, Tensor::from_vector<int32_t>({-1}, {1})); },
                                {"index_select", "index -1", "[0, 2)"});
}

TEST_P(TensorOpsTest, SplitPiecesAllReachTheInput) {
  const Tensor x = values({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {5, 2}, true);
  const std::vector<Tensor> pieces = ops::split(x, 2, 0);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[2].shape(), Shape({1, 2}));
  Tensor loss = ops::sum(pieces[0]);
  for (int k = 1; k < 3; ++k)
    loss = ops::sum(ops::cat({ops::reshape(loss, {1}), ops::reshape(ops::sum(pieces[k]), {1})}, 0));
  loss.backward();
  for (float g : x.grad().to(Device::cpu()).to_vector<float>()) EXPECT_EQ(g, 1.0f);
}

// PyTorch's chunk sizes (torch.arange(n).chunk(c)), views of x, and every piece's gradient in x.
TEST_P(TensorOpsTest, ChunkCutsAsPyTorchAndEveryPieceReachesTheInput) {
  const std::vector<std::tuple<int64_t, int64_t, std::vector<int64_t>>> sizes = {
      {0, 3, {0, 0, 0}}, {5, 3, {2, 2, 1}}, {6, 4, {2, 2, 2}}, {7, 3, {3, 3, 1}}, {1, 4, {1}}, {10, 4, {3, 3, 3, 1}}};
  for (const auto& [n, chunks, want] : sizes) {
    const std::vector<Tensor> pieces = ops::chunk(Tensor::zeros({2, n}, DType::f32, device()), chunks, -1);
    std::vector<int64_t> got;
    for (const Tensor& p : pieces) got.push_back(p.size(1));
    EXPECT_EQ(got, want) << n << " in " << chunks;
  }
  const Tensor x = values({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {2, 6}, true);
  const std::vector<Tensor> qkv = ops::chunk(x, 3, 1);
  ASSERT_EQ(qkv.size(), 3u);
  EXPECT_TRUE(qkv[1].shares_storage(x));
  EXPECT_EQ(qkv[2].to(Device::cpu()).to_vector<float>(), (std::vector<float>{4, 5, 10, 11}));
  ops::sum(ops::add(ops::mul(qkv[0], 1.0f), ops::add(ops::mul(qkv[1], 2.0f), ops::mul(qkv[2], 3.0f)))).backward();
  EXPECT_EQ(x.grad().to(Device::cpu()).to_vector<float>(), (std::vector<float>{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}));
  expect_error<ShapeError>([&] { ops::chunk(x, 0, 1); }, {"chunk", "chunks must be > 0"});
}

// torch.ones / torch.full: the value in each type, on the device asked for.
TEST_P(TensorOpsTest, OnesAndFullGiveEachType) {
  const Tensor o = Tensor::ones({2, 3}, DType::bf16, device());
  EXPECT_EQ(o.dtype(), DType::bf16);
  EXPECT_EQ(o.device(), device());
  EXPECT_EQ(o.to(DType::f32).to(Device::cpu()).to_vector<float>(), std::vector<float>(6, 1.0f));
  EXPECT_EQ(Tensor::ones({4}).to_vector<float>(), std::vector<float>(4, 1.0f));
  EXPECT_EQ(Tensor::full({3}, 0.1f, DType::f16, device()).to(DType::f32).to(Device::cpu()).to_vector<float>(),
            std::vector<float>(3, 0.0999755859375f));  // f16's nearest to 0.1, rounded once
  EXPECT_EQ(Tensor::full({2}, -7.0f, DType::i64, device()).to(Device::cpu()).to_vector<int64_t>(),
            (std::vector<int64_t>{-7, -7}));
  EXPECT_EQ(Tensor::ones({2}, DType::i32, device()).to(Device::cpu()).to_vector<int32_t>(),
            (std::vector<int32_t>{1, 1}));
  EXPECT_EQ(Tensor::full({}, 2.5f, DType::f32, device()).to(Device::cpu()).to_vector<float>(),
            (std::vector<float>{2.5f}));
  expect_error<InvalidArgument>([&] { Tensor::full({2}, 1.5f, DType::i32, device()); },
                                {"Tensor::full", "1.5", "i32"});
}

TEST_P(TensorOpsTest, NarrowIsAViewAlongEveryDim) {
  const Tensor x = values({0, 1, 2, 3, 4, 5}, {3, 2});
  const Tensor v = ops::narrow(x, 0, 1, 2);
  EXPECT_TRUE(v.shares_storage(x));
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.to(Device::cpu()).to_vector<float>(), (std::vector<float>{2, 3, 4, 5}));
  const Tensor c = ops::narrow(x, 1, 1, 1);  // a column: strided
  EXPECT_TRUE(c.shares_storage(x));
  EXPECT_FALSE(c.is_contiguous());
  EXPECT_EQ(c.strides(), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(c.to(Device::cpu()).to_vector<float>(), (std::vector<float>{1, 3, 5}));
}

// Note [Strided views] in engine/ops/view.cpp.
TEST_P(TensorOpsTest, ViewsShareStorageAndKnowTheirStrides) {
  std::vector<float> v(24);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  const Tensor x = values(v, {2, 3, 4});
  EXPECT_EQ(x.strides(), (std::vector<int64_t>{12, 4, 1}));
  const Tensor p = ops::permute(x, {2, 0, 1});
  EXPECT_EQ(p.shape(), Shape({4, 2, 3}));
  EXPECT_EQ(p.strides(), (std::vector<int64_t>{1, 12, 4}));
  EXPECT_TRUE(p.shares_storage(x));
  EXPECT_FALSE(p.is_contiguous());
  expect_error<InvalidArgument>([&] { p.raw_data(); }, {"strided view", "contiguous()"});
  // Read through a copy in row-major order of the view: p[i, j, k] = x[j, k, i].
  const std::vector<float> got = p.to_vector<float>();
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 2; ++j)
      for (int64_t k = 0; k < 3; ++k)
        EXPECT_EQ(got[static_cast<std::size_t>((i * 2 + j) * 3 + k)], v[static_cast<std::size_t>(j * 12 + k * 4 + i)]);
  EXPECT_EQ(p.clone().to_vector<float>(), got);
  EXPECT_EQ(p.contiguous().to_vector<float>(), got);
  EXPECT_TRUE(ops::permute(p, {1, 2, 0}).is_contiguous()) << "undoing the permutation is dense again";
  const Tensor t = x.transpose(0, 2);
  EXPECT_EQ(t.shape(), Shape({4, 3, 2}));
  EXPECT_EQ(ops::reshape(t, {-1}).to_vector<float>(), t.contiguous().to_vector<float>())
      << "reshape of a strided view copies in the view's order";
  EXPECT_TRUE(ops::transpose(values({1, 2, 3}, {3, 1}), 0, 1).is_contiguous()) << "a size-1 dimension moves freely";
  expect_error<ShapeError>([&] { ops::permute(x, {0, 0, 1}); }, {"permute", "twice"});
  expect_error<ShapeError>([&] { ops::permute(x, {0, 1}); }, {"permute", "[2, 3, 4]"});
  expect_error<ShapeError>([&] { ops::transpose(x, 0, 3); }, {"transpose", "dim 3"});
}

TEST_P(TensorOpsTest, ExpandSqueezeUnsqueezeAndReshapeWithMinusOne) {
  const Tensor b = values({1, 2, 3}, {3, 1});
  const Tensor e = ops::expand(b, {2, 3, 4});
  EXPECT_EQ(e.shape(), Shape({2, 3, 4}));
  EXPECT_EQ(e.strides(), (std::vector<int64_t>{0, 1, 0}));
  const std::vector<float> ev = e.to_vector<float>();
  for (std::size_t i = 0; i < ev.size(); ++i)
    EXPECT_EQ(ev[i], static_cast<float>(i / 4 % 3 + 1)) << "e[i, j, k] = b[j]";
  expect_error<ShapeError>([&] { ops::expand(b, {4, 4}); }, {"expand", "size 4", "dimension 0"});
  expect_error<ShapeError>([&] { ops::expand(b, {4}); }, {"expand", "1 sizes"});
  EXPECT_EQ(ops::unsqueeze(b, 0).shape(), Shape({1, 3, 1}));
  EXPECT_EQ(ops::unsqueeze(b, -1).shape(), Shape({3, 1, 1}));
  EXPECT_EQ(ops::squeeze(b, 1).shape(), Shape({3}));
  EXPECT_EQ(ops::squeeze(b, 0).shape(), Shape({3, 1})) << "a dimension of size 3 stays, as torch.squeeze";
  const Tensor x = values(std::vector<float>(24, 1.0f), {2, 3, 4});
  EXPECT_EQ(ops::reshape(x, {-1, 4}).shape(), Shape({6, 4}));
  EXPECT_EQ(x.reshape({2, -1}).shape(), Shape({2, 12}));
  expect_error<ShapeError>([&] { ops::reshape(x, {-1, -1}); }, {"reshape", "only one"});
  expect_error<ShapeError>([&] { ops::reshape(x, {-1, 5}); }, {"reshape", "infer", "[2, 3, 4]"});
  expect_error<ShapeError>([&] { ops::reshape(x, {-2, 12}); }, {"reshape", "-2"});
  Shape eight;
  for (int d = 0; d < 8; ++d) eight.push_back(1);
  EXPECT_EQ(Tensor::zeros(eight, DType::f32, device()).ndim(), 8);
}

// A key/value cache written a position at a time: copy_from into a strided view.
TEST_P(TensorOpsTest, CopyFromWritesThroughAStridedView) {
  const Tensor cache = Tensor::zeros({2, 4, 3}, DType::f32, device());  // [heads, T, D]
  for (int64_t t = 0; t < 4; ++t) {
    const float f = static_cast<float>(t);
    Tensor slot = ops::narrow(cache, 1, t, 1);
    EXPECT_FALSE(slot.is_contiguous());
    slot.copy_from(values({f, f, f, -f, -f, -f}, {2, 1, 3}));
  }
  const std::vector<float> got = cache.to_vector<float>();
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t t = 0; t < 4; ++t)
      for (int64_t d = 0; d < 3; ++d)
        EXPECT_EQ(got[static_cast<std::size_t>((h * 4 + t) * 3 + d)], h == 0 ? float(t) : -float(t));
}

// Gradients reach a leaf through a chain of views and the copy an op makes of them, and the copy is
// an activation.
TEST_P(TensorOpsTest, GradientsFlowThroughViewsToTheLeaf) {
  std::vector<float> v(12);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.5f * static_cast<float>(i) - 2.0f;
  const Tensor x = values(v, {3, 4}, true);
  const Tensor view = ops::narrow(ops::transpose(x, 0, 1), 0, 1, 2);  // x[:, 1:3]^T, [2, 3]
  const Tensor y = ops::relu(view);
  EXPECT_EQ(y.memory_category(), MemoryCategory::activations);
  ops::sum(ops::mul(y, y)).backward();  // d/dx = 2 relu(x) on the selected columns, 0 elsewhere
  const std::vector<float> g = x.grad().to_vector<float>();
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 4; ++c) {
      const float xv = v[static_cast<std::size_t>(r * 4 + c)];
      const float want = (c == 1 || c == 2) ? 2.0f * std::max(xv, 0.0f) : 0.0f;
      EXPECT_EQ(g[static_cast<std::size_t>(r * 4 + c)], want) << r << ", " << c;
    }
}

TEST_P(TensorOpsTest, SlabErrors) {
  const Tensor x = Tensor::zeros({3, 2}, DType::f32, device());
  expect_error<ShapeError>([&] { ops::narrow(x, 0, 2, 2); }, {"narrow", "start 2", "length 2", "[3, 2]"});
  expect_error<ShapeError>([&] { ops::narrow(x, -3, 0, 1); }, {"narrow", "dim -3"});
  expect_error<ShapeError>([&] { ops::split(x, std::vector<int64_t>{1, 1}, 0); }, {"split", "sum to 2", "has 3"});
  expect_error<ShapeError>(
      [&] {
        ops::cat({x, Tensor::zeros({3, 3}, DType::f32, device())}, 0);
      },
      {"cat", "tensor 1", "[3, 3]", "[3, 2]"});
  expect_error<InvalidArgument>(
      [&] {
        ops::cat({x, Tensor::zeros({3, 2}, DType::f16, device())}, 0);
      },
      {"cat", "tensor 1", "f32"});
  expect_error<InvalidArgument>([&] { ops::cat({}, 0); }, {"cat", "no tensors"});
}

TEST_P(TensorOpsTest, LayerNormModuleIsPyTorchs) {
  nn::LayerNorm norm(4, 1e-5f, true, device());
  const auto params = norm.named_parameters();
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params[0].first, "weight");
  EXPECT_EQ(params[1].first, "bias");
  EXPECT_EQ(params[0].second.to(Device::cpu()).to_vector<float>(), (std::vector<float>{1, 1, 1, 1}));
  EXPECT_EQ(params[1].second.to(Device::cpu()).to_vector<float>(), (std::vector<float>{0, 0, 0, 0}));
  const std::vector<float> y = norm(values({1, 2, 3, 4}, {1, 4})).to(Device::cpu()).to_vector<float>();
  const float inv = 1.0f / std::sqrt(1.25f + 1e-5f);  // biased variance of 1..4 is 1.25
  EXPECT_NEAR(y[0], -1.5f * inv, 1e-6);
  EXPECT_NEAR(y[3], 1.5f * inv, 1e-6);
  EXPECT_TRUE(nn::LayerNorm(4, 1e-5f, false, device()).named_parameters().empty());
}

// Over a dimension of size 1 the output is the bias whatever x is, so x's gradient is exactly 0, as
// PyTorch's (issue 59: the CPU's vector row gave +-3e-5), with or without the parameters' gradients.
TEST_P(TensorOpsTest, LayerNormOverOneElementHasAZeroGradient) {
  for (bool affine : {true, false}) {
    const Tensor x = values({0.5f, -3.0f, 7.25f, 100.0f, -0.001f, 2.0f}, {6, 1}, true);
    const Tensor w = values({1.5f}, {1}, affine), b = values({0.25f}, {1}, affine);
    const Tensor y = affine ? ops::layer_norm(x, 1, w, b) : ops::layer_norm(x, 1);
    // Upstream values whose products with rstd (316.2) are not floats: the residue shows.
    ops::sum(ops::mul(y, values({0.3712f, -1.234567f, 2.71828f, 0.1f, 4.4f, -0.77f}, {6, 1}))).backward();
    EXPECT_EQ(x.grad().to(Device::cpu()).to_vector<float>(), std::vector<float>(6, 0.0f)) << "affine " << affine;
  }
}

// nn.RMSNorm's parameter, PyTorch's default eps (the float epsilon), and several normalized
// dimensions as one row of their product.
TEST_P(TensorOpsTest, RmsNormModuleIsPyTorchs) {
  nn::RMSNorm norm(Shape{4}, std::nullopt, true, device());
  const auto params = norm.named_parameters();
  ASSERT_EQ(params.size(), 1u);
  EXPECT_EQ(params[0].first, "weight");
  EXPECT_EQ(params[0].second.to(Device::cpu()).to_vector<float>(), (std::vector<float>{1, 1, 1, 1}));
  const std::vector<float> y = norm(values({1, 2, 3, 4}, {1, 4})).to(Device::cpu()).to_vector<float>();
  const double inv = 1.0 / std::sqrt(7.5 + std::ldexp(1.0, -23));  // mean of the squares of 1..4 is 7.5
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[i], (i + 1) * inv, 1e-6) << i;
  const Tensor x = values({1, -2, 3, 0.5f, 2, 2, -1, 4}, {2, 2, 2});
  const auto over_two = ops::rms_norm(x, Shape{2, 2}).to(Device::cpu()).to_vector<float>();
  const auto over_one = ops::rms_norm(ops::reshape(x, Shape{2, 4}), Shape{4}).to(Device::cpu()).to_vector<float>();
  EXPECT_EQ(over_two, over_one);
  EXPECT_TRUE(nn::RMSNorm(Shape{4}, 1e-5f, false, device()).named_parameters().empty());
  expect_error<ShapeError>([&] { ops::rms_norm(x, Shape{4}); }, {"rms_norm", "[4]", "last dimensions", "[2, 2, 2]"});
  expect_error<ShapeError>([&] { ops::rms_norm(x, Shape{2}, Tensor::zeros({3}, DType::f32, device())); },
                           {"rms_norm", "weight must be [2]", "[3]"});
}

TEST_P(TensorOpsTest, EmbeddingModuleIsPyTorchs) {
  Generator gen(3);
  nn::Embedding emb(200, 50, gen, device());
  const auto params = emb.named_parameters();
  ASSERT_EQ(params.size(), 1u);
  EXPECT_EQ(params[0].first, "weight");
  EXPECT_EQ(params[0].second.shape(), Shape({200, 50}));
  double sum = 0, sq = 0;
  const std::vector<float> w = params[0].second.to(Device::cpu()).to_vector<float>();
  for (float v : w) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double mean = sum / w.size(), var = sq / w.size() - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.05);  // N(0, 1) over 10000 draws
  EXPECT_NEAR(var, 1.0, 0.05);
  EXPECT_EQ(emb(ints({0, 199}, {2})).shape(), Shape({2, 50}));
}

CUMULUS_INSTANTIATE_DEVICES(TensorOpsTest);

}  // namespace
}  // namespace cumulus::testing
