// The reductions over dimensions (cumulus/ops/reduce.h) beyond what their op cases check
// (tests/op_cases/cases_reduce_dims.cpp: values, gradients, CPU against CUDA): result shapes and
// dtypes, dimensions of size 0, NaN and infinities, the gradient of a tie (max's to the first
// element, amax's shared), which reductions count as a loss's, argument errors, and multinomial's
// draws: reproducible per seed, distributed as the weights say.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cumulus/autograd/node.h"
#include "cumulus/core/error.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/ops/shape.h"
#include "test_util.h"

namespace cumulus {
namespace {

using testing::DeviceTest;

class ReduceDims : public DeviceTest {
 protected:
  Tensor values(const std::vector<float>& v, const Shape& shape, bool grad = false) const {
    Tensor t = Tensor::from_vector(v, shape, device());
    if (grad) t.set_requires_grad(true);
    return t;
  }
  Tensor iota(const Shape& shape) const {
    std::vector<float> v(static_cast<std::size_t>(shape.numel()));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
    return values(v, shape);
  }
};

TEST_P(ReduceDims, SumAndMeanShapes) {
  const Tensor x = iota({2, 3, 4});
  EXPECT_EQ(ops::sum(x, {1}).shape(), (Shape{2, 4}));
  EXPECT_EQ(ops::sum(x, 1).shape(), (Shape{2, 4}));
  EXPECT_EQ(ops::sum(x, -1, true).shape(), (Shape{2, 3, 1}));
  EXPECT_EQ(ops::mean(x, {0, 2}, true).shape(), (Shape{1, 3, 1}));
  EXPECT_EQ(ops::mean(x, {2, 0}).shape(), (Shape{3}));
  EXPECT_EQ(ops::sum(x, {}).shape(), Shape{});  // every dimension, as torch.sum(x, dim=[])
  EXPECT_EQ(ops::sum(x, {}).to_vector<float>(), std::vector<float>{276.0f});
  EXPECT_EQ(ops::sum(x, std::vector<int64_t>{0, 1, 2}, true).shape(), (Shape{1, 1, 1}));
  const Tensor scalar = values({2.5f}, Shape{});
  for (int64_t dim : {0, -1}) {
    EXPECT_EQ(ops::sum(scalar, dim).shape(), Shape{});
    EXPECT_EQ(ops::mean(scalar, dim, true).to_vector<float>(), std::vector<float>{2.5f});
  }
}

TEST_P(ReduceDims, SixteenBitSumsKeepTheirType) {
  const Tensor x = ops::cast(iota({4, 5}), DType::bf16);
  EXPECT_EQ(ops::sum(x, 0).dtype(), DType::bf16);
  EXPECT_EQ(ops::mean(x, {1}).dtype(), DType::bf16);
  EXPECT_EQ(ops::sum(x).dtype(), DType::bf16);  // the sum of all elements accepts 16 bits too
  EXPECT_EQ(ops::cast(ops::sum(x), DType::f32).to_vector<float>(), std::vector<float>{190.0f});
}

// A dimension of size 0: its sum is 0 and its mean NaN (as torch); max / min / argmax refuse it.
TEST_P(ReduceDims, EmptyDimensions) {
  const Tensor x = Tensor::zeros(Shape{2, 0, 3}, DType::f32, device());
  const Tensor s = ops::sum(x, 1);
  EXPECT_EQ(s.shape(), (Shape{2, 3}));
  EXPECT_EQ(s.to_vector<float>(), std::vector<float>(6, 0.0f));
  for (float v : ops::mean(x, 1).to_vector<float>()) EXPECT_TRUE(std::isnan(v));
  EXPECT_EQ(ops::sum(x, 0, true).shape(), (Shape{1, 0, 3}));
  EXPECT_THROW(ops::max(x, 1), InvalidArgument);
  EXPECT_THROW(ops::min(x, -2), InvalidArgument);
  EXPECT_THROW(ops::argmax(x, 1), InvalidArgument);
  // Reducing a dimension that is not empty of an empty tensor gives an empty result.
  const ops::ValuesAndIndices m = ops::max(x, 2);
  EXPECT_EQ(m.values.shape(), (Shape{2, 0}));
  EXPECT_EQ(m.indices.shape(), (Shape{2, 0}));
  const ops::ValuesAndIndices t = ops::topk(iota({2, 3}), 0);
  EXPECT_EQ(t.values.shape(), (Shape{2, 0}));
}

TEST_P(ReduceDims, SelectionsShapesAndTypes) {
  const Tensor x = values({1, 5, 2, 7, 0, 3}, {2, 3}, true);
  const auto [v, i] = ops::max(x, 1);
  EXPECT_EQ(v.shape(), (Shape{2}));
  EXPECT_EQ(i.dtype(), DType::i64);
  EXPECT_TRUE(v.requires_grad());
  EXPECT_FALSE(i.requires_grad());
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(ops::min(x, 0, true).indices.shape(), (Shape{1, 3}));
  EXPECT_EQ(ops::argmin(x, 0).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 0}));
  EXPECT_EQ(ops::argmax(x, -1, true).shape(), (Shape{2, 1}));
  const ops::ValuesAndIndices t = ops::topk(x, 2, 1, false);
  EXPECT_EQ(t.values.to_vector<float>(), (std::vector<float>{1, 2, 0, 3}));
  EXPECT_EQ(t.indices.to_vector<int64_t>(), (std::vector<int64_t>{0, 2, 1, 2}));
  const Tensor scalar = values({4.0f}, Shape{});
  EXPECT_EQ(ops::max(scalar, 0).indices.to_vector<int64_t>(), std::vector<int64_t>{0});
  EXPECT_EQ(ops::topk(scalar, 1, 0).values.shape(), Shape{});
}

// The gradient of a tied maximum goes to the first of them alone (torch's CPU max).
TEST_P(ReduceDims, TiedMaximumTakesTheWholeGradient) {
  const Tensor x = values({1, 3, 3, -2}, {4}, true);
  ops::sum(ops::max(x, 0).values).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{0, 1, 0, 0}));
}

// amax / amin share the gradient among tied elements (torch's rule, unlike max's); a NaN result
// sends NaN to its every element, as torch's (dy / 0 * 0).
TEST_P(ReduceDims, AmaxSharesTheGradientAmongTies) {
  const Tensor x = values({1, 3, 3, 3, 5, -2, -2, 0}, {2, 4}, true);
  const Tensor y = ops::amax(x, 1);
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{3, 5}));
  ops::sum(ops::amin(x, 1) + y).backward();
  const std::vector<float> g = x.grad().to_vector<float>();
  const std::vector<float> want = {1, 1.0f / 3, 1.0f / 3, 1.0f / 3, 1, 0.5f, 0.5f, 0};
  for (std::size_t i = 0; i < g.size(); ++i) EXPECT_FLOAT_EQ(g[i], want[i]) << i;
  const Tensor z = values({1, NAN, 2}, {3}, true);
  const Tensor m = ops::amax(z, 0);
  EXPECT_TRUE(std::isnan(m.to_vector<float>()[0]));
  ops::sum(m).backward();
  for (float v : z.grad().to_vector<float>()) EXPECT_TRUE(std::isnan(v));
  EXPECT_THROW(ops::amax(Tensor::zeros(Shape{2, 0}, DType::f32, device()), 1), InvalidArgument);
  EXPECT_EQ(ops::amin(Tensor::zeros(Shape{2, 0}, DType::f32, device()), 0).shape(), (Shape{0}));
}

// A sum or mean over every element is a loss's (Note [Mean-reduced losses]); over part, not.
TEST_P(ReduceDims, OutputReductionOfSumAndMean) {
  const Tensor x = values({1, 2, 3, 4, 5, 6}, {2, 3}, true);
  EXPECT_EQ(ops::mean(x, {}).grad_fn()->output_reduction(), OutputReduction::mean);
  EXPECT_EQ(ops::sum(x, {0, 1}).grad_fn()->output_reduction(), OutputReduction::sum);
  EXPECT_EQ(ops::mean(x, 1).grad_fn()->output_reduction(), OutputReduction::unknown);
  EXPECT_EQ(ops::sum(values({1, 2, 3}, {3, 1}, true), 1).grad_fn()->output_reduction(), OutputReduction::none);
}

// NaN and infinities as torch: a sum or mean with a NaN, or with both infinities, is NaN; max and
// min return the first NaN of a row and its index, amax / amin NaN.
TEST_P(ReduceDims, NaNAndInfinities) {
  const Tensor x = values({1, INFINITY, 2, INFINITY, -INFINITY, 0, NAN, 5, NAN}, {3, 3});
  const std::vector<float> s = ops::sum(x, 1).to_vector<float>();
  EXPECT_EQ(s[0], INFINITY);
  EXPECT_TRUE(std::isnan(s[1]) && std::isnan(s[2]));
  EXPECT_TRUE(std::isnan(ops::mean(x, {}).to_vector<float>()[0]));
  for (bool largest : {true, false}) {
    const ops::ValuesAndIndices m = largest ? ops::max(x, 1) : ops::min(x, 1);
    const std::vector<float> v = m.values.to_vector<float>();
    EXPECT_EQ(v[0], largest ? INFINITY : 1.0f);
    EXPECT_EQ(v[1], largest ? INFINITY : -INFINITY);
    EXPECT_TRUE(std::isnan(v[2]));
    EXPECT_EQ(m.indices.to_vector<int64_t>(), (std::vector<int64_t>{largest ? 1 : 0, largest ? 0 : 1, 0}));
    const Tensor a = largest ? ops::amax(x, 0) : ops::amin(x, 0);
    EXPECT_TRUE(std::isnan(a.to_vector<float>()[0]) && std::isnan(a.to_vector<float>()[2]));
  }
}

TEST_P(ReduceDims, ArgumentErrors) {
  const Tensor x = iota({2, 3});
  EXPECT_THROW(ops::sum(x, 2), InvalidArgument);
  EXPECT_THROW(ops::sum(x, -3), InvalidArgument);
  EXPECT_THROW(ops::mean(x, {1, -1}), InvalidArgument);  // the same dimension twice
  EXPECT_THROW(ops::max(x, 5), InvalidArgument);
  EXPECT_THROW(ops::sum(Tensor::zeros(Shape{3}, DType::i32, device()), 0), InvalidArgument);
  EXPECT_THROW(ops::topk(x, 4, 1), InvalidArgument);
  EXPECT_THROW(ops::topk(x, -1), InvalidArgument);
  EXPECT_THROW(ops::sum(values({1.0f}, Shape{}), 1), InvalidArgument);
  try {
    ops::sum(x, 7);
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("sum: dim 7 is out of range"), std::string::npos) << e.what();
  }
}

TEST_P(ReduceDims, MultinomialArgumentErrors) {
  const Tensor w = values({1, 2, 0, 4}, {2, 2});
  EXPECT_THROW(ops::multinomial(values({1, -1}, {2}), 1, true, 0), InvalidArgument);
  EXPECT_THROW(ops::multinomial(values({1, NAN}, {2}), 1, true, 0), InvalidArgument);
  EXPECT_THROW(ops::multinomial(values({1, INFINITY}, {2}), 1, true, 0), InvalidArgument);
  EXPECT_THROW(ops::multinomial(values({0, 0}, {2}), 1, true, 0), InvalidArgument);
  EXPECT_THROW(ops::multinomial(w, 2, false, 0), InvalidArgument);  // row 1 has one positive weight
  EXPECT_NO_THROW(ops::multinomial(w, 2, true, 0));
  EXPECT_THROW(ops::multinomial(w, 3, false, 0), InvalidArgument);  // more samples than categories
  EXPECT_THROW(ops::multinomial(w, 0, true, 0), InvalidArgument);
  EXPECT_THROW(ops::multinomial(iota({2, 2, 2}), 1, true, 0), InvalidArgument);
  EXPECT_THROW(ops::multinomial(Tensor::zeros(Shape{3}, DType::i32, device()), 1, true, 0), InvalidArgument);
}

TEST_P(ReduceDims, MultinomialIsReproducibleAndSeeded) {
  const Tensor w = values({1, 2, 3, 4, 0, 5}, {2, 3});
  const Tensor a = ops::multinomial(w, 50, true, 7);
  EXPECT_EQ(a.shape(), (Shape{2, 50}));
  EXPECT_EQ(a.dtype(), DType::i64);
  EXPECT_EQ(a.to_vector<int64_t>(), ops::multinomial(w, 50, true, 7).to_vector<int64_t>());
  EXPECT_NE(a.to_vector<int64_t>(), ops::multinomial(w, 50, true, 8).to_vector<int64_t>());
  const std::vector<int64_t> s = a.to_vector<int64_t>();
  for (std::size_t k = 50; k < 100; ++k) EXPECT_NE(s[k], 1) << "a category of weight 0 was drawn";
  EXPECT_EQ(ops::multinomial(values({3, 1}, {2}), 1, false, 1).shape(), (Shape{1}));
}

// Frequencies of 200000 draws against the weights: each within 5 standard deviations (a false
// failure has probability below 1e-5 per category). Without replacement, the first of two draws
// from {1, 3} is category 1 three times in four, and the second is the other category.
TEST_P(ReduceDims, MultinomialFollowsTheWeights) {
  const std::vector<float> w = {1, 2, 0, 3, 4};
  const int64_t n = 200000;
  const std::vector<int64_t> s = ops::multinomial(values(w, {5}), n, true, 42).to_vector<int64_t>();
  std::vector<int64_t> counts(w.size(), 0);
  for (int64_t c : s) ++counts[static_cast<std::size_t>(c)];
  for (std::size_t c = 0; c < w.size(); ++c) {
    const double p = w[c] / 10.0, sd = std::sqrt(n * p * (1 - p));
    EXPECT_LE(std::abs(counts[c] - n * p), 5 * sd + 1e-9) << "category " << c;
  }
  const int64_t rows = 20000;
  std::vector<float> pv(static_cast<std::size_t>(2 * rows));
  for (int64_t r = 0; r < rows; ++r) {
    pv[2 * r] = 1;
    pv[2 * r + 1] = 3;
  }
  const std::vector<int64_t> d = ops::multinomial(values(pv, {rows, 2}), 2, false, 3).to_vector<int64_t>();
  int64_t first_is_1 = 0;
  for (int64_t r = 0; r < rows; ++r) {
    ASSERT_NE(d[2 * r], d[2 * r + 1]) << "row " << r;
    first_is_1 += d[2 * r] == 1;
  }
  EXPECT_LE(std::abs(first_is_1 - 0.75 * rows), 5 * std::sqrt(rows * 0.75 * 0.25));
}

CUMULUS_INSTANTIATE_DEVICES(ReduceDims);

}  // namespace
}  // namespace cumulus
