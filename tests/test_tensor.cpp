// Tensors: shapes, dtypes, host round trips, views versus copies, device transfers; the seeded
// generator (reproducible, counter-based, identical on every device) and Linear's initialization.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "cumulus/core/error.h"
#include "cumulus/nn/layers.h"
#include "cumulus/ops/linear.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/shape.h"
#include "cumulus/tensor/random.h"
#include "cumulus/tensor/tensor.h"
#include "test_util.h"

namespace cumulus {
namespace {

using testing::DeviceTest;

std::vector<float> iota_f(std::size_t n, float start = 0.0f, float step = 1.0f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + step * float(i);
  return v;
}

// ---- Shape -----------------------------------------------------------------------------------

TEST(Shape, Basics) {
  Shape scalar;
  EXPECT_EQ(scalar.ndim(), 0);
  EXPECT_EQ(scalar.numel(), 1) << "a 0-d shape is a scalar";
  Shape s{64, 784};
  EXPECT_EQ(s.ndim(), 2);
  EXPECT_EQ(s[0], 64);
  EXPECT_EQ(s[1], 784);
  EXPECT_EQ(s.numel(), 64 * 784);
  EXPECT_EQ(s.str(), "[64, 784]");
  EXPECT_EQ(Shape({2, 3}), Shape({2, 3}));
  EXPECT_NE(Shape({2, 3}), Shape({3, 2}));
  EXPECT_NE(Shape({6}), Shape({6, 1}));
  EXPECT_EQ(Shape({4, 0, 3}).numel(), 0);
  std::vector<int64_t> dims{2, 3, 4, 5};
  Shape from_range(dims.begin(), dims.end());
  EXPECT_EQ(from_range.ndim(), 4);
  EXPECT_EQ(from_range.numel(), 120);
  for (int64_t d : {6, 7, 8, 9}) from_range.push_back(d);
  EXPECT_EQ(from_range.ndim(), 8);
  EXPECT_THROW(from_range.push_back(10), Error) << "at most 8 dimensions";
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::i32), 4u);
  EXPECT_EQ(dtype_size(DType::u8), 1u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_STREQ(dtype_name(DType::bf16), "bf16");
  EXPECT_STREQ(dtype_name(DType::f16), "f16");
  EXPECT_STREQ(dtype_name(DType::f32), "f32");
  EXPECT_STREQ(dtype_name(DType::i32), "i32");
  EXPECT_STREQ(dtype_name(DType::u8), "u8");
}

TEST(DeviceParse, TextForms) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda"), Device::cuda(0));
  EXPECT_EQ(Device::parse("cuda:1"), Device::cuda(1));
  EXPECT_EQ(Device::cuda(2).str(), "cuda:2");
  EXPECT_THROW(Device::parse("gpu"), InvalidArgument);
  EXPECT_THROW(Device::parse("cuda:x"), InvalidArgument);
}

// ---- Tensor, on every device -----------------------------------------------------------------

class TensorTest : public DeviceTest {};

TEST_P(TensorTest, MetadataAndRoundTripF32) {
  const std::vector<float> v = iota_f(24, -3.5f, 0.25f);
  Tensor t = Tensor::from_vector(v, {2, 3, 4}, device());
  ASSERT_TRUE(t.defined());
  EXPECT_EQ(t.shape(), Shape({2, 3, 4}));
  EXPECT_EQ(t.ndim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.dtype(), DType::f32);
  EXPECT_EQ(t.device(), device());
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(2), 4);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.size(-3), 2);
  EXPECT_THROW(t.size(3), Error);
  EXPECT_THROW(t.size(-4), Error);
  EXPECT_EQ(t.to_vector<float>(), v);
  EXPECT_FALSE(t.requires_grad());
  EXPECT_TRUE(t.is_leaf());
  EXPECT_EQ(t.grad_fn(), nullptr);
  EXPECT_THROW(Tensor::from_vector(v, {5, 5}, device()), Error) << "24 values for 25 elements";
  EXPECT_THROW(t.to_vector<int32_t>(), Error) << "dtype is checked";
}

TEST_P(TensorTest, RoundTripI32AndU8) {
  const std::vector<int32_t> vi = {0, -1, 2147483647, -2147483647 - 1, 42, 7};
  Tensor ti = Tensor::from_vector(vi, {2, 3}, device());
  EXPECT_EQ(ti.dtype(), DType::i32);
  EXPECT_EQ(ti.nbytes(), 24u);
  EXPECT_EQ(ti.to_vector<int32_t>(), vi);

  std::vector<uint8_t> vu(256);
  std::iota(vu.begin(), vu.end(), uint8_t(0));
  Tensor tu = Tensor::from_vector(vu, {16, 16}, device());
  EXPECT_EQ(tu.dtype(), DType::u8);
  EXPECT_EQ(tu.nbytes(), 256u);
  EXPECT_EQ(tu.to_vector<uint8_t>(), vu);
  EXPECT_THROW(tu.to_vector<float>(), Error);
  EXPECT_THROW(tu.item(), Error) << "item() needs one f32 element";
}

TEST_P(TensorTest, Factories) {
  Tensor z = Tensor::zeros({3, 5}, DType::f32, device());
  for (float x : z.to_vector<float>()) EXPECT_EQ(x, 0.0f);
  Tensor zi = Tensor::zeros({7}, DType::i32, device());
  for (int32_t x : zi.to_vector<int32_t>()) EXPECT_EQ(x, 0);
  Tensor f = Tensor::full({4, 2}, -2.5f, device());
  EXPECT_EQ(f.dtype(), DType::f32);
  for (float x : f.to_vector<float>()) EXPECT_EQ(x, -2.5f);
  Tensor e = Tensor::empty({2, 2}, DType::u8, device());
  EXPECT_EQ(e.numel(), 4);
  EXPECT_EQ(e.device(), device());
  Tensor s = Tensor::full({}, 3.25f, device());
  EXPECT_EQ(s.ndim(), 0);
  EXPECT_EQ(s.item(), 3.25f);
  EXPECT_THROW(f.item(), Error) << "item() on 8 elements";
  EXPECT_FALSE(Tensor().defined());
  EXPECT_THROW(Tensor().shape(), Error);
}

TEST_P(TensorTest, ReshapeAndFlattenAreViews) {
  const std::vector<float> v = iota_f(24);
  Tensor t = Tensor::from_vector(v, {2, 3, 4}, device());
  Tensor r = t.reshape({4, 6});
  EXPECT_EQ(r.shape(), Shape({4, 6}));
  EXPECT_EQ(r.raw_data(), t.raw_data()) << "reshape shares storage";
  EXPECT_EQ(r.to_vector<float>(), v) << "row-major order is kept";
  Tensor f1 = t.flatten();
  EXPECT_EQ(f1.shape(), Shape({2, 12}));
  EXPECT_EQ(f1.raw_data(), t.raw_data());
  Tensor f0 = t.flatten(0);
  EXPECT_EQ(f0.shape(), Shape({24}));
  Tensor f2 = t.flatten(2);
  EXPECT_EQ(f2.shape(), Shape({2, 3, 4}));
  Tensor ro = ops::reshape(t, {24});
  EXPECT_EQ(ro.raw_data(), t.raw_data());
  Tensor fo = ops::flatten(t, 1);
  EXPECT_EQ(fo.shape(), Shape({2, 12}));

  // A write through the view is seen by the original.
  r.copy_from(Tensor::full({4, 6}, 9.0f, device()));
  for (float x : t.to_vector<float>()) EXPECT_EQ(x, 9.0f);

  EXPECT_THROW(t.flatten(3), ShapeError) << "start_dim is a dimension, as in torch.flatten";
  EXPECT_THROW(t.flatten(-4), ShapeError);
  EXPECT_THROW(t.reshape({5, 5}), ShapeError);
  EXPECT_THROW(t.reshape({25}), ShapeError);
  EXPECT_THROW(ops::reshape(t, {2, 13}), ShapeError);
  try {
    t.reshape({7});
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("reshape"), std::string::npos) << "names the op: " << e.what();
  }
}

TEST_P(TensorTest, CloneCopiesDetachShares) {
  const std::vector<float> v = iota_f(6, 1.0f);
  Tensor t = Tensor::from_vector(v, {2, 3}, device());
  t.set_requires_grad(true);

  Tensor c = t.clone();
  EXPECT_NE(c.raw_data(), t.raw_data()) << "clone is a copy";
  EXPECT_EQ(c.to_vector<float>(), v);
  EXPECT_EQ(c.shape(), t.shape());
  EXPECT_EQ(c.device(), device());
  EXPECT_FALSE(c.requires_grad()) << "clone is outside the graph";
  c.copy_from(Tensor::full({2, 3}, 0.5f, device()));
  EXPECT_EQ(t.to_vector<float>(), v) << "writing the clone leaves the original alone";

  Tensor d = t.detach();
  EXPECT_EQ(d.raw_data(), t.raw_data()) << "detach shares storage";
  EXPECT_FALSE(d.requires_grad());
  EXPECT_EQ(d.grad_fn(), nullptr);
  EXPECT_TRUE(t.requires_grad()) << "the original keeps requiring grad";
  d.copy_from(Tensor::full({2, 3}, 4.0f, device()));
  for (float x : t.to_vector<float>()) EXPECT_EQ(x, 4.0f);

  // A non-leaf: detach drops the grad_fn; set_requires_grad on the non-leaf itself is refused.
  Tensor y = ops::relu(t);
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_FALSE(y.is_leaf());
  Tensor yd = y.detach();
  EXPECT_EQ(yd.grad_fn(), nullptr);
  EXPECT_TRUE(yd.is_leaf());
  EXPECT_EQ(yd.raw_data(), y.raw_data());
  EXPECT_THROW(y.set_requires_grad(false), InvalidArgument);
  Tensor i = Tensor::zeros({3}, DType::i32, device());
  EXPECT_THROW(i.set_requires_grad(true), InvalidArgument) << "only floating tensors require grad";
}

TEST_P(TensorTest, ToDeviceRoundTrip) {
  const std::vector<float> v = iota_f(1000, -1.0f, 0.01f);
  Tensor host = Tensor::from_vector(v, {10, 100});
  EXPECT_EQ(host.device(), Device::cpu()) << "factories default to the CPU";
  Tensor dev = host.to(device());
  EXPECT_EQ(dev.device(), device());
  EXPECT_EQ(dev.shape(), host.shape());
  Tensor back = dev.to(Device::cpu());
  EXPECT_EQ(back.device(), Device::cpu());
  EXPECT_EQ(back.to_vector<float>(), v);
  EXPECT_EQ(dev.to(device()).raw_data(), dev.raw_data()) << "to() the same device is the same tensor";
  if (device().is_cuda()) EXPECT_NE(dev.raw_data(), host.raw_data());

  std::vector<int32_t> labels = {3, 1, 4, 1, 5};
  Tensor l = Tensor::from_vector(labels, {5}).to(device());
  EXPECT_EQ(l.dtype(), DType::i32);
  EXPECT_EQ(l.to(Device::cpu()).to_vector<int32_t>(), labels);

  // copy_from across devices.
  Tensor dst = Tensor::zeros({10, 100}, DType::f32, device());
  dst.copy_from(host);
  EXPECT_EQ(dst.to_vector<float>(), v);
  EXPECT_THROW(dst.copy_from(Tensor::zeros({100, 10})), Error) << "shapes must match";
  EXPECT_THROW(dst.copy_from(Tensor::zeros({10, 100}, DType::i32)), Error) << "dtypes must match";
}

// A copy between two GPUs waits for the source device's work: the source is the output of a GEMM
// still queued on cuda:0 when the copy to cuda:1 is issued.
TEST(PeerCopy, WaitsForTheSourceDevicesWork) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 CUDA GPUs";
  const Tensor a = Tensor::full({2048, 2048}, 1.0f / 64, Device::cuda(0));
  for (int round = 0; round < 4; ++round) {
    const Tensor product = ops::matmul(ops::matmul(a, a), a);  // queued, not finished
    const std::vector<float> copied = product.to(Device::cuda(1)).to_vector<float>();
    const std::vector<float> direct = product.to_vector<float>();
    ASSERT_EQ(copied, direct) << "round " << round;
  }
}

TEST_P(TensorTest, ItemAndStr) {
  Tensor s = Tensor::from_vector<float>({-7.125f}, {1}, device());
  EXPECT_EQ(s.item(), -7.125f);
  Tensor t = Tensor::zeros({64, 784}, DType::f32, device());
  const std::string str = t.str();
  EXPECT_NE(str.find("[64, 784]"), std::string::npos) << str;
  EXPECT_NE(str.find("f32"), std::string::npos) << str;
  EXPECT_NE(str.find(device().str()), std::string::npos) << str;
  EXPECT_NE(Tensor::zeros({3}, DType::u8, device()).str().find("u8"), std::string::npos);
}

// ---- 16-bit storage (Note [Half-precision conversions]) ------------------------------------------
// The reference here is the formats' definitions, not the converter's bit manipulation: a value's
// magnitude from its fields, and round-to-nearest-even checked at every midpoint between two
// neighbouring 16-bit values and one f32 step either side of it.

// The value of a 16-bit pattern by definition (finite ones only).
double value_of_16(uint16_t h, DType t) {
  const int sign = h >> 15;
  double mag;
  if (t == DType::f16) {
    const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    mag = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  } else {
    const int exp = (h >> 7) & 0xff, mant = h & 0x7f;
    mag = exp == 0 ? std::ldexp(mant, -133) : std::ldexp(128 + mant, exp - 134);
  }
  return sign ? -mag : mag;
}

std::vector<uint16_t> bits_of(const Tensor& t) {
  const Tensor host = t.to(Device::cpu());
  std::vector<uint16_t> v(static_cast<std::size_t>(host.numel()));
  std::memcpy(v.data(), host.raw_data(), v.size() * 2);
  return v;
}

Tensor from_bits(const std::vector<uint16_t>& bits, DType t, Device d) {
  Tensor host = Tensor::empty(Shape{static_cast<int64_t>(bits.size())}, t, Device::cpu());
  std::memcpy(host.raw_data(), bits.data(), bits.size() * 2);
  return host.to(d);
}

TEST_P(TensorTest, SixteenBitConversionsRoundToNearestEven) {
  const Device d = device();
  for (const DType t : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    const uint16_t inf = t == DType::f16 ? 0x7c00 : 0x7f80;
    // Widening: every finite positive pattern is its defined value (the negatives by symmetry below).
    std::vector<uint16_t> finite(inf);
    std::iota(finite.begin(), finite.end(), uint16_t{0});
    const std::vector<float> wide = from_bits(finite, t, d).to(DType::f32).to_vector<float>();
    for (uint16_t h = 0; h < inf; ++h) ASSERT_EQ(static_cast<double>(wide[h]), value_of_16(h, t)) << std::hex << h;
    // Narrowing: each pattern itself, the midpoint to its successor (to the even one of the two),
    // and the nearest f32 either side of the midpoint. Past the largest finite value the successor
    // is infinity, whose "value" is where the next binade would start.
    std::vector<float> in;
    std::vector<uint16_t> want;
    for (uint32_t h = 0; h < inf; ++h) {
      const double lo = value_of_16(static_cast<uint16_t>(h), t);
      const double hi = h + 1 < inf ? value_of_16(static_cast<uint16_t>(h + 1), t)
                                    : (t == DType::f16 ? 65536.0 : std::ldexp(1.0, 128));
      const float mid = static_cast<float>((lo + hi) / 2);
      ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2) << "midpoints are exact in f32";
      in.insert(in.end(), {static_cast<float>(lo), std::nextafter(mid, 0.0f), mid, std::nextafter(mid, INFINITY)});
      const uint16_t even = (h & 1) == 0 ? static_cast<uint16_t>(h) : static_cast<uint16_t>(h + 1);
      want.insert(want.end(), {static_cast<uint16_t>(h), static_cast<uint16_t>(h), even, static_cast<uint16_t>(h + 1)});
    }
    // Negative values: the same with the sign bit.
    const std::size_t positives = in.size();
    for (std::size_t i = 0; i < positives; ++i) {
      in.push_back(-in[i]);
      want.push_back(static_cast<uint16_t>(want[i] | 0x8000));
    }
    const Tensor x = Tensor::from_vector(in, Shape{static_cast<int64_t>(in.size())}, d);
    const std::vector<uint16_t> got = bits_of(x.to(t));
    for (std::size_t i = 0; i < in.size(); ++i)
      ASSERT_EQ(got[i], want[i]) << "from " << std::hexfloat << in[i] << std::defaultfloat << " (input " << i << ")";

    // Specials: infinities, NaN (a NaN with sign, never infinity), values below half the smallest
    // subnormal (a signed zero), the largest f32 (infinity), f32 subnormals.
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float tiny = t == DType::f16 ? std::ldexp(1.0f, -25) : std::ldexp(1.0f, -134);
    const std::vector<float> special{INFINITY, -INFINITY, nan, -nan, tiny, -tiny, std::nextafter(tiny, 1.0f),
                                     std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min()};
    const std::vector<uint16_t> s =
        bits_of(Tensor::from_vector(special, Shape{static_cast<int64_t>(special.size())}, d).to(t));
    const uint16_t exp_mask = inf, mant_mask = static_cast<uint16_t>(t == DType::f16 ? 0x3ff : 0x7f);
    EXPECT_EQ(s[0], inf);
    EXPECT_EQ(s[1], inf | 0x8000);
    EXPECT_TRUE((s[2] & exp_mask) == exp_mask && (s[2] & mant_mask) != 0 && (s[2] >> 15) == 0) << std::hex << s[2];
    EXPECT_TRUE((s[3] & exp_mask) == exp_mask && (s[3] & mant_mask) != 0 && (s[3] >> 15) == 1) << std::hex << s[3];
    EXPECT_EQ(s[4], 0x0000) << "half the smallest subnormal ties to even: zero";
    EXPECT_EQ(s[5], 0x8000);
    EXPECT_EQ(s[6], 0x0001);
    EXPECT_EQ(s[7], inf) << "beyond the largest finite value by at least half a unit";
    EXPECT_EQ(s[8], 0x0000);
    // Widening the specials back: infinities and NaN (payload's top bits kept) survive.
    const std::vector<float> back = from_bits(s, t, d).to(DType::f32).to_vector<float>();
    EXPECT_EQ(back[0], INFINITY);
    EXPECT_EQ(back[1], -INFINITY);
    EXPECT_TRUE(std::isnan(back[2]) && !std::signbit(back[2]));
    EXPECT_TRUE(std::isnan(back[3]) && std::signbit(back[3]));
  }
}

TEST_P(TensorTest, ToDTypeConvertsOnlyAmongTheFloatTypes) {
  const Device d = device();
  const Tensor x = Tensor::from_vector(std::vector<float>{1.0f, -2.5f, 65504.0f, 0.1f}, Shape{2, 2}, d);
  EXPECT_TRUE(x.to(DType::f32).is_same(x)) << "the same dtype: the same tensor";
  const Tensor h = x.to(DType::f16);
  EXPECT_EQ(h.dtype(), DType::f16);
  EXPECT_EQ(h.shape(), x.shape());
  EXPECT_EQ(h.device(), d);
  const std::vector<float> back = h.to(DType::f32).to_vector<float>();
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -2.5f);
  EXPECT_EQ(back[2], 65504.0f);
  EXPECT_EQ(back[3], 0.0999755859375f) << "0.1 to the nearest f16";
  // bf16 <-> f16 goes through f32: one rounding.
  EXPECT_EQ(h.to(DType::bf16).to(DType::f32).to_vector<float>()[3], 0.10009765625f);  // as PyTorch
  EXPECT_EQ(x.to(DType::bf16).to(DType::f16).dtype(), DType::f16);
  const Tensor labels = Tensor::zeros(Shape{3}, DType::i32, d);
  EXPECT_THROW(labels.to(DType::f32), InvalidArgument);
  EXPECT_THROW(x.to(DType::u8), InvalidArgument);
  EXPECT_THROW(h.to(DType::i32), InvalidArgument);
}

CUMULUS_INSTANTIATE_DEVICES(TensorTest);

// ---- Generator -------------------------------------------------------------------------------

std::vector<float> draw(Generator& g, int64_t n, float lo = 0.0f, float hi = 1.0f) {
  std::vector<float> v(static_cast<std::size_t>(n));
  g.fill_uniform(v.data(), n, lo, hi);
  return v;
}

TEST(Generator, SameSeedSameValuesDifferentSeedsDiffer) {
  Generator a(1234), b(1234), c(1235), d(0);
  const auto va = draw(a, 1000), vb = draw(b, 1000), vc = draw(c, 1000), vd = draw(d, 1000);
  EXPECT_EQ(va, vb);
  int same_c = 0, same_d = 0;
  for (int i = 0; i < 1000; ++i) {
    same_c += va[i] == vc[i];
    same_d += va[i] == vd[i];
  }
  EXPECT_LT(same_c, 5) << "seeds 1234 and 1235 must give different streams";
  EXPECT_LT(same_d, 5);
  // Not constant, not a short cycle.
  std::vector<float> sorted = va;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_GT(std::unique(sorted.begin(), sorted.end()) - sorted.begin(), 990);
}

TEST(Generator, OffsetAdvancesAndStateResumes) {
  Generator g(99);
  EXPECT_EQ(g.seed(), 99u);
  EXPECT_EQ(g.offset(), 0u);
  const auto first = draw(g, 100);
  EXPECT_EQ(g.offset(), 100u);
  const auto second = draw(g, 50);
  EXPECT_EQ(g.offset(), 150u);
  EXPECT_NE(std::vector<float>(first.begin(), first.begin() + 50), second) << "the stream moves on";

  Generator whole(99);
  const auto all = draw(whole, 150);
  EXPECT_EQ(std::vector<float>(all.begin(), all.begin() + 100), first) << "counter-based: draws compose";
  EXPECT_EQ(std::vector<float>(all.begin() + 100, all.end()), second);

  Generator resumed;
  resumed.set_state(99, 100);
  EXPECT_EQ(resumed.seed(), 99u);
  EXPECT_EQ(resumed.offset(), 100u);
  EXPECT_EQ(draw(resumed, 50), second) << "(seed, offset) is the full state";

  Tensor t = uniform({7, 3}, 0.0f, 1.0f, g);
  EXPECT_EQ(g.offset(), 171u) << "uniform() draws numel values";
}

TEST(Generator, UniformRangeMeanVariance) {
  Generator g(7);
  const float lo = -2.0f, hi = 3.0f;
  const int64_t n = 100000;
  const auto v = draw(g, n, lo, hi);
  double sum = 0, sq = 0;
  int bins[10] = {};
  for (float x : v) {
    ASSERT_GE(x, lo);
    ASSERT_LT(x, hi);
    sum += x;
    bins[std::min(9, int((x - lo) / (hi - lo) * 10))] += 1;
  }
  const double mean = sum / n;
  for (float x : v) sq += (x - mean) * (x - mean);
  const double var = sq / (n - 1);
  EXPECT_NEAR(mean, 0.5, 0.02) << "mean of U(-2, 3)";
  EXPECT_NEAR(var, 25.0 / 12.0, 0.03) << "variance of U(-2, 3)";
  for (int b = 0; b < 10; ++b) EXPECT_NEAR(bins[b], n / 10, 600) << "histogram bin " << b;
}

TEST(Generator, NormalMeanStd) {
  Generator g(11), g2(11);
  const int64_t n = 100000;
  std::vector<float> v(n), v2(n);
  g.fill_normal(v.data(), n, 1.5f, 2.0f);
  g2.fill_normal(v2.data(), n, 1.5f, 2.0f);
  EXPECT_EQ(v, v2);
  double sum = 0, sq = 0;
  int within1 = 0;
  for (float x : v) {
    ASSERT_TRUE(std::isfinite(x));
    sum += x;
    within1 += std::fabs(x - 1.5f) < 2.0f;
  }
  const double mean = sum / n;
  for (float x : v) sq += (x - mean) * (x - mean);
  EXPECT_NEAR(mean, 1.5, 0.03);
  EXPECT_NEAR(std::sqrt(sq / (n - 1)), 2.0, 0.03);
  EXPECT_NEAR(double(within1) / n, 0.6827, 0.01) << "about 68% within one standard deviation";
}

class RandomTest : public DeviceTest {};

TEST_P(RandomTest, UniformIsBitIdenticalOnEveryDevice) {
  Generator host_gen(2024), dev_gen(2024);
  Tensor h = uniform({37, 53}, -0.7f, 0.9f, host_gen, Device::cpu());
  Tensor d = uniform({37, 53}, -0.7f, 0.9f, dev_gen, device());
  EXPECT_EQ(d.device(), device());
  EXPECT_EQ(d.shape(), Shape({37, 53}));
  const auto hv = h.to_vector<float>(), dv = d.to_vector<float>();
  ASSERT_EQ(hv.size(), dv.size());
  EXPECT_EQ(std::memcmp(hv.data(), dv.data(), hv.size() * sizeof(float)), 0) << "bit-identical";
  EXPECT_EQ(host_gen.offset(), dev_gen.offset());
  // And equal to the raw generator stream.
  Generator raw(2024);
  EXPECT_EQ(draw(raw, 37 * 53, -0.7f, 0.9f), hv);

  Generator n1(5), n2(5);
  const auto nh = normal({1000}, 0.0f, 1.0f, n1, Device::cpu()).to_vector<float>();
  const auto nd = normal({1000}, 0.0f, 1.0f, n2, device()).to_vector<float>();
  EXPECT_EQ(std::memcmp(nh.data(), nd.data(), nh.size() * sizeof(float)), 0);
}

TEST_P(RandomTest, LinearInitBound) {
  Generator g(3);
  const int64_t in = 300, out = 200;
  nn::Linear lin(in, out, g, device());
  EXPECT_EQ(lin.in_features(), in);
  EXPECT_EQ(lin.out_features(), out);
  ASSERT_TRUE(lin.weight().defined());
  ASSERT_TRUE(lin.bias().defined());
  EXPECT_EQ(lin.weight().shape(), Shape({out, in}));
  EXPECT_EQ(lin.bias().shape(), Shape({out}));
  EXPECT_EQ(lin.weight().device(), device());
  EXPECT_TRUE(lin.weight().requires_grad());
  EXPECT_TRUE(lin.weight().is_leaf());
  EXPECT_EQ(lin.weight().memory_category(), MemoryCategory::parameters);
  EXPECT_TRUE(lin.weight().grad_buffer().defined()) << "parameters get their gradient buffer at creation";
  EXPECT_EQ(lin.weight().grad_buffer().memory_category(), MemoryCategory::gradients);
  EXPECT_FALSE(lin.weight().grad().defined()) << "nothing accumulated yet";

  const double bound = 1.0 / std::sqrt(double(in));
  for (const Tensor* p : {&lin.weight(), &lin.bias()}) {
    const auto v = p->to_vector<float>();
    double maxabs = 0, sum = 0;
    for (float x : v) {
      EXPECT_LE(std::fabs(x), bound * (1 + 1e-6)) << "init outside +-1/sqrt(fan_in)";
      maxabs = std::max(maxabs, double(std::fabs(x)));
      sum += x;
    }
    EXPECT_GT(maxabs, 0.95 * bound) << "the values span the whole range, not a narrower one";
    EXPECT_LT(std::fabs(sum / double(v.size())), 0.15 * bound) << "centred on zero";
  }
  const auto w = lin.weight().to_vector<float>(), b = lin.bias().to_vector<float>();
  EXPECT_NE(std::vector<float>(w.begin(), w.begin() + out), b) << "bias is not the weight's first values";

  // Same seed, same weights; no bias when asked.
  Generator g2(3);
  nn::Linear again(in, out, g2, device());
  EXPECT_EQ(again.weight().to_vector<float>(), w);
  Generator g3(3);
  nn::Linear nobias(in, out, g3, device(), /*bias=*/false);
  EXPECT_FALSE(nobias.bias().defined());
  EXPECT_EQ(nobias.parameters().size(), 1u);
  EXPECT_EQ(nobias.num_parameters(), in * out);
  EXPECT_EQ(lin.num_parameters(), in * out + out);
}

CUMULUS_INSTANTIATE_DEVICES(RandomTest);

}  // namespace
}  // namespace cumulus
