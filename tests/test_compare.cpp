// What the op cases (tests/op_cases/cases_compare.cpp) cannot say about cumulus/ops/compare.h: the
// error messages, empty tensors, bool tensors' round trips (host, safetensors, state dicts), that no
// comparison records a node, and the causal-mask recipe end to end with -inf and softmax-free sums.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cumulus/autograd/grad_mode.h"
#include "cumulus/io/safetensors.h"
#include "cumulus/ops/compare.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/ops/shape.h"
#include "test_util.h"

namespace cumulus::testing {
namespace {

class CompareTest : public DeviceTest {
 protected:
  Tensor floats(const std::vector<float>& v, const Shape& shape) const {
    return Tensor::from_vector(v, shape, device());
  }
  Tensor mask(const std::vector<uint8_t>& v, const Shape& shape) const {
    return ops::cast(Tensor::from_vector(v, shape, device()), DType::boolean);
  }
};

// Runs fn, which must throw E with every one of `parts` in its message.
template <typename E, typename Fn>
void expect_error(Fn fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no exception; expected one saying " << ::testing::PrintToString(parts);
  } catch (const E& e) {
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST_P(CompareTest, BoolTensorsRoundTripThroughUint8) {
  const Tensor m = mask({0, 3, 1, 255, 0, 0}, {2, 3});
  EXPECT_EQ(m.dtype(), DType::boolean);
  EXPECT_STREQ(dtype_name(m.dtype()), "bool");
  EXPECT_EQ(m.nbytes(), 6u);
  EXPECT_EQ(m.to_vector<uint8_t>(), (std::vector<uint8_t>{0, 1, 1, 1, 0, 0}));
  EXPECT_EQ(ops::cast(m, DType::f32).to_vector<float>(), (std::vector<float>{0, 1, 1, 1, 0, 0}));
  EXPECT_EQ(ops::cast(m, DType::i64).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 1, 1, 0, 0}));
  EXPECT_THROW(m.data<uint8_t>(), InvalidArgument);  // only to_vector reads bool as bytes
  EXPECT_THROW(m.to_vector<float>(), InvalidArgument);
}

TEST_P(CompareTest, ComparisonsRecordNothing) {
  Tensor x = floats({1, 2, 3}, {3});
  x.set_requires_grad(true);
  EXPECT_FALSE(ops::lt(x, 2.0).requires_grad());
  EXPECT_FALSE(ops::eq(x, x).requires_grad());
  EXPECT_FALSE(ops::logical_not(x).requires_grad());
  EXPECT_FALSE(ops::cast(x, DType::boolean).requires_grad());
}

TEST_P(CompareTest, EmptyTensors) {
  const Tensor e = Tensor::zeros({0, 3}, DType::f32, device());
  EXPECT_EQ(ops::lt(e, floats({1, 2, 3}, {3})).shape(), Shape({0, 3}));
  EXPECT_EQ(ops::eq(e, 1.0).shape(), Shape({0, 3}));
  EXPECT_EQ(ops::logical_not(e).dtype(), DType::boolean);
  EXPECT_EQ(ops::tril(e).shape(), Shape({0, 3}));
  EXPECT_EQ(ops::triu(Tensor::zeros({2, 3, 0}, DType::f32, device()), 1).shape(), Shape({2, 3, 0}));
  EXPECT_EQ(ops::masked_fill(e, mask({1, 0, 1}, {3}), 5.0).shape(), Shape({0, 3}));
  EXPECT_EQ(ops::where(mask({1, 0, 1}, {3}), e, 0.0).shape(), Shape({0, 3}));
  EXPECT_EQ(ops::arange(3.0, 3.0, 1.0, std::nullopt, device()).shape(), Shape({0}));
  EXPECT_EQ(ops::arange(0, device()).numel(), 0);
  EXPECT_EQ(ops::cast(Tensor::zeros({0}, DType::boolean, device()), DType::f32).numel(), 0);
}

// An empty output still carries a gradient of the input's shape (zeros where nothing was read).
TEST_P(CompareTest, WhereGradientThroughAnEmptyOutputIsZero) {
  Tensor a = floats({1, 2, 3}, {3});
  a.set_requires_grad(true);
  const Tensor y = ops::where(Tensor::zeros({0, 3}, DType::boolean, device()), a, 0.0);
  ops::sum(y).backward();
  ASSERT_TRUE(a.grad().defined());
  EXPECT_EQ(a.grad().to_vector<float>(), (std::vector<float>{0, 0, 0}));
}

TEST_P(CompareTest, ZeroDimensionalOperands) {
  const Tensor s = Tensor::from_vector(std::vector<float>{2.0f}, Shape{}, device());
  EXPECT_EQ(ops::lt(s, floats({1, 2, 3}, {3})).to_vector<uint8_t>(), (std::vector<uint8_t>{0, 0, 1}));
  EXPECT_EQ(ops::ge(s, 2.0).shape(), Shape{});
  EXPECT_EQ(ops::where(ops::gt(s, 1.0), floats({1, 2}, {2}), 9.0).to_vector<float>(), (std::vector<float>{1, 2}));
}

// PyTorch: torch.tensor([0.1]) == 0.1 is True (the scalar takes the tensor's type).
TEST_P(CompareTest, ScalarTakesTheTensorsDtype) {
  EXPECT_EQ(ops::eq(floats({0.1f}, {1}), 0.1).to_vector<uint8_t>(), std::vector<uint8_t>{1});
  const Tensor i = ops::arange(-2, 3, 1, DType::i64, device());
  EXPECT_EQ(ops::lt(i, 0.5).to_vector<uint8_t>(), (std::vector<uint8_t>{1, 1, 1, 0, 0}));
  EXPECT_EQ(ops::le(i, -2.0).to_vector<uint8_t>(), (std::vector<uint8_t>{1, 0, 0, 0, 0}));
  // Past 2^53 an integer compares exactly (a double would make 2^53 + 1 equal 2^53).
  const int64_t big = (int64_t{1} << 53) + 1;
  const Tensor b = Tensor::from_vector(std::vector<int64_t>{big}, {1}, device());
  EXPECT_EQ(ops::eq(b, static_cast<double>(int64_t{1} << 53)).to_vector<uint8_t>(), std::vector<uint8_t>{0});
}

// As torch.masked_fill (out of place): x broadcasts to the mask's shape too, and its gradient sums.
TEST_P(CompareTest, MaskedFillBroadcastsXAsPyTorch) {
  Tensor x = floats({1, 2, 3}, {3});
  x.set_requires_grad(true);
  const Tensor y = ops::masked_fill(x, mask({1, 0, 0, 0, 1, 0}, {2, 3}), -1.0);
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{-1, 2, 3, 1, -1, 3}));
  ops::sum(y).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{1, 1, 2}));
}

TEST_P(CompareTest, CausalMaskFillsTheFutureWithMinusInfinity) {
  const int64_t T = 4;
  const Tensor ones = Tensor::full({T, T}, 1.0f, device());
  const Tensor scores = Tensor::zeros({2, 1, T, T}, DType::f32, device());
  const std::vector<float> y = ops::masked_fill(scores, ops::eq(ops::tril(ones), 0.0), -INFINITY).to_vector<float>();
  for (int64_t i = 0; i < 2 * T * T; ++i) {
    const int64_t r = i / T % T, c = i % T;
    EXPECT_EQ(y[static_cast<std::size_t>(i)], c > r ? -INFINITY : 0.0f) << i;
  }
  EXPECT_EQ(ops::tril(ones).to_vector<float>(), (std::vector<float>{1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1}));
}

TEST_P(CompareTest, ArangeAsPyTorch) {
  EXPECT_EQ(ops::arange(5, device()).dtype(), DType::i64);
  EXPECT_EQ(ops::arange(5, device()).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  const Tensor f = ops::arange(0, 1, 0.25, std::nullopt, device());
  EXPECT_EQ(f.dtype(), DType::f32);
  EXPECT_EQ(f.to_vector<float>(), (std::vector<float>{0, 0.25f, 0.5f, 0.75f}));
  EXPECT_EQ(ops::arange(1, 2, 0.3, std::nullopt, device()).numel(), 4);  // ceil(1 / 0.3)
  EXPECT_EQ(ops::arange(10, 0, -3, DType::i32, device()).to_vector<int32_t>(), (std::vector<int32_t>{10, 7, 4, 1}));
}

TEST_P(CompareTest, ErrorsNameTheOpAndTheArgument) {
  const Tensor x = floats({1, 2, 3, 4, 5, 6}, {2, 3});
  expect_error<InvalidArgument>([&] { ops::eq(x, ops::cast(x, DType::bf16)); }, {"eq", "same dtype", "f32", "bf16"});
  expect_error<InvalidArgument>([&] { ops::lt(x, floats({1, 2}, {2})); }, {"lt", "[2, 3]", "[2]", "broadcast"});
  expect_error<InvalidArgument>([&] { ops::gt(Tensor(), 1.0); }, {"gt", "undefined"});
  expect_error<InvalidArgument>([&] { ops::where(x, x, x); }, {"where", "cond", "bool", "f32"});
  expect_error<InvalidArgument>([&] { ops::where(ops::gt(x, 2.0), x, ops::cast(x, DType::f16)); },
                                {"where", "same dtype"});
  expect_error<InvalidArgument>(
      [&] {
        ops::masked_fill(floats({1, 2}, {2}), ops::gt(x, 2.0), 0.0);
      },
      {"masked_fill", "[2, 3]", "[2]", "broadcast"});
  expect_error<InvalidArgument>([&] { ops::masked_fill(x, x, 0.0); }, {"masked_fill", "mask", "bool"});
  const Tensor i = ops::arange(6, device());
  expect_error<InvalidArgument>([&] { ops::masked_fill(i, ops::gt(i, 2.0), 0.5); },
                                {"masked_fill", "0.5", "not representable", "i64"});
  expect_error<InvalidArgument>([&] { ops::masked_fill(ops::cast(x, DType::f16), ops::gt(x, 2.0), 1e5); },
                                {"masked_fill", "100000", "overflows f16"});
  EXPECT_EQ(ops::masked_fill(x, ops::gt(x, 2.0), -INFINITY).to_vector<float>()[5], -INFINITY);
  expect_error<InvalidArgument>([&] { ops::tril(floats({1, 2}, {2})); }, {"tril", "at least 2 dimensions"});
  expect_error<InvalidArgument>([&] { ops::arange(0, 5, 0, std::nullopt, device()); }, {"arange", "step", "nonzero"});
  expect_error<InvalidArgument>([&] { ops::arange(0, 5, -1, std::nullopt, device()); }, {"arange", "wrong side"});
  expect_error<InvalidArgument>([&] { ops::arange(-3, device()); }, {"arange", "wrong side"});
  expect_error<InvalidArgument>([&] { ops::arange(0, INFINITY, 1, std::nullopt, device()); }, {"arange", "finite"});
  expect_error<InvalidArgument>([&] { ops::arange(0, 2, 0.5, DType::i64, device()); },
                                {"arange", "integer start and step"});
  expect_error<InvalidArgument>([&] { ops::arange(0, 3, 1, DType::boolean, device()); }, {"arange", "dtype", "bool"});
  expect_error<InvalidArgument>([&] { ops::arange(0, 4e9, 1e9, DType::i32, device()); }, {"arange", "i32"});
}

CUMULUS_INSTANTIATE_DEVICES(CompareTest);

TEST(BoolSerialization, SafetensorsStoresBoolAsBool) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  const Tensor m = ops::cast(Tensor::from_vector(std::vector<uint8_t>{1, 0, 0, 1}, {2, 2}), DType::boolean);
  io::save_safetensors(path, {{"mask", m}});
  const io::SafetensorsContents f = io::load_safetensors(path);
  ASSERT_EQ(f.tensors.size(), 1u);
  EXPECT_EQ(f.tensors[0].second.dtype(), DType::boolean);
  EXPECT_EQ(f.tensors[0].second.to_vector<uint8_t>(), (std::vector<uint8_t>{1, 0, 0, 1}));
}

// A BOOL byte other than 0 or 1 is no bool tensor's: refused, naming the tensor and the index.
TEST(BoolSerialization, SafetensorsRefusesABoolByteOtherThanZeroOrOne) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  const std::string header = R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})";
  std::string bytes(8, '\0');
  for (int k = 0; k < 8; ++k) bytes[static_cast<std::size_t>(k)] = static_cast<char>((header.size() >> (8 * k)) & 0xFF);
  bytes += header + std::string("\x01\x00\x02", 3);
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
  std::fclose(f);
  expect_error<Error>([&] { io::load_safetensors(path); }, {"'m'", "BOOL byte 2", "index 2"});
}

}  // namespace
}  // namespace cumulus::testing
