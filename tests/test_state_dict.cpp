// io::save_state_dict / load_state_dict: round trips of whole models, the all-or-nothing load, the
// errors (naming file and tensor) and the exact dtype conversions files from PyTorch need.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "cumulus/core/error.h"
#include "cumulus/io/safetensors.h"
#include "cumulus/io/state_dict.h"
#include "cumulus/models/cnn.h"
#include "cumulus/models/mlp.h"
#include "cumulus/nn/conv_layers.h"
#include "cumulus/nn/norm_layers.h"
#include "test_util.h"

namespace cumulus {
namespace {

using testing::TempDir;

// The values of a state dict, as host floats (i32 buffers converted), by entry.
std::vector<std::vector<float>> values(const nn::Module& m) {
  std::vector<std::vector<float>> out;
  for (const auto& [name, t] : m.state_dict()) {
    if (t.dtype() == DType::f32) {
      out.push_back(t.to_vector<float>());
    } else {
      std::vector<float> v;
      for (int32_t x : t.to_vector<int32_t>()) v.push_back(static_cast<float>(x));
      out.push_back(v);
    }
  }
  return out;
}

void set_counter(const nn::BatchNorm2d& bn, int32_t value) {
  for (auto& [name, t] : bn.state_dict())
    if (name == "num_batches_tracked") {
      Tensor target = t;
      target.copy_from(Tensor::from_vector(std::vector<int32_t>{value}, Shape{}));
    }
}

Tensor tensor_of(const nn::Module& m, const std::string& wanted) {
  for (const auto& [name, t] : m.state_dict())
    if (name == wanted) return t;
  ADD_FAILURE() << "no " << wanted;
  return {};
}

// Expects `fn` to throw cumulus::Error whose message contains every one of `parts`.
template <typename Fn>
void expect_error(Fn fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << "\nlacks: " << p;
  }
}

uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>(u >> 16);
}

Tensor bf16_tensor(const std::vector<float>& v, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::bf16);
  auto* p = static_cast<uint16_t*>(t.raw_data());
  for (std::size_t i = 0; i < v.size(); ++i) p[i] = bf16_bits(v[i]);
  return t;
}

class StateDictTest : public testing::DeviceTest {};

TEST_P(StateDictTest, ModelsRoundTripWithBuffers) {
  TempDir dir;
  Generator g1(1), g2(2);
  models::CNN a(g1, device()), b(g2, device());
  for (const auto& [name, t] : a.state_dict())
    if (name == "1.num_batches_tracked") {
      Tensor target = t;
      target.copy_from(Tensor::from_vector(std::vector<int32_t>{1234}, Shape{}));
    }
  const std::string path = dir.file("cnn.safetensors");
  io::save_state_dict(path, a);
  ASSERT_NE(values(a), values(b));
  const io::LoadedStateDict r = io::load_state_dict(path, b);
  EXPECT_EQ(values(a), values(b));
  EXPECT_EQ(r.metadata.at("format"), "pt");  // as safetensors.torch.save_file writes
  EXPECT_TRUE(r.extra.empty() && r.missing.empty() && r.unexpected.empty());
  EXPECT_EQ(tensor_of(b, "1.num_batches_tracked").to_vector<int32_t>(), std::vector<int32_t>{1234});
  EXPECT_EQ(tensor_of(b, "0.weight").device(), device());

  Generator g3(3), g4(4);
  models::SeedMLP m1(g3, device()), m2(g4, device());
  io::save_state_dict(path, m1);
  io::load_state_dict(path, m2);
  EXPECT_EQ(values(m1), values(m2));
}

CUMULUS_INSTANTIATE_DEVICES(StateDictTest);

TEST(StateDict, MetadataAndExtraTensorsUnderAPrefix) {
  TempDir dir;
  Generator g(0);
  models::SeedMLP a(g), b(g);
  const std::string path = dir.file("ckpt.safetensors");
  io::ExtraTensors extra{"optimizer.", {{"momentum_buffer", Tensor::full(Shape{3}, 2.5f)}}};
  io::save_state_dict(path, a, {{"format", "mine"}, {"epoch", "3"}}, extra);

  // Saved under the prefix, beside the model's names.
  const io::SafetensorsContents raw = io::load_safetensors(path);
  EXPECT_EQ(raw.tensors.back().first, "optimizer.momentum_buffer");
  EXPECT_EQ(raw.metadata.at("format"), "mine");  // the caller's wins over "pt"

  // Without the prefix option the extra tensor is unexpected, and nothing is loaded.
  const auto before = values(b);
  expect_error([&] { io::load_state_dict(path, b); }, {path, "'optimizer.momentum_buffer'", "not in the module"});
  EXPECT_EQ(values(b), before);

  io::LoadStateDictOptions o;
  o.extra_prefix = "optimizer.";
  const io::LoadedStateDict r = io::load_state_dict(path, b, o);
  EXPECT_EQ(values(a), values(b));
  ASSERT_EQ(r.extra.size(), 1u);
  EXPECT_EQ(r.extra[0].first, "momentum_buffer");
  EXPECT_EQ(r.extra[0].second.to_vector<float>(), std::vector<float>(3, 2.5f));
  EXPECT_EQ(r.metadata.at("epoch"), "3");
}

TEST(StateDict, MissingAndUnexpectedTensors) {
  TempDir dir;
  Generator g(0);
  models::SeedMLP model(g);
  const std::string path = dir.file("partial.safetensors");
  io::NamedTensors partial = model.state_dict();
  partial.pop_back();  // linear_relu_stack.4.bias
  partial.emplace_back("head.weight", Tensor::zeros(Shape{2}));
  io::save_safetensors(path, partial);

  expect_error([&] { io::load_state_dict(path, model); },
               {"file '" + path + "'", "tensor 'linear_relu_stack.4.bias'", "not in the file"});
  io::LoadStateDictOptions o;
  o.allow_missing = true;
  expect_error([&] { io::load_state_dict(path, model, o); },
               {"file '" + path + "'", "tensor 'head.weight'", "not in the module's state dict"});
  o.allow_unexpected = true;
  const io::LoadedStateDict r = io::load_state_dict(path, model, o);
  EXPECT_EQ(r.missing, std::vector<std::string>{"linear_relu_stack.4.bias"});
  EXPECT_EQ(r.unexpected, std::vector<std::string>{"head.weight"});
}

TEST(StateDict, WrongShapeIsRefusedAndNothingIsCopied) {
  TempDir dir;
  nn::BatchNorm2d a(4), b(3);
  set_counter(a, 5);
  const std::string path = dir.file("bn4.safetensors");
  io::save_state_dict(path, a);
  const auto before = values(b);
  expect_error([&] { io::load_state_dict(path, b); }, {"file '" + path + "'", "tensor 'weight'", "[4]", "[3]"});
  EXPECT_EQ(values(b), before);  // not even the counter, whose shape matched

  // A counter written as [1] instead of PyTorch's 0-d [] is a shape mismatch, not a silent reshape.
  io::NamedTensors t = nn::BatchNorm2d(3).state_dict();
  for (auto& [name, v] : t)
    if (name == "num_batches_tracked") v = Tensor::from_vector(std::vector<int32_t>{1}, Shape{1});
  io::save_safetensors(path, t);
  expect_error([&] { io::load_state_dict(path, b); }, {"tensor 'num_batches_tracked'", "[1]", "[]"});
}

TEST(StateDict, ExactDtypeConversions) {
  TempDir dir;
  nn::BatchNorm2d bn(2);
  const std::string path = dir.file("bn.safetensors");
  auto file_with = [&](const Tensor& weight, const Tensor& counter) {
    io::NamedTensors t = nn::BatchNorm2d(2).state_dict();
    for (auto& [name, v] : t) {
      if (name == "weight") v = weight;
      if (name == "num_batches_tracked") v = counter;
    }
    io::save_safetensors(path, t);
  };

  // f32 counter (a converted or hand-made file) into our i32 buffer: exact integers only.
  file_with(Tensor::full(Shape{2}, 0.5f), Tensor::full(Shape{}, 7.0f));
  io::load_state_dict(path, bn);
  EXPECT_EQ(tensor_of(bn, "num_batches_tracked").to_vector<int32_t>(), std::vector<int32_t>{7});
  EXPECT_EQ(tensor_of(bn, "weight").to_vector<float>(), std::vector<float>(2, 0.5f));
  file_with(Tensor::full(Shape{2}, 0.5f), Tensor::full(Shape{}, 7.5f));
  expect_error([&] { io::load_state_dict(path, bn); },
               {"file '" + path + "'", "tensor 'num_batches_tracked'", "f32 in the file", "i32 in the module", "7.5"});
  file_with(Tensor::full(Shape{2}, 0.5f), Tensor::full(Shape{}, 3e9f));
  expect_error([&] { io::load_state_dict(path, bn); }, {"tensor 'num_batches_tracked'", "3000000000"});

  // i32 weights into f32: exact up to 2^24.
  file_with(Tensor::from_vector(std::vector<int32_t>{-3, 16777216}, Shape{2}), Tensor::zeros(Shape{}, DType::i32));
  io::load_state_dict(path, bn);
  EXPECT_EQ(tensor_of(bn, "weight").to_vector<float>(), (std::vector<float>{-3.0f, 16777216.0f}));
  file_with(Tensor::from_vector(std::vector<int32_t>{1, 16777217}, Shape{2}), Tensor::zeros(Shape{}, DType::i32));
  expect_error([&] { io::load_state_dict(path, bn); }, {"tensor 'weight'", "element 1", "16777217"});

  // Conversion switched off: any dtype difference is an error.
  file_with(Tensor::full(Shape{2}, 0.5f), Tensor::full(Shape{}, 7.0f));
  io::LoadStateDictOptions strict;
  strict.convert_dtypes = false;
  expect_error([&] { io::load_state_dict(path, bn, strict); }, {"tensor 'num_batches_tracked'", "conversion is off"});
}

TEST(StateDict, RequireFiniteRefusesNaNBeforeCopying) {
  TempDir dir;
  nn::BatchNorm2d a(3), b(3);
  for (const auto& [name, t] : a.state_dict())
    if (name == "running_var") {
      Tensor target = t;
      target.copy_from(Tensor::from_vector(std::vector<float>{1.0f, std::nanf(""), 2.0f}, Shape{3}));
    }
  const std::string path = dir.file("nan.safetensors");
  io::save_state_dict(path, a);
  io::LoadStateDictOptions o;
  o.require_finite = true;
  const auto before = values(b);
  expect_error([&] { io::load_state_dict(path, b, o); }, {"file '" + path + "'", "tensor 'running_var'", "element 1"});
  EXPECT_EQ(values(b), before);
  io::load_state_dict(path, b);  // allowed by default, as PyTorch does
  EXPECT_TRUE(std::isnan(tensor_of(b, "running_var").to_vector<float>()[1]));
}

// Issue 30 items 7 and 11: the extra tensors (a checkpoint's optimizer state) are held to the same
// standard: a NaN among them is refused under require_finite, naming the file and the tensor, and
// with extra_layout set a name, dtype or shape the caller does not keep is refused from the header,
// before any tensor is read, with the model untouched.
TEST(StateDict, ExtraTensorsAreCheckedForFinitenessAndAgainstTheExpectedLayout) {
  TempDir dir;
  Generator g(0);
  models::SeedMLP a(g), b(g);
  const std::string path = dir.file("ckpt.safetensors");
  io::save_state_dict(
      path, a, {},
      io::ExtraTensors{"optimizer.",
                       {{"momentum_buffer", Tensor::from_vector(std::vector<float>{1, std::nanf(""), 3}, Shape{3})}}});
  const auto before = values(b);
  io::LoadStateDictOptions o;
  o.extra_prefix = "optimizer.";
  o.require_finite = true;
  expect_error([&] { io::load_state_dict(path, b, o); },
               {"file '" + path + "'", "tensor 'optimizer.momentum_buffer'", "element 1", "non-finite"});
  EXPECT_EQ(values(b), before);

  o.require_finite = false;
  o.extra_layout = std::vector<io::SafetensorsTensorInfo>{{"momentum_buffer", DType::f32, Shape{4}}};
  expect_error([&] { io::load_state_dict(path, b, o); },
               {"tensor 'optimizer.momentum_buffer'", "f32 [3] in the file", "f32 [4] expected"});
  o.extra_layout = std::vector<io::SafetensorsTensorInfo>{{"exp_avg", DType::f32, Shape{3}}};
  expect_error([&] { io::load_state_dict(path, b, o); }, {"tensor 'optimizer.momentum_buffer'", "not a tensor"});
  EXPECT_EQ(values(b), before);
  o.extra_layout = std::vector<io::SafetensorsTensorInfo>{{"momentum_buffer", DType::f32, Shape{3}}};
  EXPECT_EQ(io::load_state_dict(path, b, o).extra.size(), 1u);
  EXPECT_EQ(values(a), values(b));
}

// bf16 weights (as torch.bfloat16 saves them) into f32: always exact, bits << 16. Checked through
// copy_state_dict with tensors made here, so it does not depend on which dtypes the file reader knows.
TEST(StateDict, Bf16IntoF32) {
  nn::BatchNorm2d bn(3);
  io::SafetensorsContents c;
  c.tensors = bn.state_dict();
  const std::vector<float> w{1.5f, -0.0078125f, 3.0e38f};
  for (auto& [name, v] : c.tensors)
    if (name == "weight") v = bf16_tensor(w, Shape{3});
  io::copy_state_dict("in-memory", c, bn);
  const std::vector<float> got = tensor_of(bn, "weight").to_vector<float>();
  for (int i = 0; i < 3; ++i) {
    uint32_t want;
    std::memcpy(&want, &w[static_cast<std::size_t>(i)], sizeof want);
    uint32_t have;
    std::memcpy(&have, &got[static_cast<std::size_t>(i)], sizeof have);
    EXPECT_EQ(have, want & 0xFFFF0000u) << i;
  }
  // The same through a file (save_safetensors writes bf16 as BF16).
  TempDir dir;
  const std::string path = dir.file("bf16.safetensors");
  io::save_safetensors(path, c.tensors);
  nn::BatchNorm2d from_file(3);
  io::load_state_dict(path, from_file);
  EXPECT_EQ(tensor_of(from_file, "weight").to_vector<float>(), got);

  // And back: f32 into bf16 only where the low 16 bits are zero.
  EXPECT_NO_THROW(io::convert_exact(Tensor::full(Shape{2}, 1.5f), DType::bf16, "x"));
  expect_error([] { io::convert_exact(Tensor::full(Shape{2}, 0.1f), DType::bf16, "file 'f': tensor 't'"); },
               {"file 'f': tensor 't'", "bf16 in the module", "element 0"});
}

// f16 weights (torch.float16) into f32: always exact. Through a file, as save_safetensors writes
// f16 (F16) and load_safetensors reads it back (f16).
TEST(StateDict, F16IntoF32) {
  nn::BatchNorm2d bn(3);
  io::SafetensorsContents c;
  c.tensors = bn.state_dict();
  const std::vector<float> w{1.5f, -0.0999755859375f, 65504.0f};  // each exactly an f16
  for (auto& [name, v] : c.tensors)
    if (name == "weight") v = Tensor::from_vector(w, Shape{3}).to(DType::f16);
  TempDir dir;
  const std::string path = dir.file("f16.safetensors");
  io::save_safetensors(path, c.tensors);
  io::load_state_dict(path, bn);
  EXPECT_EQ(tensor_of(bn, "weight").to_vector<float>(), w);
  // And back: f32 into f16 only where the value is exact.
  EXPECT_NO_THROW(io::convert_exact(Tensor::full(Shape{2}, 65504.0f), DType::f16, "x"));
  expect_error([] { io::convert_exact(Tensor::full(Shape{2}, 0.1f), DType::f16, "file 'f': tensor 't'"); },
               {"file 'f': tensor 't'", "f16 in the module", "element 0"});
  expect_error([] { io::convert_exact(Tensor::full(Shape{2}, 70000.0f), DType::f16, "file 'f': tensor 't'"); },
               {"file 'f': tensor 't'", "f16 in the module", "element 0"});
}

// A file as PyTorch writes a batch norm's state dict in bfloat16: BF16 parameters and statistics,
// I64 0-d num_batches_tracked (load_safetensors reads it as i32, range-checked; BF16 as bf16).
TEST(StateDict, PyTorchStyleFileWithI64CounterAndBf16Weights) {
  TempDir dir;
  const std::string path = dir.file("torch_bn.safetensors");
  std::string header = R"({"__metadata__":{"format":"pt"},)"
                       R"("bias":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},)"
                       R"("num_batches_tracked":{"dtype":"I64","shape":[],"data_offsets":[4,12]},)"
                       R"("running_mean":{"dtype":"BF16","shape":[2],"data_offsets":[12,16]},)"
                       R"("running_var":{"dtype":"BF16","shape":[2],"data_offsets":[16,20]},)"
                       R"("weight":{"dtype":"BF16","shape":[2],"data_offsets":[20,24]}})";
  while (header.size() % 8 != 0) header += ' ';
  std::string data;
  auto put16 = [&](float f) {
    const uint16_t b = bf16_bits(f);
    data.push_back(static_cast<char>(b & 0xFF));
    data.push_back(static_cast<char>(b >> 8));
  };
  put16(0.25f), put16(-0.5f);                                     // bias
  for (int i = 0; i < 8; ++i) data.push_back(i == 0 ? 42 : 0);    // num_batches_tracked = 42 (LE)
  put16(0.125f), put16(2.0f);                                     // running_mean
  put16(1.0f), put16(4.0f);                                       // running_var
  put16(1.5f), put16(3.0f);                                       // weight
  std::ofstream f(path, std::ios::binary);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>((n >> (8 * i)) & 0xFF));
  f << header << data;
  f.close();

  nn::BatchNorm2d bn(2);
  io::load_state_dict(path, bn);
  EXPECT_EQ(tensor_of(bn, "weight").to_vector<float>(), (std::vector<float>{1.5f, 3.0f}));
  EXPECT_EQ(tensor_of(bn, "bias").to_vector<float>(), (std::vector<float>{0.25f, -0.5f}));
  EXPECT_EQ(tensor_of(bn, "running_mean").to_vector<float>(), (std::vector<float>{0.125f, 2.0f}));
  EXPECT_EQ(tensor_of(bn, "running_var").to_vector<float>(), (std::vector<float>{1.0f, 4.0f}));
  EXPECT_EQ(tensor_of(bn, "num_batches_tracked").to_vector<int32_t>(), std::vector<int32_t>{42});
}

}  // namespace
}  // namespace cumulus
