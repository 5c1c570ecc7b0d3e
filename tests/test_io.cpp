// IO: safetensors round trips on every device (dtypes, scalars, empty tensors, metadata, order),
// the exact bytes of a small file (what PyTorch's safetensors reads), every malformed file as an
// Error naming the file and the fault, atomic writes, and a SeedMLP state dict that survives a
// save and load bit for bit.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cumulus/autograd/grad_mode.h"
#include "cumulus/core/error.h"
#include "cumulus/io/safetensors.h"
#include "cumulus/memory/category.h"
#include "cumulus/tensor/random.h"
#include "models/mlp.h"
#include "test_util.h"

namespace cumulus {
namespace {

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
      {"unknown_dtype", make_file(R"({"w": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", eight),
       {"'w'", "F64"}},
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
       make_file(R"({"w": {"dtype": "U8", "shape": [1,1,1,1,8], "data_offsets": [0, 8]}})", eight),
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
  expect_error([&] { load_safetensors(missing); }, {missing, "No such file"});
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
  expect_error([&] { save_safetensors(nowhere, {{"w", Tensor::full({4}, 2.0f)}}); }, {nowhere + ".tmp"});
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

}  // namespace
}  // namespace cumulus
