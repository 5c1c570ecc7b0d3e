// IO: safetensors round trips on every device (dtypes, scalars, empty tensors, metadata, order),
// the exact bytes of a small file (what PyTorch's safetensors reads), every malformed file as an
// Error naming the file and the fault, atomic writes, and a SeedMLP state dict that survives a
// save and load bit for bit.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cumulus/autograd/grad_mode.h"
#include "cumulus/core/error.h"
#include "cumulus/io/checksum.h"
#include "cumulus/io/file.h"
#include "cumulus/io/safetensors.h"
#include "cumulus/memory/category.h"
#include "cumulus/models/mlp.h"
#include "cumulus/tensor/random.h"
#include "test_util.h"

namespace cumulus {
namespace {

using cumulus::testing::expect_returns_promptly;

namespace fs = std::filesystem;
using io::load_safetensors;
using io::NamedTensors;
using io::save_safetensors;
using testing::DeviceTest;

using testing::TempDir;

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

std::string le64(uint64_t n) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return s;
}

// A safetensors file by hand: the header length, the header text as given, the data.
std::string make_file(const std::string& header, const std::string& data) { return le64(header.size()) + header + data; }

template <typename Fn>
void expect_error(Fn fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no exception; expected an Error mentioning '" << parts.back() << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a cumulus::Error: " << e.what();
  }
}

// ---- round trips -----------------------------------------------------------------------------

class SafetensorsTest : public DeviceTest {};

TEST_P(SafetensorsTest, RoundTripDtypesShapesMetadataOrder) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  const std::vector<float> wv = {1.5f, -2.25f, 3.0e-38f, -0.0f, 1e30f, 7.0f};
  const std::vector<int32_t> iv = {-2147483647 - 1, -1, 0, 2147483647};
  const std::vector<uint8_t> uv = {0, 1, 127, 128, 255};
  // Deliberately not alphabetical: the file keeps the given order.
  const NamedTensors tensors = {
      {"z.weight", Tensor::from_vector(wv, {2, 3}, device())},
      {"labels", Tensor::from_vector(iv, {4}, device())},
      {"pixels", Tensor::from_vector(uv, {5, 1, 1, 1}, device())},
      {"scalar", Tensor::from_vector(std::vector<float>{42.5f}, Shape(), device())},
      {"empty", Tensor::from_vector(std::vector<float>{}, {0, 3}, device())},
  };
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"epoch", "3"}, {"note", "\"quoted\" é"}};
  save_safetensors(path, tensors, meta);

  for (const Device target : {device(), Device::cpu()}) {
    MemoryCategoryScope scope(MemoryCategory::parameters);
    const io::SafetensorsContents c = load_safetensors(path, target);
    EXPECT_EQ(c.metadata, meta);
    ASSERT_EQ(c.tensors.size(), tensors.size());
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const auto& [name, t] = c.tensors[i];
      EXPECT_EQ(name, tensors[i].first) << "file order of data offsets = the order given to save";
      EXPECT_EQ(t.shape(), tensors[i].second.shape()) << name;
      EXPECT_EQ(t.dtype(), tensors[i].second.dtype()) << name;
      EXPECT_EQ(t.device(), target) << name;
      if (t.numel() > 0) EXPECT_EQ(t.memory_category(), MemoryCategory::parameters) << "the scope's category";
    }
    // Bit-exact (memcmp also tells -0.0 from 0.0).
    const auto w = c.tensors[0].second.to_vector<float>();
    EXPECT_EQ(std::memcmp(w.data(), wv.data(), wv.size() * sizeof(float)), 0);
    EXPECT_EQ(c.tensors[1].second.to_vector<int32_t>(), iv);
    EXPECT_EQ(c.tensors[2].second.to_vector<uint8_t>(), uv);
    EXPECT_EQ(c.tensors[3].second.ndim(), 0);
    EXPECT_EQ(c.tensors[3].second.item(), 42.5f);
    EXPECT_EQ(c.tensors[4].second.numel(), 0);
  }
}

TEST_P(SafetensorsTest, NoTensorsNoMetadata) {
  TempDir dir;
  const std::string path = dir.file("empty.safetensors");
  save_safetensors(path, {});
  const io::SafetensorsContents c = load_safetensors(path, device());
  EXPECT_TRUE(c.tensors.empty());
  EXPECT_TRUE(c.metadata.empty());
  EXPECT_EQ(read_file(path), le64(8) + "{}      ");
}

TEST_P(SafetensorsTest, SeedMLPStateDictRoundTrips) {
  TempDir dir;
  const std::string path = dir.file("mlp.safetensors");
  Generator g1(1), g2(2), gx(3);
  models::SeedMLP a(g1, device()), b(g2, device());
  const Tensor x = uniform({5, 784}, 0.0f, 1.0f, gx, device());
  NoGradGuard no_grad;
  const std::vector<float> la = a(x).to_vector<float>();
  ASSERT_NE(b(x).to_vector<float>(), la) << "different seeds, different models (else the test proves nothing)";

  save_safetensors(path, a.named_parameters(), {{"format", "pt"}});
  const io::SafetensorsContents c = load_safetensors(path, device());
  const auto params = b.named_parameters();
  ASSERT_EQ(c.tensors.size(), params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(c.tensors[i].first, params[i].first) << "PyTorch state_dict names, in order";
    Tensor p = params[i].second;
    p.copy_from(c.tensors[i].second);
  }
  const std::vector<float> lb = b(x).to_vector<float>();
  EXPECT_EQ(lb, la) << "logits match exactly after loading the state dict";
}

CUMULUS_INSTANTIATE_DEVICES(SafetensorsTest);

// ---- the bytes on disk -----------------------------------------------------------------------

TEST(Safetensors, ByteLevelFormat) {
  TempDir dir;
  const std::string path = dir.file("tiny.safetensors");
  const std::vector<float> bv = {1.0f, -2.5f};
  save_safetensors(path,
                   {{"b", Tensor::from_vector(bv, {2})},
                    {"a", Tensor::from_vector(std::vector<int32_t>{258}, {1, 1})}},
                   {{"k", "v"}});
  const std::string bytes = read_file(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  EXPECT_EQ(n % 8, 0u) << "the header is padded to a multiple of 8 bytes";
  ASSERT_EQ(bytes.size(), 8 + n + 12) << "length, header, 8 + 4 data bytes";
  const std::string header = bytes.substr(8, n);
  const auto last = header.find_last_not_of(' ');
  ASSERT_NE(last, std::string::npos);
  EXPECT_EQ(header[last], '}') << "padding is spaces after the JSON";
  EXPECT_LT(header.size() - last - 1, 8u) << "no more padding than needed";

  const nlohmann::json j = nlohmann::json::parse(header);
  const nlohmann::json expected = {
      {"__metadata__", {{"k", "v"}}},
      {"b", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}},
      {"a", {{"dtype", "I32"}, {"shape", {1, 1}}, {"data_offsets", {8, 12}}}},
  };
  EXPECT_EQ(j, expected) << j.dump();

  // The data: little-endian f32 1.0 = 0x3f800000, -2.5 = 0xc0200000, then i32 258 = 0x102.
  const std::string data = bytes.substr(8 + n);
  const std::string want("\x00\x00\x80\x3f\x00\x00\x20\xc0\x02\x01\x00\x00", 12);
  EXPECT_EQ(data, want);
}

TEST(Safetensors, ReadsAHandWrittenFile) {
  // Keys in any order, metadata last, no padding, compact or spaced JSON: all valid.
  TempDir dir;
  const std::string path = dir.file("hand.safetensors");
  const std::string header =
      R"({ "y": {"shape": [], "data_offsets": [4, 5], "dtype": "U8"}, )"
      R"("x": {"data_offsets": [0, 4], "dtype": "F32", "shape": [1]}, "__metadata__": {"a": "b"} })";
  write_raw(path, make_file(header, std::string("\x00\x00\xc0\x3f\x07", 5)));
  const io::SafetensorsContents c = load_safetensors(path);
  ASSERT_EQ(c.tensors.size(), 2u);
  EXPECT_EQ(c.tensors[0].first, "x") << "in data order";
  EXPECT_EQ(c.tensors[0].second.to_vector<float>(), std::vector<float>{1.5f});
  EXPECT_EQ(c.tensors[1].first, "y");
  EXPECT_EQ(c.tensors[1].second.ndim(), 0);
  EXPECT_EQ(c.tensors[1].second.to_vector<uint8_t>(), std::vector<uint8_t>{7});
  EXPECT_EQ(c.metadata, (std::map<std::string, std::string>{{"a", "b"}}));
}

// ---- malformed files -------------------------------------------------------------------------

struct Malformed {
  const char* name;
  std::string bytes;
  std::vector<std::string> message;  // besides the path
};

TEST(Safetensors, MalformedFilesAreErrorsNamingTheFile) {
  const std::string f32x2 = R"("w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";
  const std::string eight(8, '\x01');
  const std::vector<Malformed> cases = {
      {"empty", "", {"too short"}},
      {"short", std::string("\x05\x00\x00", 3), {"too short", "3 bytes"}},
      {"header_past_end", le64(1000) + "{}", {"header length 1000", "past the end"}},
      {"header_absurd", le64(uint64_t(1) << 40) + "{}", {"absurd"}},
      {"bad_json", make_file("{\"w\": {", ""), {"not valid JSON"}},
      {"not_object", make_file("[1, 2]", ""), {"not a JSON object"}},
      {"unknown_dtype", make_file(R"({"w": {"dtype": "I16", "shape": [4], "data_offsets": [0, 8]}})", eight),
       {"'w'", "unsupported dtype \"I16\""}},
      {"size_mismatch", make_file(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", eight),
       {"'w'", "size mismatch", "12", "8"}},
      {"out_of_range", make_file("{" + f32x2 + "}", std::string(4, '\x01')), {"'w'", "out of range"}},
      {"offsets_reversed", make_file(R"({"w": {"dtype": "U8", "shape": [0], "data_offsets": [8, 0]}})", eight),
       {"'w'", "begin is past end"}},
      {"overlap",
       make_file("{" + f32x2 + R"(, "v": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                 std::string(12, '\x01')),
       {"'v'", "overlap", "'w'"}},
      {"gap",
       make_file("{" + f32x2 + R"(, "v": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]}})",
                 std::string(16, '\x01')),
       {"'v'", "gap"}},
      {"trailing_bytes", make_file("{" + f32x2 + "}", std::string(12, '\x01')), {"trailing bytes"}},
      {"duplicate_name", make_file("{" + f32x2 + ", " + f32x2 + "}", eight), {"'w'", "duplicate"}},
      {"missing_field", make_file(R"({"w": {"dtype": "F32", "shape": [2]}})", eight), {"'w'", "data_offsets"}},
      {"negative_dim", make_file(R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", eight),
       {"'w'", "non-negative"}},
      {"too_many_dims",
       make_file(R"({"w": {"dtype": "U8", "shape": [1,1,1,1,1,1,1,1,8], "data_offsets": [0, 8]}})", eight),
       {"'w'", "dimensions"}},
      {"metadata_not_string", make_file(R"({"__metadata__": {"epoch": 3}})", ""), {"metadata", "epoch"}},
  };
  TempDir dir;
  for (const Malformed& m : cases) {
    SCOPED_TRACE(m.name);
    const std::string path = dir.file(std::string(m.name) + ".safetensors");
    write_raw(path, m.bytes);
    std::vector<std::string> parts = m.message;
    parts.insert(parts.begin(), path);
    expect_error([&] { load_safetensors(path); }, parts);
  }
  const std::string missing = dir.file("missing.safetensors");
  expect_error([&] { load_safetensors(missing); }, {missing, "not found"});
}

// ---- hostile headers (Note [Hostile headers] in engine/io/safetensors.cpp) ---------------------

// `open` repeated n times, then `middle`, then `close` n times.
std::string nest(const std::string& open, const std::string& middle, const std::string& close, int n) {
  std::string s;
  s.reserve((open.size() + close.size()) * static_cast<std::size_t>(n) + middle.size());
  for (int i = 0; i < n; ++i) s += open;
  s += middle;
  for (int i = 0; i < n; ++i) s += close;
  return s;
}

// Runs `fn`, expecting an Error that names `path`, quickly and in a message of bounded length.
template <typename Fn>
void expect_short_error(Fn fn, const std::string& path, const std::vector<std::string>& parts) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    fn();
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_LE(msg.size(), 300u + path.size()) << msg.substr(0, 1000);
    EXPECT_NE(msg.find(path), std::string::npos) << msg.substr(0, 1000);
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
}

TEST(Safetensors, DeepNestingIsRefusedBeforeParsing) {
  // 100,000 levels overflowed the stack in the JSON library's recursive dump on the error path;
  // 50,000 made a 100 KB message. Every place a value can sit is tried.
  TempDir dir;
  for (const int depth : {100000, 50000, 9}) {
    const std::string deep = nest("[", "1", "]", depth);
    const std::vector<std::pair<std::string, std::string>> headers = {
        {"shape", R"({"w": {"dtype": "F32", "shape": )" + deep + R"(, "data_offsets": [0, 4]}})"},
        {"dtype", R"({"w": {"dtype": )" + deep + R"(, "shape": [1], "data_offsets": [0, 4]}})"},
        {"offsets", R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": )" + deep + "}}"},
        {"metadata", R"({"__metadata__": {"epoch": )" + deep + "}}"},
        {"objects", nest(R"({"a": )", "1", "}", depth)},
        {"entry", R"({"w": )" + deep + "}"},
    };
    for (const auto& [name, header] : headers) {
      SCOPED_TRACE(name + " " + std::to_string(depth));
      const std::string path = dir.file(name + ".safetensors");
      write_raw(path, make_file(header, std::string(4, '\0')));
      expect_short_error([&] { load_safetensors(path); }, path, {"more than 8 deep"});
    }
  }
}

TEST(Safetensors, DepthCountsOnlyBracketsOutsideStrings) {
  // Brackets inside strings (escaped quotes and backslashes included) are text, not nesting.
  TempDir dir;
  const std::string path = dir.file("strings.safetensors");
  // Ends in an escaped backslash, so the quote after it closes the string.
  const std::string text = std::string(40, '[') + R"(\" [[[[[[[[[ )" + std::string(20, '{') + R"(\\)";
  const std::string valid =
      R"({"__metadata__": {")" + text + R"(": ")" + text + R"("}, "w": {"dtype": "U8", "shape": [1], )"
      R"("data_offsets": [0, 1]}})";
  write_raw(path, make_file(valid, std::string(1, '\x07')));
  const io::SafetensorsContents c = load_safetensors(path);
  ASSERT_EQ(c.metadata.size(), 1u);
  EXPECT_EQ(c.metadata.begin()->second, std::string(40, '[') + R"(" [[[[[[[[[ )" + std::string(20, '{') + "\\");
}

TEST(Safetensors, MessagesQuoteAtMostAnExcerptOfTheFile) {
  TempDir dir;
  const std::string long_name(100000, 'n');
  const std::string wide = "[" + std::string(200000, '1') + "]";
  std::string many = "[";
  for (int i = 0; i < 100000; ++i) many += (i ? ",7" : "7");
  many += "]";
  const std::vector<std::pair<std::string, std::string>> headers = {
      {"wide_shape", R"({"w": {"dtype": "F32", "shape": )" + wide + R"(, "data_offsets": [0, 4]}})"},
      {"long_shape", R"({"w": {"dtype": "F32", "shape": )" + many + R"(, "data_offsets": [0, 4]}})"},
      {"long_dtype", R"({"w": {"dtype": ")" + long_name + R"(", "shape": [1], "data_offsets": [0, 4]}})"},
      {"dtype_not_string", R"({"w": {"dtype": )" + many + R"(, "shape": [1], "data_offsets": [0, 4]}})"},
      {"long_offsets", R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": )" + many + "}}"},
      {"long_metadata", R"({"__metadata__": {")" + long_name + R"(": )" + many + "}}"},
      {"long_tensor_name", R"({")" + long_name + R"(": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})"},
      {"long_checksum", R"({"__metadata__": {"checksum_crc32": ")" + long_name + R"("}})"},
      {"long_duplicate", R"({")" + long_name + R"(": 1, ")" + long_name + R"(": 2})"},
  };
  for (const auto& [name, header] : headers) {
    SCOPED_TRACE(name);
    const std::string path = dir.file(name + ".safetensors");
    // No data for the checksum case: with none the trailing-bytes check passes and the value is read.
    write_raw(path, make_file(header, std::string(name == "long_checksum" ? 0 : 4, '\0')));
    expect_short_error([&] { load_safetensors(path); }, path, {});
  }
  EXPECT_EQ(excerpt(std::string(10, 'x')), std::string(10, 'x'));
  EXPECT_EQ(excerpt(std::string(100, 'x')), std::string(80, 'x') + "...");
  EXPECT_EQ(excerpt(std::string(79, 'x') + "\xc3\xa9" + "yz"), std::string(79, 'x') + "...")
      << "never cut inside a UTF-8 character";
}

TEST(Safetensors, OnlyRegularFilesAreRead) {
  TempDir dir;
  const std::string fifo = dir.file("weights.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  expect_returns_promptly(fifo, [&] {
    expect_error([&] { load_safetensors(fifo); }, {fifo, "is a FIFO, not a regular file"});
  });
  const std::string sub = dir.file("checkpoint.safetensors");
  fs::create_directories(sub);
  expect_error([&] { load_safetensors(sub); }, {sub, "is a directory, not a regular file"});
  if (fs::exists("/dev/zero"))
    expect_error([&] { load_safetensors("/dev/zero"); }, {"/dev/zero", "is a character device, not a regular file"});
}

// ---- stored dtypes (Note [Dtypes read] in engine/io/safetensors.cpp) ---------------------------

template <typename T>
std::string raw_bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

std::string one_tensor_header(const std::string& dtype, std::size_t n, std::size_t bytes) {
  return R"({"t": {"dtype": ")" + dtype + R"(", "shape": [)" + std::to_string(n) + R"(], "data_offsets": [0, )" +
         std::to_string(bytes) + "]}}";
}

// The value of a binary16 by its definition, independently of the loader's bit manipulation.
double half_value(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  const double mag = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  return sign ? -mag : mag;
}

// F16 loads as f16, the bits as stored, and saves back as F16; widened to f32 (Tensor::to), every
// one of the 65536 patterns is exactly its value.
TEST(Safetensors, F16LoadsAsStoredAndWidensExactly) {
  TempDir dir;
  const std::string path = dir.file("half.safetensors"), again = dir.file("again.safetensors");
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  write_raw(path, make_file(one_tensor_header("F16", all.size(), 2 * all.size()), raw_bytes(all)));
  const io::SafetensorsContents c = load_safetensors(path);
  ASSERT_EQ(c.tensors.size(), 1u);
  const Tensor& t = c.tensors[0].second;
  ASSERT_EQ(t.dtype(), DType::f16);
  ASSERT_EQ(t.shape(), Shape({65536}));
  EXPECT_EQ(std::memcmp(t.raw_data(), all.data(), 2 * all.size()), 0);
  save_safetensors(again, c.tensors);
  EXPECT_NE(read_file(again).find(R"("dtype":"F16")"), std::string::npos);
  const Tensor back = load_safetensors(again).tensors.at(0).second;
  ASSERT_EQ(back.dtype(), DType::f16);
  EXPECT_EQ(std::memcmp(back.raw_data(), all.data(), 2 * all.size()), 0);
  const auto v = t.to(DType::f32).to_vector<float>();
  for (uint32_t h = 0; h < 65536; ++h) {
    const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    uint32_t bits;
    std::memcpy(&bits, &v[h], 4);
    ASSERT_EQ(bits >> 31, h >> 15) << "sign of half 0x" << std::hex << h;
    if (exp == 0x1f && mant == 0) {
      ASSERT_TRUE(std::isinf(v[h])) << std::hex << h;
    } else if (exp == 0x1f) {
      ASSERT_TRUE(std::isnan(v[h])) << std::hex << h;
      ASSERT_EQ((bits >> 13) & 0x3ff, static_cast<uint32_t>(mant)) << "NaN payload of half 0x" << std::hex << h;
    } else {
      ASSERT_EQ(static_cast<double>(v[h]), half_value(static_cast<uint16_t>(h))) << "half 0x" << std::hex << h;
    }
  }
  // Spot checks by value: 1, -2, the largest half, the smallest subnormal and normal, -0.
  EXPECT_EQ(v[0x3c00], 1.0f);
  EXPECT_EQ(v[0xc000], -2.0f);
  EXPECT_EQ(v[0x7bff], 65504.0f);
  EXPECT_EQ(v[0x0001], std::ldexp(1.0f, -24));
  EXPECT_EQ(v[0x03ff], std::ldexp(1023.0f, -24));
  EXPECT_EQ(v[0x0400], std::ldexp(1.0f, -14));
  EXPECT_TRUE(v[0x8000] == 0.0f && std::signbit(v[0x8000]));
  EXPECT_EQ(v[0xfc00], -INFINITY);
}

TEST(Safetensors, F64LoadsAsF32RoundedToNearest) {
  TempDir dir;
  const std::string path = dir.file("double.safetensors");
  const double tie = 1.0 + std::ldexp(1.0, -24);       // halfway between 1 and the next float: to even
  const double above = 1.0 + 3 * std::ldexp(1.0, -25);  // nearer the next float
  const std::vector<double> d = {1.0, 0.1, -2.5, tie, above, 1e300, -1e300, 1e-50, NAN, -0.0, 3.4028234663852886e38};
  write_raw(path, make_file(one_tensor_header("F64", d.size(), 8 * d.size()), raw_bytes(d)));
  const Tensor t = load_safetensors(path).tensors.at(0).second;
  ASSERT_EQ(t.dtype(), DType::f32);
  const auto v = t.to_vector<float>();
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], 0.1f);
  EXPECT_EQ(v[2], -2.5f);
  EXPECT_EQ(v[3], 1.0f) << "ties go to even";
  EXPECT_EQ(v[4], 1.0f + std::ldexp(1.0f, -23));
  EXPECT_EQ(v[5], INFINITY);
  EXPECT_EQ(v[6], -INFINITY);
  EXPECT_EQ(v[7], 0.0f);
  EXPECT_TRUE(std::isnan(v[8]));
  EXPECT_TRUE(v[9] == 0.0f && std::signbit(v[9]));
  EXPECT_EQ(v[10], std::numeric_limits<float>::max());
}

TEST(Safetensors, I64LoadsAsI32RangeChecked) {
  TempDir dir;
  const std::string path = dir.file("long.safetensors");
  const std::vector<int64_t> ok = {0, -5, 7, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
  write_raw(path, make_file(one_tensor_header("I64", ok.size(), 8 * ok.size()), raw_bytes(ok)));
  const Tensor t = load_safetensors(path).tensors.at(0).second;
  ASSERT_EQ(t.dtype(), DType::i32);
  EXPECT_EQ(t.to_vector<int32_t>(), (std::vector<int32_t>{0, -5, 7, std::numeric_limits<int32_t>::min(),
                                                          std::numeric_limits<int32_t>::max()}));
  for (const int64_t bad : {int64_t(1) << 31, -(int64_t(1) << 31) - 1, std::numeric_limits<int64_t>::min()}) {
    const std::vector<int64_t> v = {1, 2, bad, 4};
    write_raw(path, make_file(one_tensor_header("I64", v.size(), 8 * v.size()), raw_bytes(v)));
    expect_error([&] { load_safetensors(path); }, {path, "'t'", "I64 value " + std::to_string(bad), "index 2"});
  }
}

TEST(Safetensors, BF16LoadsAsRawBitsAndSavesBack) {
  TempDir dir;
  const std::string path = dir.file("bf16.safetensors"), again = dir.file("again.safetensors");
  const std::vector<uint16_t> bits = {0x3f80, 0xc000, 0x7f80, 0x7fc1, 0x0001, 0x8000};
  write_raw(path, make_file(one_tensor_header("BF16", bits.size(), 2 * bits.size()), raw_bytes(bits)));
  const io::SafetensorsContents c = load_safetensors(path);
  const Tensor& t = c.tensors.at(0).second;
  ASSERT_EQ(t.dtype(), DType::bf16);
  ASSERT_EQ(t.shape(), Shape({6}));
  ASSERT_EQ(t.nbytes(), 12u);
  EXPECT_EQ(std::memcmp(t.raw_data(), bits.data(), 12), 0);
  save_safetensors(again, c.tensors);
  const std::string saved = read_file(again);
  EXPECT_NE(saved.find(R"("dtype":"BF16")"), std::string::npos) << saved;
  const Tensor back = load_safetensors(again).tensors.at(0).second;
  ASSERT_EQ(back.dtype(), DType::bf16);
  EXPECT_EQ(std::memcmp(back.raw_data(), bits.data(), 12), 0);
}

TEST(Safetensors, ChecksumCoversTheStoredBytesUnderTheStoredDtype) {
  // Note [Checksum] over an F16 tensor: the name "F16" and the two-byte values as stored.
  TempDir dir;
  const std::string path = dir.file("half_checked.safetensors");
  const std::vector<uint16_t> h = {0x3c00, 0x7e00, 0x0001};
  const std::string data = raw_bytes(h);
  auto field = [](const std::string& s) { return s + std::string(1, '\0'); };
  const std::string canonical = field("t") + field("F16") + field("[3]") + field("format") + field("pt") + data;
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, reinterpret_cast<const Bytef*>(canonical.data()), static_cast<uInt>(canonical.size()));
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08lx", static_cast<unsigned long>(crc & 0xffffffffu));
  const std::string header = std::string(R"({"__metadata__": {"format": "pt", "checksum_crc32": ")") + hex +
                             R"("}, "t": {"dtype": "F16", "shape": [3], "data_offsets": [0, 6]}})";
  write_raw(path, make_file(header, data));
  const auto v = load_safetensors(path).tensors.at(0).second.to(DType::f32).to_vector<float>();
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_TRUE(std::isnan(v[1]));
  std::string flipped = data;
  flipped[0] ^= 1;
  write_raw(path, make_file(header, flipped));
  expect_error([&] { load_safetensors(path); }, {path, "checksum mismatch"});
}

TEST(Safetensors, SaveRejectsBadInput) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  const Tensor t = Tensor::zeros({2});
  expect_error([&] { save_safetensors(path, {{"a", t}, {"b", t}, {"a", t}}); }, {path, "'a'", "duplicate"});
  expect_error([&] { save_safetensors(path, {{"__metadata__", t}}); }, {path, "reserved"});
  expect_error([&] { save_safetensors(path, {{"u", Tensor()}}); }, {path, "'u'", "undefined"});
  EXPECT_TRUE(dir.entries().empty()) << "nothing written";
}

// ---- atomic writes ---------------------------------------------------------------------------

TEST(Safetensors, FailedSavesLeaveNoTraceAndTheTargetUnchanged) {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  save_safetensors(path, {{"w", Tensor::full({4}, 1.0f)}});
  const std::string before = read_file(path);
  ASSERT_FALSE(before.empty());

  // 1. A save into a directory that does not exist.
  const std::string nowhere = dir.file("no/such/dir/model.safetensors");
  expect_error([&] { save_safetensors(nowhere, {{"w", Tensor::full({4}, 2.0f)}}); }, {nowhere, "temporary"});
  // 2. A save refused before writing (duplicate names) over the existing target.
  EXPECT_THROW(save_safetensors(path, {{"w", Tensor::full({4}, 3.0f)}, {"w", Tensor::full({4}, 3.0f)}}), Error);
  // 3. A write that fails midway: the file size limit makes write() fail with EFBIG after the
  //    temporary file was created (SIGXFSZ ignored so the process survives).
  {
    rlimit old{};
    ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
    auto* previous = std::signal(SIGXFSZ, SIG_IGN);
    rlimit small = old;
    small.rlim_cur = 4096;
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
    bool threw = false;
    std::string what;
    try {
      save_safetensors(path, {{"w", Tensor::full({1 << 16}, 4.0f)}});  // 256 KiB of data
    } catch (const Error& e) {
      threw = true;
      what = e.what();
    }
    setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, previous);
    EXPECT_TRUE(threw) << "a write past the file size limit must fail";
    EXPECT_NE(what.find(path), std::string::npos) << what;
  }
  // 4. A target that cannot be replaced (a directory): the rename fails.
  const std::string blocked = dir.file("blocked");
  fs::create_directories(fs::path(blocked) / "inside");
  expect_error([&] { save_safetensors(blocked, {{"w", Tensor::full({4}, 5.0f)}}); }, {blocked});
  EXPECT_TRUE(fs::is_directory(fs::path(blocked) / "inside"));

  EXPECT_EQ(read_file(path), before) << "the existing file is untouched";
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"blocked", "model.safetensors"})) << "no temporary files";
  EXPECT_EQ(load_safetensors(path).tensors.at(0).second.to_vector<float>(), std::vector<float>(4, 1.0f));
}

// Issue 30 item 1: the temporary file of an atomic write is created under a name no one can plant
// in advance, and never through an existing file or link. A link at the name earlier versions
// used ("<target>.tmp.<pid>", the pid being public) must not receive the write.
TEST(AtomicWrite, APlantedLinkAtTheTemporaryNameIsNeverWrittenThrough) {
  TempDir dir;
  const std::string target = dir.file("w.safetensors"), victim = dir.file("victim");
  write_raw(victim, "precious");
  fs::create_symlink(victim, target + ".tmp." + std::to_string(::getpid()));
  for (int i = 0; i < 3; ++i) io::write_file_atomic(target, "weights " + std::to_string(i));
  EXPECT_EQ(read_file(victim), "precious") << "the write went through the planted link";
  EXPECT_EQ(read_file(target), "weights 2");
  EXPECT_FALSE(fs::is_symlink(target)) << "the target became a link";
  const std::vector<std::string> left = dir.entries();
  EXPECT_EQ(left.size(), 3u) << "only the target, the victim and the planted link; no temporary left";
}

// Issue 30 item 4: replacing a file keeps its permissions; a new file gets 0666 less the umask.
TEST(AtomicWrite, ReplacingAFileKeepsItsModeAndNewFilesFollowTheUmask) {
  TempDir dir;
  const std::string target = dir.file("private.safetensors");
  auto mode_of = [](const std::string& p) {
    struct stat st {};
    EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
    return st.st_mode & 07777;
  };
  const mode_t old_umask = ::umask(022);
  io::write_file_atomic(target, "one");
  EXPECT_EQ(mode_of(target), 0644u);
  for (const mode_t mode : {0600u, 0640u, 0444u, 0660u}) {
    ASSERT_EQ(::chmod(target.c_str(), mode), 0);
    io::write_file_atomic(target, "two");
    EXPECT_EQ(mode_of(target), mode) << std::oct << "a 0" << mode << " file was given another mode";
  }
  ::umask(077);
  io::write_file_atomic(dir.file("new"), "three");
  EXPECT_EQ(mode_of(dir.file("new")), 0600u);
  ::umask(old_umask);
}

// Issue 30 item 2: start-up clean-up removes only a dead writer's temporary of this host, by the
// exact name form the writer uses; a user's files with similar names, a live writer's and another
// host's temporaries stay.
TEST(AtomicWrite, CleanUpRemovesOnlyDeadWritersTemporariesOfThisHost) {
  TempDir dir;
  const std::string target = dir.file("w.st");
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const std::string ours_dead = io::temp_path_for(target, dead, 0x1234abcd);
  const std::string ours_live = io::temp_path_for(target, ::getpid(), 0x1234abcd);
  std::string other_host = ours_dead;
  const std::size_t host_at = other_host.find(".cumulus-tmp.") + 13;
  other_host[host_at] = other_host[host_at] == '0' ? '1' : '0';
  const std::vector<std::string> kept = {target + ".tmp." + std::to_string(dead),  // a user's own file
                                         target + ".cumulus-tmp.notes", ours_live, other_host, ours_dead + "x"};
  for (const std::string& p : kept) write_raw(p, "mine");
  write_raw(ours_dead, "half a file");
  EXPECT_EQ(io::remove_stale_temp_files(target), 1);
  EXPECT_FALSE(fs::exists(ours_dead));
  for (const std::string& p : kept) EXPECT_EQ(read_file(p), "mine") << p << " was removed";
}

// ---- checksums -----------------------------------------------------------------------------------

// The sums of FIPS 180-2's examples ("abc", the empty message), and a file named with a quote and a
// space (the name reaches sha256sum as one shell word); a missing file is an Error naming it.
// A log appended to a line at a time: a symlink or FIFO swapped in at its name after it was
// created is refused, its target untouched; writes land at the end.
TEST(AppendFile, AddsToTheEndAndNeverThroughALinkOrAFifoSwappedIn) {
  TempDir dir;
  const std::string log = dir.file("m.jsonl"), victim = dir.file("victim");
  io::write_file_atomic(log, "line 1\n");
  {
    io::AppendFile out(log);
    out.write("line 2\n");
  }
  EXPECT_EQ(read_file(log), "line 1\nline 2\n");
  write_raw(victim, "precious");
  fs::remove(log);
  fs::create_symlink(victim, log);
  EXPECT_THROW(
      {
        try {
          io::AppendFile out(log);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("symbolic link"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  EXPECT_EQ(read_file(victim), "precious");
  fs::remove(log);
  ASSERT_EQ(::mkfifo(log.c_str(), 0600), 0);
  EXPECT_THROW(io::AppendFile{log}, Error);  // no reader: refused at once, never a hang
}

TEST(Checksum, Sha256OfFiles) {
  if (!io::program_on_path("sha256sum")) GTEST_SKIP() << "no sha256sum";
  TempDir dir;
  const std::string abc = dir.file("it's abc"), empty = dir.file("empty");
  std::ofstream(abc, std::ios::binary) << "abc";
  std::ofstream(empty, std::ios::binary).flush();
  EXPECT_EQ(io::sha256_of_file(abc), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(io::sha256_of_file(empty), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const std::string missing = dir.file("missing");
  try {
    io::sha256_of_file(missing);
    ADD_FAILURE() << "the sum of a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
}

TEST(Checksum, ProgramOnPathIsAnExecutableFileInAPathDirectory) {
  TempDir dir;
  const std::string tool = dir.file("cumulus-tool"), plain = dir.file("cumulus-plain");
  std::ofstream(tool) << "#!/bin/sh\n";
  std::ofstream(plain) << "not a program\n";
  ASSERT_EQ(::chmod(tool.c_str(), 0755), 0);
  ASSERT_EQ(::chmod(plain.c_str(), 0644), 0);
  const char* saved = std::getenv("PATH");
  const std::string old_path = saved ? saved : "";
  ::setenv("PATH", ("/nonexistent:" + dir.str()).c_str(), 1);
  const bool tool_found = io::program_on_path("cumulus-tool"), plain_found = io::program_on_path("cumulus-plain"),
             absent_found = io::program_on_path("cumulus-absent");
  ::setenv("PATH", old_path.c_str(), 1);
  EXPECT_TRUE(tool_found);
  EXPECT_FALSE(plain_found) << "not executable";
  EXPECT_FALSE(absent_found);
}

}  // namespace
}  // namespace cumulus
