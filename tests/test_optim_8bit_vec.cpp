// The 8-bit updates' vector code (Note [Vector 8-bit update] in kernels/cpu/optim_8bit_blocks.h)
// against the scalar loop, bit for bit: weights, codes, scales and missed counts after two updates
// from random states (zero blocks, huge and tiny scales, frozen chunks, chunks behind the
// optimizer's count, a partial last block, negative zeros, NaN and infinite gradients), values
// placed on and beside every decision boundary of both maps (Note [Nearest code by exponent]), and
// thread counts 1 and 2. Each width the CPU runs is compared; one it lacks is skipped, said so.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cumulus/core/error.h"
#include "cumulus/core/threads.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/optim_8bit_blocks.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/optim_rules.h"
#include "kernels/quantized_state.h"

namespace cumulus {
namespace {

using kernels::CpuCode;
using kernels::DynamicMap;
using kernels::FrozenChunks;
using kernels::QuantizedState;
constexpr int64_t kBlock = QuantizedState::kBlock;

// The raw bits of a float array: -0 against 0 and NaN payloads count as differences.
std::vector<uint32_t> bits(const std::vector<float>& x) {
  std::vector<uint32_t> out(x.size());
  std::memcpy(out.data(), x.data(), x.size() * sizeof(float));
  return out;
}

// One update's inputs and everything it writes: the weights, a gradient, two quantized states
// (SGD's momentum uses the first) and the frozen mask with its missed counts.
struct Arrays {
  std::vector<float> w, g, absmax_a, absmax_b;
  std::vector<uint8_t> codes_a, codes_b, mask;
  std::vector<int32_t> missed;

  explicit Arrays(int64_t n)
      : w(n),
        g(n),
        absmax_a(blocks(n)),
        absmax_b(blocks(n)),
        codes_a(n),
        codes_b(n),
        mask(blocks(n)),
        missed(blocks(n)) {}
  static int64_t blocks(int64_t n) { return (n + kBlock - 1) / kBlock; }
  int64_t n() const { return static_cast<int64_t>(w.size()); }
  QuantizedState a() { return {codes_a.data(), absmax_a.data()}; }
  QuantizedState b() { return {codes_b.data(), absmax_b.data()}; }
  FrozenChunks frozen(bool with_mask) { return with_mask ? FrozenChunks{mask.data(), missed.data()} : FrozenChunks{}; }
};

// The first index where two arrays differ, or -1: a failure names one element, not the arrays.
template <typename T>
int64_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  return -1;
}

void expect_same_bits(const Arrays& got, const Arrays& want, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(first_difference(bits(got.w), bits(want.w)), -1) << "weights";
  EXPECT_EQ(first_difference(got.codes_a, want.codes_a), -1) << "codes a";
  EXPECT_EQ(first_difference(bits(got.absmax_a), bits(want.absmax_a)), -1) << "scales a";
  EXPECT_EQ(first_difference(got.codes_b, want.codes_b), -1) << "codes b";
  EXPECT_EQ(first_difference(bits(got.absmax_b), bits(want.absmax_b)), -1) << "scales b";
  EXPECT_EQ(got.missed, want.missed);
}

// A block scale of every kind: zero (an all-zero block), ordinary, huge, tiny and subnormal.
float block_scale(std::mt19937& rng) {
  const float kinds[] = {0.0f, 1e30f, 1e-30f, 1e-40f};
  const int kind = static_cast<int>(rng() % 8);
  if (kind < 4) return kinds[kind];
  return std::ldexp(std::uniform_real_distribution<float>(0.5f, 1.0f)(rng), static_cast<int>(rng() % 30) - 20);
}

// A gradient value: mostly ordinary, some negative zeros, huge and tiny; `special` adds NaN and inf.
float gradient_value(std::mt19937& rng, bool special) {
  const int kind = static_cast<int>(rng() % 64);
  if (kind == 0) return -0.0f;
  if (kind == 1) return 1e25f;
  if (kind == 2) return -1e-35f;
  if (special && kind == 3) return std::numeric_limits<float>::quiet_NaN();
  if (special && kind == 4) return -std::numeric_limits<float>::infinity();
  return std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
}

// Random states over n elements: every fifth block frozen, every seventh behind the optimizer's
// count (one of them at its first update), NaN and inf gradients only in the blocks `special` picks.
Arrays random_arrays(int64_t n, uint64_t seed, bool special) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  Arrays x(n);
  for (int64_t i = 0; i < n; ++i) {
    const bool special_block = special && (i / kBlock) % 11 == 3;
    x.w[i] = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
    x.g[i] = gradient_value(rng, special_block);
    x.codes_a[i] = static_cast<uint8_t>(rng());
    x.codes_b[i] = static_cast<uint8_t>(rng());
  }
  for (int64_t c = 0; c < Arrays::blocks(n); ++c) {
    x.absmax_a[c] = block_scale(rng);
    x.absmax_b[c] = block_scale(rng);
    x.mask[c] = c % 5 == 1;
    x.missed[c] = c % 7 == 2 ? static_cast<int32_t>(c % 3 + 1) : 0;
  }
  return x;
}

bool runs(CpuCode code) {
  if (code == CpuCode::avx512) return kernels::vec512::available();
  if (code == CpuCode::avx2) return kernels::vec::available();
  return true;
}

const char* name(CpuCode code) {
  return code == CpuCode::avx512   ? "avx512"
         : code == CpuCode::avx2   ? "avx2"
         : code == CpuCode::scalar ? "scalar"
                                   : "best";
}

struct AdamWSettings {
  float grad_scale = 0.5f, lr = 0.01f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.1f;
};
struct SgdSettings {
  float grad_scale = 0.5f, lr = 0.02f, momentum = 0.9f, dampening = 0.1f, weight_decay = 0.01f;
  bool nesterov = true;
};

void adamw_updates(Arrays& x, CpuCode code, bool with_mask, const AdamWSettings& s, std::vector<int64_t> updates) {
  for (int64_t t : updates)
    kernels::adamw_step_8bit_cpu(x.w.data(), x.g.data(), x.a(), x.b(), x.n(), s.grad_scale, s.lr, s.beta1, s.beta2,
                                 s.eps, s.weight_decay, t, x.frozen(with_mask), code);
}

void sgd_updates(Arrays& x, CpuCode code, bool with_mask, const SgdSettings& s, std::vector<int64_t> updates) {
  for (int64_t t : updates)
    kernels::sgd_step_8bit_cpu(x.w.data(), x.g.data(), x.a(), x.n(), s.grad_scale, s.lr, s.momentum, s.dampening,
                               s.nesterov, s.weight_decay, t, x.frozen(with_mask), code);
}

constexpr CpuCode kVectorCodes[] = {CpuCode::avx512, CpuCode::avx2};

// 40 whole blocks and a partial one of 37, with and without the frozen mask, from updates 5 and 6
// and from the first two (SGD's first sets the buffer to the gradient).
TEST(Optimizer8BitVector, RandomStatesGiveTheScalarLoopsBits) {
  const int64_t n = 40 * kBlock + 37;
  for (CpuCode code : kVectorCodes) {
    if (!runs(code)) {
      std::printf("    %s: not run on this CPU, skipped\n", name(code));
      continue;
    }
    for (bool with_mask : {false, true})
      for (bool special : {false, true})
        for (std::vector<int64_t> updates : {std::vector<int64_t>{5, 6}, std::vector<int64_t>{1, 2}}) {
          const std::string what = std::string(name(code)) + (with_mask ? " frozen" : "") +
                                   (special ? " nan/inf" : "") + " from update " + std::to_string(updates[0]);
          const Arrays initial = random_arrays(n, 11 + updates[0], special);
          Arrays scalar = initial, vector = initial;
          adamw_updates(scalar, CpuCode::scalar, with_mask, {}, updates);
          adamw_updates(vector, code, with_mask, {}, updates);
          expect_same_bits(vector, scalar, "adamw " + what);
          EXPECT_NE(scalar.codes_b, initial.codes_b) << "the update changed the state";
          scalar = initial;
          vector = initial;
          sgd_updates(scalar, CpuCode::scalar, with_mask, {}, updates);
          sgd_updates(vector, code, with_mask, {}, updates);
          expect_same_bits(vector, scalar, "sgd " + what);
          EXPECT_NE(scalar.codes_a, initial.codes_a) << "the update changed the state";
        }
  }
}

DynamicMap map_of(bool is_signed) {
  DynamicMap map{};
  for (int code = 0; code < DynamicMap::kCodes; ++code) kernels::rules::fill_dynamic_map_entry(map, code, is_signed);
  return map;
}

// Values on and 1-3 ulps beside every midpoint of `map` and every bucket start of the vector index
// (2^e (1 + k / 256) down to 2^-27), each sign, packed 63 a block after a first element of
// magnitude 1 that fixes the block's absmax at 1, so that |x| / absmax is the value itself.
std::vector<float> boundary_values(const DynamicMap& map) {
  std::vector<float> targets;
  for (int k = 0; k + 1 < map.magnitudes; ++k) targets.push_back(map.midpoints[k]);
  for (int e = -27; e < 0; ++e)
    for (int k = 0; k < 256; ++k) targets.push_back(std::ldexp(1.0f + k / 256.0f, e));
  std::vector<float> values;
  for (float t : targets)
    for (int step = -3; step <= 3; ++step) {
      float v = t;
      for (int s = 0; s < std::abs(step); ++s) v = std::nextafter(v, step < 0 ? 0.0f : 2.0f);
      values.push_back(v);
      values.push_back(-v);
    }
  std::vector<float> blocks;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (blocks.size() % kBlock == 0) blocks.push_back(blocks.size() % (2 * kBlock) == 0 ? 1.0f : -1.0f);
    blocks.push_back(values[i]);
  }
  while (blocks.size() % kBlock != 0) blocks.push_back(0.5f);
  return blocks;
}

// The first update from a zero state with beta1 = beta2 = 0 and no decay makes AdamW's m the
// gradient itself and v its square, and SGD's first update makes its buffer the gradient: the
// values reach the quantizer unchanged (m, momentum) or within a rounding of the square (v).
TEST(Optimizer8BitVector, EveryDecisionBoundaryGivesTheScalarCode) {
  const std::vector<float> signed_values = boundary_values(map_of(true));
  std::vector<float> roots = boundary_values(map_of(false));
  for (float& r : roots) r = std::copysign(std::sqrt(std::abs(r)), r);  // v = g g lands on the unsigned targets
  AdamWSettings adamw;
  adamw.grad_scale = 1.0f;
  adamw.beta1 = adamw.beta2 = adamw.weight_decay = 0.0f;
  SgdSettings sgd;
  sgd.grad_scale = 1.0f;
  sgd.weight_decay = 0.0f;
  for (CpuCode code : kVectorCodes) {
    if (!runs(code)) continue;
    for (const std::vector<float>* grads : {&signed_values, static_cast<const std::vector<float>*>(&roots)}) {
      Arrays initial(static_cast<int64_t>(grads->size()));
      initial.g = *grads;
      Arrays scalar = initial, vector = initial;
      adamw_updates(scalar, CpuCode::scalar, false, adamw, {1});
      adamw_updates(vector, code, false, adamw, {1});
      expect_same_bits(vector, scalar, std::string("adamw ") + name(code));
      scalar = initial;
      vector = initial;
      sgd_updates(scalar, CpuCode::scalar, false, sgd, {1});
      sgd_updates(vector, code, false, sgd, {1});
      expect_same_bits(vector, scalar, std::string("sgd ") + name(code));
    }
    // The signed values reached the quantizer exactly: each code is rules::quantize's.
    Arrays direct(static_cast<int64_t>(signed_values.size()));
    direct.g = signed_values;
    sgd_updates(direct, code, false, sgd, {1});
    const DynamicMap map = map_of(true);
    for (std::size_t i = 0; i < signed_values.size(); ++i)
      ASSERT_EQ(direct.codes_a[i], kernels::rules::quantize(signed_values[i], direct.absmax_a[i / kBlock], map))
          << name(code) << " value " << signed_values[i];
  }
}

// Three thread chunks and a partial block: one thread and two give the same bits, the vector
// code's and the scalar loop's.
TEST(Optimizer8BitVector, OneAndTwoThreadsGiveTheSameBits) {
  const int64_t n = 3 * 256 * kBlock + 37;
  const int threads_before = cpu_threads();
  const Arrays initial = random_arrays(n, 3, false);
  std::vector<Arrays> results;
  for (int threads : {1, 2}) {
    set_cpu_threads(threads);
    for (CpuCode code : {CpuCode::best, CpuCode::scalar}) {
      Arrays x = initial;
      adamw_updates(x, code, true, {}, {5, 6});
      sgd_updates(x, code, true, {}, {5, 6});
      results.push_back(x);
    }
  }
  set_cpu_threads(threads_before);
  for (std::size_t r = 1; r < results.size(); ++r) expect_same_bits(results[r], results[0], "run " + std::to_string(r));
}

TEST(Optimizer8BitVector, AWidthTheCpuDoesNotRunIsRefused) {
  Arrays x(kBlock);
  for (CpuCode code : kVectorCodes) {
    if (runs(code)) continue;
    EXPECT_THROW(sgd_updates(x, code, false, {}, {1}), InvalidArgument) << name(code);
  }
  EXPECT_NO_THROW(sgd_updates(x, CpuCode::scalar, false, {}, {1}));
}

}  // namespace
}  // namespace cumulus

namespace cumulus {
namespace {

// The f32 updates (kernels/cpu/optim_dense_vec.h at the widest code the CPU runs under this
// binary's capability cap) against kernels/optim_rules.h's scalar rules applied element by element,
// bit for bit: lengths with a tail shorter than a vector, NaN, infinite and -0 gradients, two updates.
TEST(F32VectorUpdate, GivesTheScalarRulesBits) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (const int64_t n : {int64_t{7}, int64_t{1000}, int64_t{4099}}) {
    std::vector<float> w(n), g(n), m(n), v(n);
    for (int64_t i = 0; i < n; ++i) {
      w[i] = u(rng), g[i] = u(rng), m[i] = 0.1f * u(rng), v[i] = std::fabs(u(rng));
      if (i % 97 == 5) g[i] = i % 2 ? -0.0f : std::numeric_limits<float>::infinity();
      if (i % 211 == 9) g[i] = std::numeric_limits<float>::quiet_NaN();
    }
    std::vector<float> w2 = w, m2 = m, v2 = v, w3 = w, buf3 = m, w4 = w, buf4 = m;
    for (int64_t t = 1; t <= 2; ++t) {
      kernels::adamw_step_cpu(w.data(), g.data(), m.data(), v.data(), n, 0.5f, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t, {});
      float step_size, bc2_sqrt;
      kernels::rules::adamw_constants(1e-2f, 0.9f, 0.95f, t, step_size, bc2_sqrt);
      for (int64_t i = 0; i < n; ++i)
        kernels::rules::adamw(w2[i], g[i], m2[i], v2[i], 0.5f, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step_size, bc2_sqrt);
      kernels::sgd_step_cpu(w3.data(), g.data(), buf3.data(), n, 0.5f, 0.05f, 0.9f, 0.1f, true, 0.01f, t, {});
      for (int64_t i = 0; i < n; ++i)
        kernels::rules::sgd(w4[i], g[i], &buf4[i], 0.5f, 0.05f, 0.9f, 0.1f, true, 0.01f, t == 1);
    }
    EXPECT_EQ(bits(w), bits(w2)) << "AdamW weights, n " << n;
    EXPECT_EQ(bits(m), bits(m2)) << "AdamW m, n " << n;
    EXPECT_EQ(bits(v), bits(v2)) << "AdamW v, n " << n;
    EXPECT_EQ(bits(w3), bits(w4)) << "SGD weights, n " << n;
    EXPECT_EQ(bits(buf3), bits(buf4)) << "SGD momentum, n " << n;
  }
}

// sum_squares_cpu against its definition (kSquareLanes partial sums in double, element i in lane i
// mod kSquareLanes, each in order, then the lanes in order), bit for bit, and the vector loop called
// directly where the CPU runs it: values of many magnitudes, one in sixteen 2^40 or -2^40 (its
// square swallows the small ones until another cancels it), so a change of order shows.
TEST(F32VectorUpdate, SumOfSquaresGivesItsDefinitionsBits) {
  constexpr int kLanes = kernels::kSquareLanes;
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> mantissa(-2.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-30, 30), pick(0, 15);
  for (const int64_t n :
       {int64_t{0}, int64_t{7}, int64_t{31}, int64_t{32}, int64_t{33}, int64_t{1000}, int64_t{4099}}) {
    std::vector<float> x(static_cast<std::size_t>(n));
    for (float& e : x) {
      const int p = pick(rng);
      e = p == 0 ? 1.099511627776e12f : p == 1 ? -1.099511627776e12f : std::ldexp(mantissa(rng), exponent(rng));
    }
    double lane[kLanes] = {};
    for (int64_t i = 0; i < n; ++i) lane[i % kLanes] += static_cast<double>(x[i]) * x[i];
    double want = 0.0;
    for (double v : lane) want += v;
    const auto bits64 = [](double v) {
      uint64_t b;
      std::memcpy(&b, &v, sizeof b);
      return b;
    };
    EXPECT_EQ(bits64(kernels::sum_squares_cpu(x.data(), n)), bits64(want)) << "n " << n;
    if (!kernels::vec::available()) continue;  // no AVX2 here, or the capability cap excludes it
    double got[kLanes];
    const int64_t done = kernels::vec::sum_squares_f32_vectors(x.data(), n, got);
    ASSERT_EQ(done, n / kLanes * kLanes);
    for (int64_t i = done; i < n; ++i) got[i % kLanes] += static_cast<double>(x[i]) * x[i];
    for (int k = 0; k < kLanes; ++k) EXPECT_EQ(bits64(got[k]), bits64(lane[k])) << "lane " << k << " n " << n;
  }
}

}  // namespace
}  // namespace cumulus
