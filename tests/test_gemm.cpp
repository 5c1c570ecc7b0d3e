// The CPU GEMM (kernels/cpu/gemm.cpp): OpenBLAS split across the kernel threads, and the few-row
// products that run without it (kernels/cpu/gemm_few_rows.h). tests/CMakeLists.txt runs this binary
// again under CUMULUS_CPU_CAPABILITY=avx2 and scalar, so gemm_cpu takes each path on one machine.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <iterator>
#include <vector>

#include "cumulus/core/threads.h"
#include "cumulus/tensor/random.h"
#include "kernels/cpu/gemm_few_rows.h"
#include "kernels/cpu/kernels.h"

namespace cumulus {
namespace {

// Note [One pool for the kernels and the BLAS]: a GEMM split into bands of rows or columns across
// threads gives the bits of one thread (of one call, but for a few rows under Haswell's kernels), for every transpose,
// beta 0 and 1, sums over k longer than OpenBLAS's blocks of k, and sizes that are not multiples of the bands'
// alignment.
std::vector<float> gemm_at(int threads, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float beta) {
  set_cpu_threads(threads);
  Generator gen(static_cast<uint64_t>(m * 131 + n * 7 + k));
  std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n)),
      c(static_cast<std::size_t>(m * n));
  gen.fill_uniform(a.data(), m * k, -1.0f, 1.0f);
  gen.fill_uniform(b.data(), k * n, -1.0f, 1.0f);
  gen.fill_uniform(c.data(), m * n, -1.0f, 1.0f);
  kernels::gemm_cpu(ta, tb, m, n, k, 0.7f, a.data(), ta ? m : k, b.data(), tb ? k : n, beta, c.data(), n);
  return c;
}

struct Shape3 {
  int64_t m, n, k;
};

TEST(GemmCpu, BandsGiveTheBitsOfOneCall) {
  const int threads = cpu_threads();
  for (const Shape3 s : {Shape3{512, 384, 128}, Shape3{384, 128, 512}, Shape3{512, 128, 1500}, Shape3{37, 2050, 300},
                         Shape3{1000, 65, 128}, Shape3{333, 333, 777}, Shape3{64, 4096, 33}, Shape3{16, 784, 512},
                         Shape3{16, 512, 784}, Shape3{8, 300, 64}})
    for (int trans = 0; trans < 4; ++trans)
      for (float beta : {0.0f, 1.0f}) {
        const bool ta = trans & 1, tb = trans & 2;
        const std::vector<float> one = gemm_at(1, ta, tb, s.m, s.n, s.k, beta);
        EXPECT_EQ(one, gemm_at(2, ta, tb, s.m, s.n, s.k, beta)) << s.m << "x" << s.n << "x" << s.k << " " << trans;
        EXPECT_EQ(one, gemm_at(3, ta, tb, s.m, s.n, s.k, beta)) << s.m << "x" << s.n << "x" << s.k << " " << trans;
      }
  set_cpu_threads(threads);
}

struct Product {
  bool ta, tb;
  int64_t m, n, k;
  float alpha, beta;
  std::vector<float> a, b, c;  // c: C before the product
  int64_t lda() const { return ta ? m : k; }
  int64_t ldb() const { return tb ? k : n; }
  float op_a(int64_t i, int64_t p) const { return ta ? a[p * m + i] : a[i * k + p]; }
  float op_b(int64_t p, int64_t j) const { return tb ? b[j * k + p] : b[p * n + j]; }
};

Product product(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, float beta) {
  Product x{ta, tb, m, n, k, alpha, beta, {}, {}, {}};
  Generator gen(static_cast<uint64_t>(m * 1000003 + n * 1009 + k));
  x.a.resize(static_cast<std::size_t>(m * k));
  x.b.resize(static_cast<std::size_t>(k * n));
  x.c.resize(static_cast<std::size_t>(m * n));
  gen.fill_uniform(x.a.data(), m * k, -1.0f, 1.0f);
  gen.fill_uniform(x.b.data(), k * n, -1.0f, 1.0f);
  gen.fill_uniform(x.c.data(), m * n, -1.0f, 1.0f);
  return x;
}

// Note [Products of few rows]'s definition, element by element: one fused multiply-add chain over k
// in order from zero, then alpha * acc (+ beta * c). (This file is compiled for the baseline ISA,
// which has no fused multiply-add for the compiler to contract the last line into.)
std::vector<float> definition(const Product& x) {
  std::vector<float> c = x.c;
  for (int64_t i = 0; i < x.m; ++i)
    for (int64_t j = 0; j < x.n; ++j) {
      float acc = 0.0f;
      for (int64_t p = 0; p < x.k; ++p) acc = std::fma(x.op_a(i, p), x.op_b(p, j), acc);
      const float scaled = x.alpha * acc;
      float& out = c[static_cast<std::size_t>(i * x.n + j)];
      out = x.beta == 0.0f ? scaled : scaled + x.beta * out;
    }
  return c;
}

// The product in double, to show the definition is the product (within the chains' rounding).
double max_error_against_double(const Product& x, const std::vector<float>& c) {
  double worst = 0;
  for (int64_t i = 0; i < x.m; ++i)
    for (int64_t j = 0; j < x.n; ++j) {
      double sum = 0, scale = 0;
      for (int64_t p = 0; p < x.k; ++p) {
        sum += static_cast<double>(x.op_a(i, p)) * x.op_b(p, j);
        scale += std::fabs(static_cast<double>(x.op_a(i, p)) * x.op_b(p, j));
      }
      const std::size_t e = static_cast<std::size_t>(i * x.n + j);
      const double want = x.alpha * sum + (x.beta == 0.0f ? 0.0 : x.beta * static_cast<double>(x.c[e]));
      worst = std::max(worst, std::fabs(c[e] - want) / (std::fabs(x.alpha) * scale + 1.0));
    }
  return worst;
}

// Products gemm_cpu computes by the few-row loops (gemm_few_rows.cpp's rule: those of 16 rows for
// every transpose, the others where op(B) is transposed): rows of one to four lane blocks (the last
// partial), columns past the AVX2 and AVX-512 blocks (6 and 8) by a tail, depths not a multiple of
// the packing's 8.
const Shape3 kFewRowShapes[] = {{12, 45, 33}, {16, 512, 784}, {16, 784, 512}, {13, 100, 300}, {29, 71, 64},
                                {32, 40, 20}, {16, 37, 19},   {64, 70, 50},   {45, 33, 17}};
// And what the loops take when called directly: any rows up to four blocks.
const Shape3 kAnyFewRowShapes[] = {{1, 32, 16}, {5, 45, 33}, {17, 100, 300}, {8, 300, 64}, {32, 9, 3}, {50, 40, 24}};

// gemm_cpu on whichever path this process takes (the capability cap), at one thread and three.
TEST(GemmFewRows, EachElementIsOneChainOverKInOrder) {
  const int threads = cpu_threads();
  for (const Shape3 s : kFewRowShapes)
    for (int trans = 0; trans < 4; ++trans)
      for (const float beta : {0.0f, 1.0f, -0.5f}) {
        if (!(trans & 2) && s.m != kernels::kFewRowsLanes) continue;  // OpenBLAS's
        const Product x = product(trans & 1, trans & 2, s.m, s.n, s.k, 0.7f, beta);
        const std::vector<float> want = definition(x);
        ASSERT_LT(max_error_against_double(x, want), 1e-6) << "the definition is not the product";
        for (int t : {1, 3}) {
          set_cpu_threads(t);
          std::vector<float> c = x.c;
          kernels::gemm_cpu(x.ta, x.tb, s.m, s.n, s.k, x.alpha, x.a.data(), x.lda(), x.b.data(), x.ldb(), beta,
                            c.data(), s.n);
          EXPECT_EQ(c, want) << s.m << "x" << s.n << "x" << s.k << " trans " << trans << " beta " << beta << ", " << t
                             << " threads";
        }
      }
  set_cpu_threads(threads);
}

// Each vector path this CPU has, called directly (whatever the cap): the same bits as the
// definition, over a range of columns that starts and ends inside blocks.
TEST(GemmFewRows, EveryVectorPathGivesTheDefinitionsBits) {
  struct Path {
    const char* name;
    bool available;
    void (*pack)(const float*, int64_t, int64_t, int64_t, int64_t, float*);
    void (*run)(const kernels::FewRowsPanel&, const kernels::FewRowsOperand&, const kernels::FewRowsOutput&);
  };
  const Path paths[] = {{"avx2", __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"),
                         kernels::vec::pack_few_rows, kernels::vec::few_rows_product},
                        {"avx512", __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma"),
                         kernels::vec512::pack_few_rows, kernels::vec512::few_rows_product}};
  for (const Path& path : paths) {
    if (!path.available) continue;
    for (const auto& shapes : {std::vector<Shape3>(std::begin(kFewRowShapes), std::end(kFewRowShapes)),
                               std::vector<Shape3>(std::begin(kAnyFewRowShapes), std::end(kAnyFewRowShapes))})
      for (const Shape3 s : shapes)
        for (int trans = 0; trans < 4; ++trans) {
          const Product x = product(trans & 1, trans & 2, s.m, s.n, s.k, 1.0f, 1.0f);
          const std::vector<float> want = definition(x);
          std::vector<float> panel(static_cast<std::size_t>(4 * kernels::kFewRowsLanes * s.k), -1.0f), c = x.c;
          path.pack(x.a.data(), s.m, s.k, x.ta ? 1 : x.lda(), x.ta ? x.lda() : 1, panel.data());
          const int64_t begin = s.n / 3, end = s.n - 1;
          path.run({panel.data(), s.m, s.k}, {x.b.data(), x.tb ? 1 : x.ldb(), x.tb ? x.ldb() : 1},
                   {c.data(), s.n, begin, end, 1.0f, 1.0f});
          for (int64_t i = 0; i < s.m; ++i)
            for (int64_t j = 0; j < s.n; ++j) {
              const std::size_t e = static_cast<std::size_t>(i * s.n + j);
              const float expected = j >= begin && j < end ? want[e] : x.c[e];
              ASSERT_EQ(c[e], expected) << path.name << " " << s.m << "x" << s.n << "x" << s.k << " trans " << trans
                                        << " at " << i << ", " << j;
            }
        }
  }
}

}  // namespace
}  // namespace cumulus
