// The reductions over dimensions (cumulus/ops/reduce.h) beyond what their op cases check
// (tests/op_cases/cases_reduce_dims.cpp: values, gradients, CPU against CUDA): result shapes and
// dtypes, dimensions of size 0, NaN and infinities, the gradient of a tie (max's to the first
// element, amax's shared), which reductions count as a loss's, argument errors, and multinomial's
// draws: reproducible per seed, distributed as the weights say. And the CPU kernels of sum and mean
// and their backward against the definition, to the bit, over many geometries, types and thread
// counts (Note [Sums over dimensions across outputs] in kernels/cpu/reduce_dims.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cumulus/autograd/node.h"
#include "cumulus/core/error.h"
#include "cumulus/core/threads.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/ops/shape.h"
#include "kernels/cpu/reduce_dims_kernels.h"
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

// ---- sum_dims_cpu and sum_dims_backward_cpu against the definition, to the bit ----

using kernels::ReduceGeometry;

struct DimsCase {
  std::vector<int64_t> shape;
  std::vector<int> dims;  // the reduced ones
};

std::string case_name(const DimsCase& c) {
  std::string name = "[";
  for (int64_t n : c.shape) name += std::to_string(n) + ",";
  name += "] over";
  for (int d : c.dims) name += " " + std::to_string(d);
  return name;
}

bool is_reduced(const DimsCase& c, int d) {
  for (int r : c.dims)
    if (r == d) return true;
  return false;
}

// The engine's geometry (engine/ops/reduce_dims.cpp's geometry_of): dimensions of size 1 dropped,
// neighbours of the same kind merged.
ReduceGeometry geometry_of(const DimsCase& c) {
  ReduceGeometry g;
  const int ndim = static_cast<int>(c.shape.size());
  std::vector<int64_t> strides(c.shape.size());
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    strides[d] = stride;
    stride *= c.shape[d];
  }
  int last_kind = -1;
  for (int d = 0; d < ndim; ++d) {
    const int kind = is_reduced(c, d) ? 1 : 0;
    (kind ? g.terms : g.outputs) *= c.shape[d];
    if (c.shape[d] == 1) continue;
    int& n = kind ? g.reduced_ndim : g.kept_ndim;
    int64_t* size = kind ? g.reduced_size : g.kept_size;
    int64_t* str = kind ? g.reduced_stride : g.kept_stride;
    if (last_kind == kind) {
      size[n - 1] *= c.shape[d];
      str[n - 1] = strides[d];
    } else {
      size[n] = c.shape[d];
      str[n++] = strides[d];
    }
    last_kind = kind;
  }
  return g;
}

// For each output (row-major over the kept dimensions), the offsets of its terms in order (row-major
// over the reduced dimensions), straight from the shape.
std::vector<std::vector<int64_t>> terms_of(const DimsCase& c) {
  const int ndim = static_cast<int>(c.shape.size());
  int64_t numel = 1;
  for (int64_t n : c.shape) numel *= n;
  std::vector<std::vector<int64_t>> out;
  std::vector<int64_t> index(c.shape.size(), 0);
  // Visit the elements in the order (kept index, reduced index), both row-major: the kept
  // dimensions are the outer digits of the odometer, the reduced ones the inner.
  std::vector<int> order;
  for (int d = 0; d < ndim; ++d)
    if (!is_reduced(c, d)) order.push_back(d);
  const std::size_t kept = order.size();
  for (int d = 0; d < ndim; ++d)
    if (is_reduced(c, d)) order.push_back(d);
  int64_t terms = 1;
  for (std::size_t k = kept; k < order.size(); ++k) terms *= c.shape[order[k]];
  for (int64_t e = 0; e < numel; ++e) {
    if (terms == 0) break;
    if (e % terms == 0) out.emplace_back();
    int64_t offset = 0, stride = 1;
    for (int d = ndim - 1; d >= 0; --d) {
      offset += index[d] * stride;
      stride *= c.shape[d];
    }
    out.back().push_back(offset);
    for (int k = ndim - 1; k >= 0; --k) {
      if (++index[order[k]] < c.shape[order[k]]) break;
      index[order[k]] = 0;
    }
  }
  if (terms == 0) {
    int64_t outputs = 1;
    for (std::size_t k = 0; k < kept; ++k) outputs *= c.shape[order[k]];
    out.assign(static_cast<std::size_t>(outputs), {});
  }
  return out;
}

template <typename T>
uint32_t bits_of(T v) {
  uint32_t b = 0;
  std::memcpy(&b, &v, sizeof v);
  return b;
}

// Values of many magnitudes and, one in eight, a huge one (2^60; 2^14 for f16) that swallows the
// small ones added after it until another cancels it: a double sum of f32 or bf16 values so
// depends on its order, and a test of the bits sees any change of it. (A double sum of f16 values,
// 40 bits from the largest to the smallest, is exact in any order.)
template <typename T>
std::vector<T> wide_values(int64_t n, uint32_t seed) {
  constexpr bool kHalf = std::is_same_v<T, Half>;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mantissa(-2.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(kHalf ? -12 : -20, kHalf ? 10 : 20), pick(0, 15);
  std::vector<T> v(static_cast<std::size_t>(n));
  for (T& e : v) {
    const int p = pick(rng);
    const float huge = kHalf ? 16384.0f : 1.152921504606846976e18f;  // 2^14, 2^60
    e = kernels::from_f32<T>(p == 0 ? huge : p == 1 ? -huge : std::ldexp(mantissa(rng), exponent(rng)));
  }
  return v;
}

// An output's sum by the definition (Note [Sums over dimensions across outputs]): in term order
// where the innermost kept dimension has stride 1 (columns), otherwise 8 partial sums, the term at
// position j of its run (the innermost reduced dimension) in partial j % 8, added as ((p0 + p4) +
// (p2 + p6)) + ((p1 + p5) + (p3 + p7)) (rows).
template <typename Term>
double defined_sum(const ReduceGeometry& g, int64_t terms, Term term) {
  const bool columns = g.kept_ndim > 0 && g.kept_stride[g.kept_ndim - 1] == 1;
  const int64_t run = g.reduced_ndim > 0 ? g.reduced_size[g.reduced_ndim - 1] : 1;
  double p[8] = {};
  for (int64_t t = 0; t < terms; ++t) p[columns ? 0 : t % run % 8] += term(t);
  return ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
}

const std::vector<DimsCase>& dims_cases() {
  static const std::vector<DimsCase> cases = {
      {{8, 64, 128}, {2}},  {{8, 64, 128}, {0}},    {{8, 64, 128}, {1}},       {{8, 64, 128}, {0, 2}},
      {{8, 64, 128}, {0, 1, 2}}, {{8, 64, 128}, {1, 2}}, {{8, 64, 128}, {0, 1}},
      {{3, 5, 7}, {0}},     {{3, 5, 7}, {1}},       {{3, 5, 7}, {2}},          {{3, 5, 7}, {0, 2}},
      {{3, 5, 7}, {}},      {{37, 19}, {1}},        {{37, 19}, {0}},           {{5, 1, 9}, {1}},
      {{5, 1, 9}, {0, 1}},  {{1, 33}, {0}},         {{33, 1}, {0}},            {{2, 3, 4, 5, 6}, {1, 3}},
      {{2, 3, 4, 5, 6}, {0, 2, 4}}, {{2, 3, 4, 5, 6}, {4}}, {{1000, 3}, {0}},   {{3, 1000}, {1}},
      {{17, 40, 3}, {1}},   {{2, 50, 2, 24}, {1, 3}}, {{2, 50, 3, 9}, {1, 3}}, {{600, 70}, {1}},
      {{70, 600}, {0}},     {{20000, 2}, {1}},      {{2, 20000}, {0}},         {{4, 0, 2}, {1}},
      {{0, 3}, {1}},        {{2, 3, 2, 3, 2, 3, 2, 3}, {0, 2, 4, 6}}, {{2, 3, 2, 3, 2, 3, 2, 3}, {1, 3, 5, 7}},
      {{9, 23, 5}, {0, 2}}, {{1}, {0}},             {{7}, {0}}};
  return cases;
}

// Runs fn(threads) at 1 and 2 CPU threads, restoring the setting.
template <typename Fn>
void at_thread_counts(Fn fn) {
  const int before = cpu_threads();
  for (int threads : {1, 2}) {
    set_cpu_threads(threads);
    SCOPED_TRACE("threads " + std::to_string(threads));
    fn();
  }
  set_cpu_threads(before);
}

template <typename T>
void expect_sums_match_definition() {
  for (const DimsCase& c : dims_cases()) {
    SCOPED_TRACE(case_name(c));
    const ReduceGeometry g = geometry_of(c);
    const std::vector<std::vector<int64_t>> terms = terms_of(c);
    ASSERT_EQ(static_cast<int64_t>(terms.size()), g.outputs);
    const std::vector<T> x = wide_values<T>(g.outputs * g.terms, 7);
    for (int64_t divisor : {int64_t{1}, g.terms}) {
      std::vector<T> want(terms.size());
      for (std::size_t o = 0; o < terms.size(); ++o) {
        const std::vector<int64_t>& at = terms[o];
        const double s = defined_sum(g, static_cast<int64_t>(at.size()),
                                     [&](int64_t t) { return static_cast<double>(kernels::to_f32(x[at[t]])); });
        want[o] = kernels::from_f32<T>(static_cast<float>(s / static_cast<double>(divisor)));
      }
      at_thread_counts([&] {
        std::vector<T> y(terms.size(), kernels::from_f32<T>(-1.0f));
        kernels::sum_dims_cpu(g, x.data(), divisor, y.data());
        for (std::size_t o = 0; o < y.size(); ++o) {
          if (std::isnan(kernels::to_f32(want[o])))  // the mean of no terms (0 / 0)
            ASSERT_TRUE(std::isnan(kernels::to_f32(y[o]))) << "output " << o;
          else ASSERT_EQ(bits_of(y[o]), bits_of(want[o])) << "output " << o << " divisor " << divisor;
        }
      });
    }
  }
}

template <typename T>
void expect_backward_matches_definition() {
  for (const DimsCase& c : dims_cases()) {
    SCOPED_TRACE(case_name(c));
    const ReduceGeometry g = geometry_of(c);
    const std::vector<std::vector<int64_t>> terms = terms_of(c);
    const std::vector<T> dy = wide_values<T>(g.outputs, 8), old = wide_values<T>(g.outputs * g.terms, 9);
    for (float beta : {0.0f, 1.0f})
      for (float scale : {1.0f, 0.3f}) {
        std::vector<uint32_t> want(old.size());
        for (std::size_t i = 0; i < old.size(); ++i) want[i] = bits_of(old[i]);
        for (std::size_t o = 0; o < terms.size(); ++o) {
          const float v = scale * kernels::to_f32(dy[o]);
          for (int64_t i : terms[o])
            want[i] = bits_of(kernels::from_f32<T>(beta == 0.0f ? v : v + beta * kernels::to_f32(old[i])));
        }
        at_thread_counts([&] {
          std::vector<T> dx = old;
          kernels::sum_dims_backward_cpu(g, dy.data(), scale, beta, dx.data());
          for (std::size_t i = 0; i < dx.size(); ++i)
            ASSERT_EQ(bits_of(dx[i]), want[i]) << "element " << i << " beta " << beta << " scale " << scale;
        });
      }
  }
}

TEST(SumDimsCpu, SumsMatchTheDefinitionToTheBit) {
  expect_sums_match_definition<float>();
  expect_sums_match_definition<BFloat16>();
  expect_sums_match_definition<Half>();
}

TEST(SumDimsCpu, BackwardMatchesTheDefinitionToTheBit) {
  expect_backward_matches_definition<float>();
  expect_backward_matches_definition<BFloat16>();
  expect_backward_matches_definition<Half>();
}

// A geometry the engine does not make (no dimension of stride 1: a strided view) takes the general
// loops: still the definition's bits, and untouched elements stay as they were.
TEST(SumDimsCpu, StridedGeometryMatchesTheDefinition) {
  ReduceGeometry g;
  g.kept_ndim = 2;
  g.kept_size[0] = 5, g.kept_stride[0] = 200, g.kept_size[1] = 9, g.kept_stride[1] = 2;
  g.reduced_ndim = 2;
  g.reduced_size[0] = 4, g.reduced_stride[0] = 40, g.reduced_size[1] = 19, g.reduced_stride[1] = 1000;
  g.outputs = 45;
  g.terms = 76;
  const int64_t size = 4 * 200 + 19 * 1000;
  const std::vector<float> x = wide_values<float>(size, 10), dy = wide_values<float>(g.outputs, 11);
  at_thread_counts([&] {
    std::vector<float> y(45);
    kernels::sum_dims_cpu(g, x.data(), 3, y.data());
    std::vector<float> dx = x, want = x;
    kernels::sum_dims_backward_cpu(g, dy.data(), 0.5f, 1.0f, dx.data());
    for (int64_t o = 0; o < g.outputs; ++o) {
      const auto at = [&](int64_t r) { return kernels::kept_offset(g, o) + kernels::reduced_offset(g, r); };
      const double s = defined_sum(g, g.terms, [&](int64_t r) { return static_cast<double>(x[at(r)]); });
      for (int64_t r = 0; r < g.terms; ++r) want[at(r)] = 0.5f * dy[o] + 1.0f * x[at(r)];
      ASSERT_EQ(bits_of(y[o]), bits_of(static_cast<float>(s / 3.0))) << o;
    }
    for (std::size_t i = 0; i < dx.size(); ++i) ASSERT_EQ(bits_of(dx[i]), bits_of(want[i])) << i;
  });
}

// NaN and infinities reach the outputs from any lane of the vector loops.
TEST(SumDimsCpu, NaNAndInfinityInEveryLane) {
  for (const DimsCase& c : {DimsCase{{40, 37}, {1}}, DimsCase{{37, 40}, {0}}}) {
    SCOPED_TRACE(case_name(c));
    const ReduceGeometry g = geometry_of(c);
    const std::vector<std::vector<int64_t>> terms = terms_of(c);
    std::vector<float> x = wide_values<float>(40 * 37, 12);
    for (std::size_t o = 0; o < terms.size(); o += 3) x[terms[o][o % 37]] = NAN;
    for (std::size_t o = 1; o < terms.size(); o += 3) x[terms[o][(o * 7) % 37]] = INFINITY;
    std::vector<float> y(40);
    kernels::sum_dims_cpu(g, x.data(), 1, y.data());
    for (std::size_t o = 0; o < y.size(); ++o) {
      if (o % 3 == 0) EXPECT_TRUE(std::isnan(y[o])) << o;
      else if (o % 3 == 1) EXPECT_EQ(y[o], INFINITY) << o;
      else EXPECT_TRUE(std::isfinite(y[o])) << o;
    }
  }
}

}  // namespace
}  // namespace cumulus
