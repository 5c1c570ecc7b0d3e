// The comparison and mask CUDA kernels (kernels/cuda/compare.cu) on the CPU emulation against their
// CPU twins (kernels/cpu/compare.cpp), bit for bit: comparisons and logical ops over every storage
// type with NaN, infinities and signed zeros, in broadcast shapes of up to 4 dimensions; where with
// tensors and scalars for every element size, its broadcast gradients with beta 0 over a NaN
// destination (never read) and beta 1; tril / triu forward and backward; arange; bool to every type.
// A few results are also checked against values written out here, so that a rule wrong on both
// devices fails too.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/compare_kernels.h"
#include "kernels/cuda/compare_kernels.h"
#include "tests/emulated/emulated.h"

namespace cumulus::testing {
namespace {

using kernels::CompareOp;
using kernels::from_f32;
using kernels::NaryGeometry;

constexpr CompareOp kOps[] = {CompareOp::eq,          CompareOp::ne,         CompareOp::lt,
                              CompareOp::le,          CompareOp::gt,         CompareOp::ge,
                              CompareOp::logical_and, CompareOp::logical_or, CompareOp::logical_xor};

using Dims = std::vector<int64_t>;

// The geometry of operands broadcast to their numpy shape.
NaryGeometry geometry(const std::vector<Dims>& shapes) {
  std::size_t nd = 0;
  for (const Dims& s : shapes) nd = std::max(nd, s.size());
  Dims out(nd, 1);
  for (const Dims& s : shapes)
    for (std::size_t k = 0; k < s.size(); ++k)
      if (s[k] != 1) out[nd - s.size() + k] = s[k];
  const int64_t* ptrs[3];
  int ndims[3];
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    ptrs[k] = shapes[k].data();
    ndims[k] = static_cast<int>(shapes[k].size());
  }
  return kernels::nary_geometry(out.data(), static_cast<int>(nd), static_cast<int>(shapes.size()), ptrs, ndims);
}

// Values with ties ({-2, -1, 0, 1}) and every special value of emulated.h, stored as T.
template <typename T>
DeviceVector<T> compare_values(int64_t n, uint64_t seed) {
  auto v = random_values(n, -2, 2, seed);
  for (float& x : v) x = std::floor(x);
  if constexpr (kernels::kFloatStorage<T>) {
    return stored_as<T>(with_specials(v, 5, seed % 5));
  } else {
    DeviceVector<T> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i)
      out[i] = static_cast<T>(std::is_same<T, uint8_t>::value ? v[i] + 2 : v[i]);
    return out;
  }
}

template <typename T>
class CompareEmulated : public ::testing::Test {};
using CompareTypes = ::testing::Types<float, BFloat16, Half, int32_t, int64_t, uint8_t>;
struct CompareTypeName {
  template <typename T>
  static std::string GetName(int) {
    return dtype_name(dtype_of<T>::value);  // uint8_t stands for u8 and bool alike
  }
};
TYPED_TEST_SUITE(CompareEmulated, CompareTypes, CompareTypeName);

const std::vector<std::pair<Dims, Dims>> kShapes = {
    {{3, 257}, {3, 257}}, {{5, 67}, {67}}, {{7, 1, 3}, {1, 40, 1}}, {{2, 3, 1, 5}, {3, 4, 1}}, {{1}, {2, 130}}};

TYPED_TEST(CompareEmulated, ComparisonsMatchTheCpu) {
  using T = TypeParam;
  for (const auto& [sa, sb] : kShapes) {
    const NaryGeometry g = geometry({sa, sb});
    const auto a = compare_values<T>(g.numel(1), 1), b = compare_values<T>(g.numel(2), 2);
    for (CompareOp op : kOps) {
      SCOPED_TRACE("op " + std::to_string(static_cast<int>(op)) + ", a of " + std::to_string(sa.size()) + " dims");
      DeviceVector<uint8_t> y(static_cast<std::size_t>(g.numel(0)), 7), want = y;
      kernels::compare_forward_cpu(g, op, a.data(), b.data(), want.data());
      kernels::compare_forward_cuda(g, op, a.data(), b.data(), y.data(), nullptr);
      expect_same_bits(y, want, "y");
      for (uint8_t v : y) ASSERT_LE(v, 1);
    }
  }
}

TYPED_TEST(CompareEmulated, ScalarComparisonsMatchTheCpu) {
  using T = TypeParam;
  const int64_t n = 3 * 256 + 5;
  const auto x = compare_values<T>(n, 3);
  for (double s : {0.0, -1.0, 0.5, static_cast<double>(NAN)}) {
    kernels::CompareScalar c;
    c.f = static_cast<float>(s);
    c.d = s;
    c.integral = std::floor(s) == s;
    c.i = c.integral ? static_cast<int64_t>(s) : 0;
    for (CompareOp op : kOps) {
      SCOPED_TRACE("s " + std::to_string(s) + ", op " + std::to_string(static_cast<int>(op)));
      DeviceVector<uint8_t> y(static_cast<std::size_t>(n), 7), want = y;
      kernels::compare_scalar_cpu(op, x.data(), c, want.data(), n);
      kernels::compare_scalar_cuda(op, x.data(), c, y.data(), n, nullptr);
      expect_same_bits(y, want, "y");
    }
  }
}

TYPED_TEST(CompareEmulated, BoolToMatchesTheCpu) {
  using T = TypeParam;
  const DeviceVector<uint8_t> x = {0, 1, 1, 0, 1};
  DeviceVector<T> y(5), want(5);
  kernels::bool_to_cpu(x.data(), want.data(), 5);
  kernels::bool_to_cuda(x.data(), y.data(), 5, nullptr);
  expect_same_bits(y, want, "y");
  for (std::size_t i = 0; i < 5; ++i) EXPECT_EQ(kernels::compare_value(y[i]), x[i] != 0 ? 1 : 0) << i;
}

// IEEE 754 against NaN, infinities and signed zeros, written out.
TEST(CompareRulesEmulated, NanInfinityAndSignedZeroCompareAsIeee) {
  const DeviceVector<float> a = {NAN, NAN, 1.0f, -0.0f, INFINITY, -INFINITY};
  const DeviceVector<float> b = {NAN, 1.0f, NAN, 0.0f, INFINITY, 1.0f};
  const Dims shape = {6};
  const NaryGeometry g = geometry({shape, shape});
  const std::vector<std::pair<CompareOp, std::vector<uint8_t>>> want = {
      {CompareOp::eq, {0, 0, 0, 1, 1, 0}},          {CompareOp::ne, {1, 1, 1, 0, 0, 1}},
      {CompareOp::lt, {0, 0, 0, 0, 0, 1}},          {CompareOp::le, {0, 0, 0, 1, 1, 1}},
      {CompareOp::gt, {0, 0, 0, 0, 0, 0}},          {CompareOp::ge, {0, 0, 0, 1, 1, 0}},
      {CompareOp::logical_and, {1, 1, 1, 0, 1, 1}}, {CompareOp::logical_xor, {0, 0, 0, 0, 0, 0}}};
  for (const auto& [op, expected] : want) {
    DeviceVector<uint8_t> y(6, 7);
    kernels::compare_forward_cuda(g, op, a.data(), b.data(), y.data(), nullptr);
    EXPECT_EQ(on_host(y), expected) << "op " << static_cast<int>(op);
  }
}

// Every element size, with tensors and with a scalar for a or b, in broadcast shapes.
template <typename E>
void expect_where_matches_the_cpu() {
  const std::vector<std::vector<Dims>> shapes = {
      {{3, 257}, {3, 257}, {3, 257}}, {{3, 1}, {1, 5}, {5}}, {{2, 1, 4, 1}, {3, 1, 6}, {2, 3, 4, 6}}, {{}, {2, 3}, {}}};
  for (const auto& s : shapes) {
    const NaryGeometry g = geometry(s);
    DeviceVector<uint8_t> cond(static_cast<std::size_t>(g.numel(1)));
    for (std::size_t i = 0; i < cond.size(); ++i) cond[i] = (i * 7 + 3) % 5 < 2;
    DeviceVector<E> a(static_cast<std::size_t>(g.numel(2))), b(static_cast<std::size_t>(g.numel(3)));
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<E>(i + 1);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<E>(1000 + i);
    for (int form = 0; form < 3; ++form) {  // tensors, a scalar a, a scalar b
      SCOPED_TRACE("form " + std::to_string(form) + ", cond of " + std::to_string(s[0].size()) + " dims");
      const E* ap = form == 1 ? nullptr : a.data();
      const E* bp = form == 2 ? nullptr : b.data();
      DeviceVector<E> y(static_cast<std::size_t>(g.numel(0)), E(7)), want = y;
      kernels::where_forward_cpu(g, cond.data(), ap, bp, E(99), want.data());
      kernels::where_forward_cuda(g, cond.data(), ap, bp, E(99), y.data(), nullptr);
      expect_same_bits(y, want, "y");
    }
  }
}

TEST(WhereEmulated, ForwardMatchesTheCpuForEveryElementSize) {
  expect_where_matches_the_cpu<uint8_t>();
  expect_where_matches_the_cpu<uint16_t>();
  expect_where_matches_the_cpu<uint32_t>();
  expect_where_matches_the_cpu<uint64_t>();
}

// cond [2, 1, 3] selecting between a [4, 1] and b [2, 4, 3]: a's gradient sums over 2 and 3 elements.
TEST(WhereEmulated, ForwardSelectsAsWrittenOut) {
  const NaryGeometry g = geometry({{2, 1, 3}, {4, 1}, {2, 4, 3}});
  const DeviceVector<uint8_t> cond = {1, 0, 1, 0, 0, 1};
  const DeviceVector<uint32_t> a = {10, 20, 30, 40};
  DeviceVector<uint32_t> b(24);
  for (std::size_t i = 0; i < 24; ++i) b[i] = static_cast<uint32_t>(100 + i);
  DeviceVector<uint32_t> y(24);
  kernels::where_forward_cuda(g, cond.data(), a.data(), b.data(), 0u, y.data(), nullptr);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t c = 0; c < 3; ++c) {
        const std::size_t o = static_cast<std::size_t>((i * 4 + r) * 3 + c);
        EXPECT_EQ(y[o], cond[static_cast<std::size_t>(i * 3 + c)] ? a[static_cast<std::size_t>(r)] : b[o]) << o;
      }
}

template <typename T>
class WhereGradEmulated : public ::testing::Test {};
TYPED_TEST_SUITE(WhereGradEmulated, StorageTypes, StorageTypeName);

TYPED_TEST(WhereGradEmulated, BackwardMatchesTheCpu) {
  using T = TypeParam;
  const std::vector<std::vector<Dims>> shapes = {{{3, 257}, {3, 257}, {3, 257}},
                                                 {{3, 1}, {1, 5}, {5}},
                                                 {{2, 1, 4, 1}, {3, 1, 6}, {2, 3, 4, 6}},
                                                 {{5, 67}, {67}, {5, 1}}};
  for (const auto& s : shapes) {
    const NaryGeometry g = geometry(s);
    DeviceVector<uint8_t> cond(static_cast<std::size_t>(g.numel(1)));
    for (std::size_t i = 0; i < cond.size(); ++i) cond[i] = (i * 7 + 3) % 5 < 2;
    auto dy_values = random_values(g.numel(0), -2, 2, 4);
    for (std::size_t i = 0; i < dy_values.size(); i += 3) dy_values[i] = -0.0f;  // a term whose sum from 0 is +0
    const auto dy = stored_as<T>(dy_values);
    for (int operand = 1; operand <= 2; ++operand)
      for (float beta : {0.0f, 1.0f}) {
        SCOPED_TRACE("operand " + std::to_string(operand) + ", beta " + std::to_string(beta));
        const auto n = static_cast<std::size_t>(g.numel(1 + operand));
        DeviceVector<T> dx = beta == 0.0f ? DeviceVector<T>(n, from_f32<T>(kNaN))
                                          : stored_as<T>(random_values(static_cast<int64_t>(n), -1, 1, 5));
        DeviceVector<T> want = dx;
        kernels::where_backward_cpu(g, operand, cond.data(), dy.data(), beta, want.data());
        kernels::where_backward_cuda(g, operand, cond.data(), dy.data(), beta, dx.data(), nullptr);
        expect_same_bits(dx, want, "dx");
      }
  }
}

// b [5, 1] under [5, 67]: each element's gradient is its row's sum of dy where cond is false.
TEST(WhereEmulated, BroadcastGradientIsTheSelectedSum) {
  const NaryGeometry g = geometry({{67}, {5, 67}, {5, 1}});
  DeviceVector<uint8_t> cond(67);
  for (std::size_t i = 0; i < 67; ++i) cond[i] = i % 3 == 0;
  const auto dy = random_values(5 * 67, -2, 2, 6);
  DeviceVector<float> db(5, kNaN);
  kernels::where_backward_cuda(g, 2, cond.data(), dy.data(), 0.0f, db.data(), nullptr);
  std::vector<double> want(5, 0.0);
  for (std::size_t r = 0; r < 5; ++r)
    for (std::size_t c = 0; c < 67; ++c)
      if (!cond[c]) want[r] += dy[r * 67 + c];
  expect_close(db, want, "db");
}

template <typename E>
void expect_triangle_matches_the_cpu() {
  for (const kernels::Triangle& t : {kernels::Triangle{3, 5, 7, 0, false}, kernels::Triangle{2, 9, 4, -2, true},
                                     kernels::Triangle{1, 40, 40, 3, false}, kernels::Triangle{4, 6, 6, 9, true}}) {
    const int64_t n = t.batch * t.rows * t.cols;
    DeviceVector<E> x(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<E>(i + 1);
    DeviceVector<E> y(x.size(), E(7)), want = y;
    kernels::triangle_forward_cpu(t, x.data(), want.data());
    kernels::triangle_forward_cuda(t, x.data(), y.data(), nullptr);
    expect_same_bits(y, want, "y");
  }
}

TEST(TriangleEmulated, ForwardMatchesTheCpuForEveryElementSize) {
  expect_triangle_matches_the_cpu<uint8_t>();
  expect_triangle_matches_the_cpu<uint16_t>();
  expect_triangle_matches_the_cpu<uint32_t>();
  expect_triangle_matches_the_cpu<uint64_t>();
}

TEST(TriangleEmulated, TrilKeepsTheLowerTriangleAsWrittenOut) {
  const kernels::Triangle t{1, 3, 4, 1, false};  // c - r <= 1
  const DeviceVector<uint32_t> x = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  DeviceVector<uint32_t> y(12);
  kernels::triangle_forward_cuda(t, x.data(), y.data(), nullptr);
  EXPECT_EQ(on_host(y), (std::vector<uint32_t>{1, 2, 0, 0, 5, 6, 7, 0, 9, 10, 11, 12}));
}

TYPED_TEST(WhereGradEmulated, TriangleBackwardMatchesTheCpu) {
  using T = TypeParam;
  const kernels::Triangle t{3, 17, 19, -1, true};
  const int64_t n = t.batch * t.rows * t.cols;
  const auto dy = stored_as<T>(random_values(n, -2, 2, 7));
  for (float beta : {0.0f, 1.0f}) {
    DeviceVector<T> dx = beta == 0.0f ? DeviceVector<T>(static_cast<std::size_t>(n), from_f32<T>(kNaN))
                                      : stored_as<T>(random_values(n, -1, 1, 8));
    DeviceVector<T> want = dx;
    kernels::triangle_backward_cpu(t, dy.data(), beta, want.data());
    kernels::triangle_backward_cuda(t, dy.data(), beta, dx.data(), nullptr);
    expect_same_bits(dx, want, "dx, beta " + std::to_string(beta));
  }
}

template <typename T>
void expect_arange_matches_the_cpu(const kernels::Arange& a, int64_t n) {
  DeviceVector<T> y(static_cast<std::size_t>(n)), want = y;
  kernels::arange_cpu(a, want.data(), n);
  kernels::arange_cuda(a, y.data(), n, nullptr);
  expect_same_bits(y, want, "arange");
}

TEST(ArangeEmulated, MatchesTheCpuInEveryDtype) {
  kernels::Arange a;
  a.start = -3.0;
  a.step = 0.1;
  a.istart = -3;
  a.istep = 7;
  expect_arange_matches_the_cpu<float>(a, 1000);
  expect_arange_matches_the_cpu<BFloat16>(a, 1000);
  expect_arange_matches_the_cpu<Half>(a, 1000);
  expect_arange_matches_the_cpu<int32_t>(a, 1000);
  expect_arange_matches_the_cpu<int64_t>(a, 1000);
  DeviceVector<int64_t> y(4);
  kernels::arange_cuda(a, y.data(), 4, nullptr);
  EXPECT_EQ(on_host(y), (std::vector<int64_t>{-3, 4, 11, 18}));
  DeviceVector<float> f(3);
  kernels::arange_cuda(a, f.data(), 3, nullptr);
  EXPECT_EQ(on_host(f), (std::vector<float>{-3.0f, static_cast<float>(-3.0 + 0.1), static_cast<float>(-3.0 + 0.2)}));
}

}  // namespace
}  // namespace cumulus::testing
