// Data: the IDX reader (plain and gzip; every malformed-file case is an Error naming the file and
// the fault, and a header's claim is never trusted for an allocation), MNIST-format splits, and
// the DataLoader (order, last partial batch, exact pixel / 255, per-(seed, epoch) shuffles,
// category data), on every device; TensorDataset's any-shape f32 / i64 / u8 tensors through the
// same loader (shuffles, host and device residency, batch dtypes, errors naming the tensors). Plus facts about the real
// Fashion-MNIST files when present.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cumulus/core/error.h"
#if CUMULUS_WITH_CUDA
#include "engine/core/cuda_context.h"
#endif
#include "cumulus/data/dataset.h"
#include "cumulus/data/idx.h"
#include "cumulus/memory/category.h"
#include "cumulus/models/fashion_mnist.h"
#include "engine/data/loader_access.h"
#include "test_util.h"

namespace cumulus {
namespace {

using cumulus::testing::expect_returns_promptly;

namespace fs = std::filesystem;
using data::DataLoader;
using models::FashionMnistSplit;
using testing::DeviceTest;

// ---- helpers ---------------------------------------------------------------------------------

using testing::TempDir;

using Bytes = std::vector<uint8_t>;

// An IDX file's bytes: 0x00 0x00, type, ndim, big-endian u32 dims, then the payload.
Bytes idx_bytes(const std::vector<uint32_t>& dims, const Bytes& payload, uint8_t type = 0x08) {
  Bytes b = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(d >> s));
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}

void write_plain(const std::string& path, const Bytes& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

void write_gzip(const std::string& path, const Bytes& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(f), Z_OK);
}

Bytes read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Pixels of image i: pixel 0 is i (identifies the sample after a shuffle), the rest a pattern
// that covers all 256 values over a few images.
Bytes make_images(int n, int rows = 28, int cols = 28) {
  Bytes px(static_cast<std::size_t>(n) * rows * cols);
  for (int i = 0; i < n; ++i)
    for (int p = 0; p < rows * cols; ++p)
      px[static_cast<std::size_t>(i) * rows * cols + p] = static_cast<uint8_t>(p == 0 ? i : (i * 37 + p * 11) % 256);
  return px;
}
Bytes make_labels(int n) {
  Bytes l(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) l[i] = static_cast<uint8_t>((i * 3) % 10);
  return l;
}

// Writes an MNIST-format split into `dir` (gzip or plain).
void write_split(const TempDir& dir, bool train, int n_images, int n_labels, bool gzip) {
  const auto names = models::fashion_mnist_file_names(train);
  const std::string suffix = gzip ? ".gz" : "";
  const Bytes images = idx_bytes({uint32_t(n_images), 28, 28}, make_images(n_images));
  const Bytes labels = idx_bytes({uint32_t(n_labels)}, make_labels(n_labels));
  if (gzip) {
    write_gzip(dir.file(names[0] + suffix), images);
    write_gzip(dir.file(names[1] + suffix), labels);
  } else {
    write_plain(dir.file(names[0]), images);
    write_plain(dir.file(names[1]), labels);
  }
}

// Runs `fn`, expects a cumulus::Error whose message contains every one of `parts`.
template <typename Fn>
void expect_error(Fn fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no exception; expected an Error mentioning '" << parts.front() << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a cumulus::Error: " << e.what();
  }
}

// Batch i of the loader's epoch, read as every caller reads one: seek(i), then next(i).
data::Batch batch_at(DataLoader& loader, int64_t i) {
  loader.seek(i);
  return loader.next(i);
}

long max_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Writes `head` followed by `zeros` zero bytes as one gzip member, deflated piece by piece so the
// uncompressed data is never in memory: 100 MB of zeros become about 100 KB.
void write_gzip_of_zeros(const std::string& path, const Bytes& head, uint64_t zeros) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  z_stream z{};
  ASSERT_EQ(deflateInit2(&z, 9, Z_DEFLATED, 16 + MAX_WBITS, 9, Z_RLE), Z_OK);  // RLE: fast on zeros
  const Bytes piece(1 << 20, 0);
  std::vector<uint8_t> out(1 << 16);
  uint64_t left = zeros;
  bool first = true;
  for (;;) {
    const Bytes& in = first ? head : piece;
    const uInt n = first ? static_cast<uInt>(head.size()) : static_cast<uInt>(std::min<uint64_t>(left, piece.size()));
    if (!first) left -= n;
    first = false;
    const int flush = left == 0 ? Z_FINISH : Z_NO_FLUSH;
    z.next_in = const_cast<Bytef*>(in.data());
    z.avail_in = n;
    int rc;
    do {
      z.next_out = out.data();
      z.avail_out = static_cast<uInt>(out.size());
      rc = deflate(&z, flush);
      ASSERT_NE(rc, Z_STREAM_ERROR);
      std::fwrite(out.data(), 1, out.size() - z.avail_out, f);
    } while (z.avail_out == 0 || (flush == Z_FINISH && rc != Z_STREAM_END));
    if (flush == Z_FINISH) break;
  }
  deflateEnd(&z);
  ASSERT_EQ(std::fclose(f), 0);
}

// ---- read_idx_u8 -----------------------------------------------------------------------------

class IdxFormat : public ::testing::TestWithParam<bool> {  // param: gzip
 protected:
  std::string write(const TempDir& dir, const std::string& name, const Bytes& bytes) {
    const std::string path = dir.file(name + (GetParam() ? ".gz" : ""));
    if (GetParam()) write_gzip(path, bytes);
    else write_plain(path, bytes);
    return path;
  }
};

TEST_P(IdxFormat, ReadsDimsAndValues) {
  TempDir dir;
  const Bytes px = make_images(3, 4, 5);
  const std::string path = write(dir, "images", idx_bytes({3, 4, 5}, px));
  const data::IdxArray a = data::read_idx_u8(path, 3);
  EXPECT_EQ(a.dims, (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(a.values, px);

  const Bytes lb = make_labels(7);
  const data::IdxArray l = data::read_idx_u8(write(dir, "labels", idx_bytes({7}, lb)), 1);
  EXPECT_EQ(l.dims, (std::vector<int64_t>{7}));
  EXPECT_EQ(l.values, lb);
}

TEST_P(IdxFormat, LargeDimensionsAreBigEndian) {
  TempDir dir;
  // 300 = 0x012c: a little-endian reader would see 0x2c010000.
  const Bytes lb(300, 4);
  const data::IdxArray l = data::read_idx_u8(write(dir, "labels", idx_bytes({300}, lb)), 1);
  EXPECT_EQ(l.dims, (std::vector<int64_t>{300}));
  EXPECT_EQ(l.values.size(), 300u);
}

TEST_P(IdxFormat, TruncatedHeader) {
  TempDir dir;
  const Bytes full = idx_bytes({3, 4, 5}, make_images(3, 4, 5));
  for (std::size_t keep : {std::size_t(0), std::size_t(3), std::size_t(9)}) {
    const std::string path = write(dir, "images" + std::to_string(keep), Bytes(full.begin(), full.begin() + keep));
    expect_error([&] { data::read_idx_u8(path, 3); }, {path, "truncated header"});
  }
}

TEST_P(IdxFormat, TruncatedData) {
  TempDir dir;
  Bytes b = idx_bytes({3, 4, 5}, make_images(3, 4, 5));
  b.resize(b.size() - 1);
  const std::string path = write(dir, "images", b);
  expect_error([&] { data::read_idx_u8(path, 3); }, {path, "truncated", "60 bytes"});
}

TEST_P(IdxFormat, TrailingData) {
  TempDir dir;
  Bytes b = idx_bytes({3, 4, 5}, make_images(3, 4, 5));
  b.push_back(7);
  const std::string path = write(dir, "images", b);
  expect_error([&] { data::read_idx_u8(path, 3); }, {path, "trailing data", "61"});
}

TEST_P(IdxFormat, WrongMagic) {
  TempDir dir;
  Bytes b = idx_bytes({3}, make_labels(3));
  b[1] = 0x01;  // the first two bytes must be zero
  const std::string p1 = write(dir, "zero", b);
  expect_error([&] { data::read_idx_u8(p1, 1); }, {p1, "wrong magic", "0x00010801"});

  const std::string p2 = write(dir, "type", idx_bytes({3}, make_labels(3), /*type=*/0x0d));  // float
  expect_error([&] { data::read_idx_u8(p2, 1); }, {p2, "wrong magic", "0x00000d01", "unsigned byte"});
}

TEST_P(IdxFormat, WrongNumberOfDimensions) {
  TempDir dir;
  const std::string path = write(dir, "labels", idx_bytes({3}, make_labels(3)));
  expect_error([&] { data::read_idx_u8(path, 3); }, {path, "dimension mismatch", "1 dimensions, expected 3"});
}

TEST_P(IdxFormat, ZeroDimension) {
  TempDir dir;
  const std::string path = write(dir, "images", idx_bytes({0, 28, 28}, {}));
  expect_error([&] { data::read_idx_u8(path, 3); }, {path, "dimension 0 is 0"});
}

// A small file whose header claims 2^31 samples fails fast, without allocating the claim.
TEST_P(IdxFormat, HugeClaimIsRejectedWithoutAllocating) {
  TempDir dir;
  const long rss_before = max_rss_kib();
  const auto t0 = std::chrono::steady_clock::now();
  // 2 GiB of labels: allocatable, so an implementation that trusts the header would succeed in
  // allocating (and touching) it before finding the data short.
  const std::string labels = write(dir, "labels", idx_bytes({1u << 31}, make_labels(100)));
  expect_error([&] { data::read_idx_u8(labels, 1); }, {labels, "truncated", "2147483648"});
  // 2^31 images of 28 x 28 (1.7 TB): must be an Error, not std::bad_alloc.
  const std::string images = write(dir, "images", idx_bytes({1u << 31, 28, 28}, make_images(2)));
  expect_error([&] { data::read_idx_u8(images, 3); }, {images, "truncated"});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 0.5) << "rejecting a false claim should not take long";
  EXPECT_LT(max_rss_kib() - rss_before, 256 * 1024) << "peak memory grew by the header's claim";
}

INSTANTIATE_TEST_SUITE_P(Idx, IdxFormat, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "gzip" : "plain"; });

// Note [Allocate only what arrived] in engine/io/idx.cpp: a gzip file's claim is bounded by what
// the file can inflate to, and the data is never inflated past the claim.
TEST(Idx, GzipBombIsRefusedFastWithBoundedMemory) {
  TempDir dir;
  const std::string path = dir.file("bomb-images.gz");
  // The header claims 2^31 images of 28 x 28 (1.7 TB); 100 MB of zeros follow, about 100 KB gzipped.
  write_gzip_of_zeros(path, idx_bytes({1u << 31, 28, 28}, {}), uint64_t(100) << 20);
  EXPECT_LT(fs::file_size(path), uint64_t(1) << 20);
  const long rss_before = max_rss_kib();
  const auto t0 = std::chrono::steady_clock::now();
  expect_error([&] { data::read_idx_u8(path, 3); }, {path, "truncated or corrupt", "1032"});
  EXPECT_LT(seconds_since(t0), 2.0);
  EXPECT_LT(max_rss_kib() - rss_before, 32 * 1024) << "KiB: the data was inflated, not refused from the header";

  // A plausible claim (50,000 labels: 50 KB) over the same 100 MB: refused within one small read
  // past the claim, not after inflating it all.
  const std::string labels = dir.file("bomb-labels.gz");
  write_gzip_of_zeros(labels, idx_bytes({50000}, {}), uint64_t(100) << 20);
  const auto t1 = std::chrono::steady_clock::now();
  expect_error([&] { data::read_idx_u8(labels, 1); }, {labels, "unexpected trailing data", "more than 115536"});
  EXPECT_LT(seconds_since(t1), 0.5);
  EXPECT_LT(max_rss_kib() - rss_before, 32 * 1024) << "KiB";
}

// Issue 30 item 12: an images file and its labels file are checked against each other from their
// headers alone. A gzip whose claim is plausible for its size (200,000 images: 157 MB of zeros in
// about 150 KB) beside 512 labels is refused without inflating the images.
TEST(Idx, PairIsCheckedFromTheHeadersBeforeInflating) {
  TempDir dir;
  const std::string images = dir.file("images.gz"), labels = dir.file("labels.gz");
  write_gzip_of_zeros(images, idx_bytes({200000, 28, 28}, {}), uint64_t(200000) * 784);
  write_gzip(labels, idx_bytes({512}, make_labels(512)));
  EXPECT_EQ(data::read_idx_dims(images, 3), (std::vector<int64_t>{200000, 28, 28}));
  const long rss_before = max_rss_kib();
  const auto t0 = std::chrono::steady_clock::now();
  expect_error([&] { data::check_idx_pair(images, labels); }, {images, "200000 images", labels, "512 labels"});
  EXPECT_LT(seconds_since(t0), 0.2);
  EXPECT_LT(max_rss_kib() - rss_before, 32 * 1024) << "KiB: the images were inflated";
  // Headers that agree pass, and a header's own faults are reported as read_idx_u8 reports them.
  write_gzip(labels, idx_bytes({200000}, make_labels(200000)));
  EXPECT_NO_THROW(data::check_idx_pair(images, labels));
  write_gzip(labels, idx_bytes({1u << 31}, make_labels(10)));
  expect_error([&] { data::check_idx_pair(images, labels); }, {labels, "truncated or corrupt"});
}

TEST(Idx, GzipDataPastTheClaimIsRefused) {
  // 1000 images claimed, 100 MB of zeros after the header: the claim (784 KB) is inflated, then
  // the first read past it fails.
  TempDir dir;
  const std::string path = dir.file("images.gz");
  write_gzip_of_zeros(path, idx_bytes({1000, 28, 28}, {}), uint64_t(100) << 20);
  const auto t0 = std::chrono::steady_clock::now();
  expect_error([&] { data::read_idx_u8(path, 3); }, {path, "unexpected trailing data", "784000 bytes"});
  EXPECT_LT(seconds_since(t0), 2.0);
}

TEST(Idx, ClaimPastTheHardCapIsRefused) {
  // A sparse plain file (no disk used) that really holds (2^20 + 1) x 128 x 128 bytes, 16 KiB past
  // the 16 GiB the reader holds in memory: refused before allocating; its prefix still reads.
  TempDir dir;
  const std::string path = dir.file("huge-idx3-ubyte");
  write_plain(path, idx_bytes({(1u << 20) + 1, 128, 128}, {}));
  const uint64_t payload = ((uint64_t(1) << 20) + 1) * 128 * 128;
  std::error_code ec;
  fs::resize_file(path, 16 + payload, ec);
  if (ec) GTEST_SKIP() << "cannot make a sparse file here: " << ec.message();
  const auto t0 = std::chrono::steady_clock::now();
  expect_error([&] { data::read_idx_u8(path, 3); }, {path, "too large", std::to_string(payload), "16 GiB"});
  const data::IdxArray a = data::read_idx_u8(path, 3, 3);
  EXPECT_EQ(a.dims, (std::vector<int64_t>{3, 128, 128}));
  EXPECT_EQ(a.values, Bytes(3 * 128 * 128, 0));
  EXPECT_LT(seconds_since(t0), 2.0);
}

TEST(Idx, LimitReadsOnlyThePrefix) {
  // The trailer's CRC is damaged: reading everything finds it, reading 10 of 200 images does not
  // get that far (the stream stops inflating after the prefix).
  TempDir dir;
  const std::string path = dir.file("images.gz");
  write_gzip(path, idx_bytes({200, 28, 28}, make_images(200)));
  Bytes gz = read_all(path);
  gz[gz.size() - 6] ^= 0x01;
  write_plain(path, gz);
  expect_error([&] { data::read_idx_u8(path, 3); }, {path, "corrupt gzip data"});
  const data::IdxArray a = data::read_idx_u8(path, 3, 10);
  EXPECT_EQ(a.dims, (std::vector<int64_t>{10, 28, 28}));
  EXPECT_EQ(a.count_in_file, 200);
  const Bytes px = make_images(200);
  EXPECT_EQ(a.values, Bytes(px.begin(), px.begin() + 10 * 784));
  // A limit past the count reads everything, and checks everything.
  expect_error([&] { data::read_idx_u8(path, 3, 500); }, {path, "corrupt gzip data"});

  // Plain: the prefix only, the file still checked against its size.
  const std::string plain = dir.file("labels");
  write_plain(plain, idx_bytes({50}, make_labels(50)));
  const data::IdxArray l = data::read_idx_u8(plain, 1, 7);
  EXPECT_EQ(l.dims, (std::vector<int64_t>{7}));
  EXPECT_EQ(l.count_in_file, 50);
  const Bytes lb = make_labels(50);
  EXPECT_EQ(l.values, Bytes(lb.begin(), lb.begin() + 7));
  write_plain(plain, idx_bytes({50}, make_labels(49)));
  expect_error([&] { data::read_idx_u8(plain, 1, 7); }, {plain, "truncated"});
  EXPECT_THROW(data::read_idx_u8(plain, 1, -1), InvalidArgument);
}

TEST(Idx, FifoIsRefusedWithoutHanging) {
  // A FIFO with no writer: a blocking open() would wait forever (and past SIGTERM).
  TempDir dir;
  const std::string path = dir.file("train-images-idx3-ubyte");
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << std::strerror(errno);
  expect_returns_promptly(path, [&] {
    expect_error([&] { data::read_idx_u8(path, 3); }, {path, "is a FIFO, not a regular file"});
  });
  write_gzip(dir.file("train-labels-idx1-ubyte.gz"), idx_bytes({1}, make_labels(1)));
  expect_returns_promptly(path, [&] {
    expect_error([&] { models::load_fashion_mnist(dir.str(), true, Device::cpu()); }, {path, "is a FIFO"});
  });
}

TEST(Idx, DirectoryAndDevicesAreRefused) {
  TempDir dir;
  const std::string sub = dir.file("t10k-images-idx3-ubyte");
  fs::create_directories(sub);
  expect_error([&] { data::read_idx_u8(sub, 3); }, {sub, "is a directory, not a regular file"});
  if (fs::exists("/dev/zero"))
    expect_error([&] { data::read_idx_u8("/dev/zero", 1); }, {"/dev/zero", "is a character device, not a regular file"});
  if (fs::exists("/dev/null"))
    expect_error([&] { data::read_idx_u8("/dev/null", 1); }, {"/dev/null", "is a character device"});
}

TEST(Idx, MissingFile) {
  TempDir dir;
  const std::string path = dir.file("nope-idx1-ubyte");
  expect_error([&] { data::read_idx_u8(path, 1); }, {path, "not found"});
}

TEST(Idx, CorruptGzip) {
  TempDir dir;
  const std::string path = dir.file("images.gz");
  write_gzip(path, idx_bytes({40, 28, 28}, make_images(40)));
  Bytes gz = read_all(path);
  ASSERT_GT(gz.size(), 200u);
  for (std::size_t i = gz.size() / 2; i < gz.size() / 2 + 8; ++i) gz[i] ^= 0xa5;  // the deflate data
  write_plain(path, gz);
  expect_error([&] { data::read_idx_u8(path, 3); }, {path, "corrupt gzip data"});
}

TEST(Idx, CorruptGzipChecksum) {
  TempDir dir;
  const std::string path = dir.file("labels.gz");
  write_gzip(path, idx_bytes({50}, make_labels(50)));
  Bytes gz = read_all(path);
  gz[gz.size() - 6] ^= 0x01;  // the CRC-32 in the trailer: the data inflates, the check fails
  write_plain(path, gz);
  expect_error([&] { data::read_idx_u8(path, 1); }, {path, "corrupt gzip data"});
}

TEST(Idx, GzipCutShort) {
  TempDir dir;
  const std::string path = dir.file("images.gz");
  write_gzip(path, idx_bytes({40, 28, 28}, make_images(40)));
  Bytes gz = read_all(path);
  gz.resize(gz.size() / 2);
  write_plain(path, gz);
  expect_error([&] { data::read_idx_u8(path, 3); }, {path, "truncated"});
}

TEST(Idx, ConcatenatedGzipMembers) {
  TempDir dir;
  const Bytes full = idx_bytes({10}, make_labels(10));
  const std::string a = dir.file("a.gz"), b = dir.file("b.gz"), path = dir.file("labels.gz");
  write_gzip(a, Bytes(full.begin(), full.begin() + 9));
  write_gzip(b, Bytes(full.begin() + 9, full.end()));
  Bytes cat = read_all(a);
  const Bytes tail = read_all(b);
  cat.insert(cat.end(), tail.begin(), tail.end());
  write_plain(path, cat);
  EXPECT_EQ(data::read_idx_u8(path, 1).values, make_labels(10)) << "as gzip -d reads them";
}

// ---- load_fashion_mnist ------------------------------------------------------------------------

TEST(MnistSplit, FileNames) {
  EXPECT_EQ(models::fashion_mnist_file_names(true),
            (std::vector<std::string>{"train-images-idx3-ubyte", "train-labels-idx1-ubyte"}));
  EXPECT_EQ(models::fashion_mnist_file_names(false),
            (std::vector<std::string>{"t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}));
}

TEST(MnistSplit, MissingFilesNameBothCandidates) {
  TempDir dir;
  const std::string base = dir.file("train-images-idx3-ubyte");
  expect_error([&] { models::load_fashion_mnist(dir.str(), true, Device::cpu()); }, {base + ".gz", base + "'"});
}

TEST(MnistSplit, CountsMustAgree) {
  TempDir dir;
  write_split(dir, true, 5, 6, /*gzip=*/true);
  expect_error(
      [&] { models::load_fashion_mnist(dir.str(), true, Device::cpu()); },
      {dir.file("train-images-idx3-ubyte.gz"), dir.file("train-labels-idx1-ubyte.gz"), "5 images", "6 labels"});
}

TEST(MnistSplit, ImagesMustBe28x28) {
  TempDir dir;
  write_split(dir, false, 4, 4, false);
  const std::string images = dir.file("t10k-images-idx3-ubyte");
  write_plain(images, idx_bytes({4, 27, 28}, make_images(4, 27, 28)));
  expect_error([&] { models::load_fashion_mnist(dir.str(), false, Device::cpu()); }, {images, "27 x 28"});
}

TEST(MnistSplit, LabelOutOfRange) {
  TempDir dir;
  write_split(dir, true, 6, 6, false);
  const std::string labels = dir.file("train-labels-idx1-ubyte");
  Bytes l = make_labels(6);
  l[4] = 10;
  write_plain(labels, idx_bytes({6}, l));
  expect_error([&] { models::load_fashion_mnist(dir.str(), true, Device::cpu()); }, {labels, "index 4", "is 10"});
}

TEST(MnistSplit, LimitReadsOnlyThePrefixOfBothFiles) {
  // Both gzip trailers are damaged: the full split is refused, a limit loads (Note [Reading a
  // prefix] in engine/data/idx.cpp), and the counts in the headers are still compared.
  TempDir dir;
  write_split(dir, true, 300, 300, /*gzip=*/true);
  for (const std::string& name : models::fashion_mnist_file_names(true)) {
    Bytes gz = read_all(dir.file(name + ".gz"));
    gz[gz.size() - 6] ^= 0x01;
    write_plain(dir.file(name + ".gz"), gz);
  }
  expect_error([&] { models::load_fashion_mnist(dir.str(), true, Device::cpu()); }, {"corrupt gzip data"});
  const FashionMnistSplit ds = models::load_fashion_mnist(dir.str(), true, Device::cpu(), 20);
  EXPECT_EQ(ds.size(), 20);
  const Bytes px = make_images(300);
  EXPECT_EQ(ds.images.to_vector<uint8_t>(), Bytes(px.begin(), px.begin() + 20 * 784));
  write_gzip(dir.file("train-labels-idx1-ubyte.gz"), idx_bytes({299}, make_labels(299)));
  expect_error([&] { models::load_fashion_mnist(dir.str(), true, Device::cpu(), 20); }, {"300 images", "299 labels"});
}

TEST(MnistSplit, NegativeLimit) {
  TempDir dir;
  write_split(dir, true, 6, 6, false);
  EXPECT_THROW(models::load_fashion_mnist(dir.str(), true, Device::cpu(), -1), InvalidArgument);
}

TEST(MnistSplit, PrefersGzipOverPlain) {
  TempDir dir;
  write_split(dir, true, 6, 6, /*gzip=*/true);
  // A broken plain file beside the .gz is never read.
  write_plain(dir.file("train-images-idx3-ubyte"), {1, 2, 3});
  EXPECT_EQ(models::load_fashion_mnist(dir.str(), true, Device::cpu()).size(), 6);
}

// ---- locate_fashion_mnist -------------------------------------------------------------------

// Runs `fn`, expects an InvalidArgument (the caller's directory is wrong) naming every one of `parts`.
template <typename Fn>
void expect_invalid_argument(Fn fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no exception; expected an InvalidArgument mentioning '" << parts.front() << "'";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

// A directory given must hold all four files: what it lacks is named, as the caller names the
// directory; nothing else is searched and nothing is downloaded.
TEST(LocateFashionMnist, AGivenDirectoryMustHoldTheFiles) {
  TempDir dir;
  write_split(dir, true, 6, 6, /*gzip=*/true);
  models::FashionMnistSearch search;
  search.dir = dir.str();
  search.quiet = true;
  expect_invalid_argument([&] { models::locate_fashion_mnist(search); },
                          {"directory '" + dir.str() + "' lacks t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz"});
  search.dir_option = "--data";
  expect_invalid_argument([&] { models::locate_fashion_mnist(search); }, {"--data '" + dir.str() + "' lacks"});
  write_split(dir, false, 4, 4, /*gzip=*/false);  // plain files count too
  EXPECT_EQ(models::locate_fashion_mnist(search), dir.str());
}

// The directory found is checked from the headers: a split whose counts differ is refused before
// anything is inflated.
TEST(LocateFashionMnist, TheSplitsHeadersAreChecked) {
  TempDir dir;
  write_split(dir, true, 6, 6, /*gzip=*/true);
  write_split(dir, false, 5, 4, /*gzip=*/true);
  models::FashionMnistSearch search;
  search.dir = dir.str();
  expect_error([&] { models::locate_fashion_mnist(search); },
               {dir.file("t10k-images-idx3-ubyte.gz"), "5 images", "4 labels"});
}

TEST(LocateFashionMnist, CumulusDataMustHoldTheFiles) {
  TempDir dir;
  const char* saved = std::getenv("CUMULUS_DATA");
  const std::string old_value = saved ? saved : "";
  ::setenv("CUMULUS_DATA", dir.str().c_str(), 1);
  bool refused = false;
  try {
    models::locate_fashion_mnist();
  } catch (const InvalidArgument& e) {
    refused = std::string(e.what()).find("$CUMULUS_DATA '" + dir.str() + "' lacks train-images-idx3-ubyte.gz") !=
              std::string::npos;
    EXPECT_TRUE(refused) << e.what();
  }
  if (saved) ::setenv("CUMULUS_DATA", old_value.c_str(), 1);
  else ::unsetenv("CUMULUS_DATA");
  EXPECT_TRUE(refused);
}

class MnistDeviceTest : public DeviceTest {};

TEST_P(MnistDeviceTest, LoadsOntoTheDeviceWithLimit) {
  TempDir dir;
  write_split(dir, true, 12, 12, /*gzip=*/true);
  write_split(dir, false, 7, 7, /*gzip=*/false);
  const FashionMnistSplit train = models::load_fashion_mnist(dir.str(), true, device());
  EXPECT_EQ(train.size(), 12);
  EXPECT_EQ(train.num_classes, 10);
  EXPECT_EQ(train.images.shape(), Shape({12, 28, 28}));
  EXPECT_EQ(train.images.dtype(), DType::u8);
  EXPECT_EQ(train.labels.shape(), Shape({12}));
  EXPECT_EQ(train.labels.dtype(), DType::i32);
  EXPECT_EQ(train.images.device(), device());
  EXPECT_EQ(train.labels.device(), device());
  EXPECT_EQ(train.images.memory_category(), MemoryCategory::data);
  EXPECT_EQ(train.labels.memory_category(), MemoryCategory::data);
  EXPECT_EQ(train.images.to_vector<uint8_t>(), make_images(12));
  const Bytes l = make_labels(12);
  EXPECT_EQ(train.labels.to_vector<int32_t>(), std::vector<int32_t>(l.begin(), l.end()));

  const FashionMnistSplit test = models::load_fashion_mnist(dir.str(), false, device(), /*limit=*/5);
  EXPECT_EQ(test.size(), 5);
  const Bytes px = make_images(7);
  EXPECT_EQ(test.images.to_vector<uint8_t>(), Bytes(px.begin(), px.begin() + 5 * 784));
  EXPECT_EQ(test.labels.to_vector<int32_t>(), (std::vector<int32_t>{0, 3, 6, 9, 2}));
  EXPECT_EQ(models::load_fashion_mnist(dir.str(), false, device(), /*limit=*/100).size(), 7) << "limit > n keeps all";
}

CUMULUS_INSTANTIATE_DEVICES(MnistDeviceTest);

// ---- DataLoader ------------------------------------------------------------------------------

class LoaderTest : public DeviceTest {
 protected:
  // n samples; image i has pixel 0 == i, so a batch row tells which sample it holds.
  FashionMnistSplit make_dataset(int n) {
    dir_ = std::make_unique<TempDir>();
    write_split(*dir_, true, n, n, /*gzip=*/false);
    return models::load_fashion_mnist(dir_->str(), true, device());
  }

  // The sample indices of one epoch, in batch order, checking every row and label exactly.
  std::vector<int> epoch_order(DataLoader& loader) {
    const Bytes px = make_images(static_cast<int>(loader.dataset().size()));
    const Bytes lb = make_labels(static_cast<int>(loader.dataset().size()));
    std::vector<int> order;
    loader.seek(0);
    for (int64_t b = 0; b < loader.num_batches(); ++b) {
      const data::Batch batch = loader.next(b);
      const auto x = batch.x.to_vector<float>();
      const auto y = batch.y.to_vector<int32_t>();
      const int64_t rows = batch.y.size(0);
      for (int64_t r = 0; r < rows; ++r) {
        const int s = static_cast<int>(std::lround(x[static_cast<std::size_t>(r * 784)] * 255.0f));
        order.push_back(s);
        if (s < 0 || s >= static_cast<int>(lb.size())) {
          ADD_FAILURE() << "row " << r << " of batch " << b << " holds no sample";
          continue;
        }
        EXPECT_EQ(y[static_cast<std::size_t>(r)], lb[static_cast<std::size_t>(s)]) << "label of sample " << s;
        for (int c = 0; c < 784; ++c) {
          const float want = static_cast<float>(px[static_cast<std::size_t>(s) * 784 + c]) / 255.0f;
          const float got = x[static_cast<std::size_t>(r * 784 + c)];
          if (std::memcmp(&want, &got, sizeof(float)) != 0) {
            ADD_FAILURE() << "sample " << s << " pixel " << c << ": " << got << " != " << want << " (p / 255)";
            break;
          }
        }
      }
    }
    return order;
  }

  std::unique_ptr<TempDir> dir_;
};

TEST_P(LoaderTest, HugeBatchSizesDoNotOverflow) {
  // ceil(n / b) computed as (n + b - 1) / b overflowed for b near INT64_MAX.
  const FashionMnistSplit ds = make_dataset(10);
  for (const int64_t b : {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max() - 1,
                          std::numeric_limits<int64_t>::max() - 8, int64_t(1) << 62, int64_t(11), int64_t(10)}) {
    SCOPED_TRACE(b);
    DataLoader loader(ds.tensors(), b);
    ASSERT_EQ(loader.num_batches(), 1);
    const data::Batch batch = batch_at(loader, 0);
    EXPECT_EQ(batch.x.shape(), Shape({10, 784}));
    EXPECT_EQ(batch.y.size(0), 10);
    EXPECT_THROW(loader.next(1), InvalidArgument);
    EXPECT_THROW(loader.seek(2), InvalidArgument);
  }
  EXPECT_EQ(DataLoader(ds.tensors(), 3).num_batches(), 4);
  EXPECT_EQ(DataLoader(ds.tensors(), 5).num_batches(), 2);
  EXPECT_EQ(DataLoader(ds.tensors(), 1).num_batches(), 10);
}

TEST_P(LoaderTest, InOrderWithSmallerLastBatch) {
  const FashionMnistSplit ds = make_dataset(10);
  DataLoader loader(ds.tensors(), 4);
  EXPECT_EQ(loader.num_batches(), 3);
  EXPECT_EQ(loader.batch_size(), 4);
  const std::vector<int64_t> sizes = {4, 4, 2};
  loader.seek(0);
  for (int64_t b = 0; b < 3; ++b) {
    const data::Batch batch = loader.next(b);
    EXPECT_EQ(batch.x.shape(), Shape({sizes[b], 784}));
    EXPECT_EQ(batch.x.dtype(), DType::f32);
    EXPECT_EQ(batch.y.shape(), Shape({sizes[b]}));
    EXPECT_EQ(batch.y.dtype(), DType::i32);
    EXPECT_EQ(batch.x.device(), device());
    EXPECT_EQ(batch.x.memory_category(), MemoryCategory::data);
    EXPECT_EQ(batch.y.memory_category(), MemoryCategory::data);
  }
  std::vector<int> expected(10);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(epoch_order(loader), expected);
  loader.set_epoch(3);  // no-op without shuffle
  EXPECT_EQ(epoch_order(loader), expected);
  EXPECT_EQ(DataLoader(ds.tensors(), 5).num_batches(), 2) << "exact division has no partial batch";
  EXPECT_THROW(loader.next(3), InvalidArgument);
  EXPECT_THROW(loader.next(-1), InvalidArgument);
  EXPECT_THROW(loader.seek(-1), InvalidArgument);
  EXPECT_THROW(DataLoader(ds.tensors(), 0), InvalidArgument);
}

TEST_P(LoaderTest, EveryPixelValueIsExactlyPOver255) {
  // 256 samples: pixel 0 runs through every byte value, and the pattern covers the rest.
  const FashionMnistSplit ds = make_dataset(256);
  DataLoader loader(ds.tensors(), 100);
  const std::vector<int> order = epoch_order(loader);  // checks p / 255 bit for bit
  EXPECT_EQ(order.size(), 256u);
  const auto x = batch_at(loader, 2).x.to_vector<float>();
  EXPECT_EQ(x[55 * 784], 1.0f) << "255 / 255";
  EXPECT_EQ(x[0], 200.0f / 255.0f);
}

TEST_P(LoaderTest, ShuffleIsAPermutationPerSeedAndEpoch) {
  const FashionMnistSplit ds = make_dataset(50);
  DataLoader loader(ds.tensors(), 8, /*shuffle=*/true, /*seed=*/42);
  EXPECT_EQ(loader.num_batches(), 7);
  const std::vector<int> e0 = epoch_order(loader);
  std::vector<int> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int> all(50);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(sorted, all) << "every sample exactly once";
  EXPECT_NE(e0, all) << "a shuffle changes the order";

  EXPECT_EQ(epoch_order(loader), e0) << "batches are repeatable within an epoch";
  loader.set_epoch(1);
  const std::vector<int> e1 = epoch_order(loader);
  EXPECT_NE(e1, e0) << "epochs differ";
  loader.set_epoch(0);
  EXPECT_EQ(epoch_order(loader), e0) << "same (seed, epoch), same order";

  DataLoader resumed(ds.tensors(), 8, true, 42);
  resumed.set_epoch(1);
  EXPECT_EQ(epoch_order(resumed), e1) << "a fresh loader at epoch 1 (a resume) draws the same order";
  DataLoader other_seed(ds.tensors(), 8, true, 43);
  EXPECT_NE(epoch_order(other_seed), e0) << "seeds differ";

  if (device().is_cuda()) {  // the order is drawn on the host: identical on every device
    const FashionMnistSplit cpu_ds{ds.images.to(Device::cpu()), ds.labels.to(Device::cpu()), 10};
    DataLoader cpu(cpu_ds.tensors(), 8, true, 42);
    cpu.set_epoch(1);
    EXPECT_EQ(epoch_order(cpu), e1);
  }
}

TEST_P(LoaderTest, ShuffleOrderIsPinned) {
  // The exact order for (seed 7, epoch 2, n 10), computed by an independent Python rendering of
  // the rule (Fisher-Yates from i = n-1 down, j uniform in [0, i] by rejection from 48 bits made of
  // two 24-bit SplitMix64 draws at counter epoch * 2^32): a change to the shuffle, which would change
  // every training run's batches, is noticed.
  const FashionMnistSplit ds = make_dataset(10);
  DataLoader loader(ds.tensors(), 10, true, 7);
  loader.set_epoch(2);
  const std::vector<int> order = epoch_order(loader);
  EXPECT_EQ(order, (std::vector<int>{2, 7, 4, 3, 8, 5, 1, 0, 6, 9}));
}

TEST_P(LoaderTest, OneKernelPerBatch) {
  const FashionMnistSplit ds = make_dataset(20);
  DataLoader loader(ds.tensors(), 8, true, 1);
  loader.seek(1);
  const int64_t before = cuda_kernel_launches();
  const data::Batch b = loader.next(1);
  const int64_t launches = cuda_kernel_launches() - before;
  EXPECT_EQ(launches, device().is_cuda() ? 1 : 0) << "x and y are gathered by one launch";
  (void)b;
}

// Host-resident data (Note [Host-resident data]): the dataset stays on the CPU and batches are
// staged to the device one ahead. Every batch equals the device-resident loader's, bit for bit, for
// two shuffled epochs with a partial last batch, whether stage() is called with the next batch
// (prefetch hits), with a stride of 2 (every prefetch misses: another rank's batch in between), or
// not at all (next() stages by itself). On the CPU the option means nothing: the loader is not
// host-resident and staging changes nothing.
TEST_P(LoaderTest, HostResidentBatchesEqualDeviceResidentBatches) {
  const FashionMnistSplit on_device = make_dataset(23);
  const FashionMnistSplit on_host{on_device.images.to(Device::cpu()), on_device.labels.to(Device::cpu()), 10};
  DataLoader reference(on_device.tensors(), 4, true, 3);
  DataLoader staged(on_host.tensors(), 4, true, 3, device());
  EXPECT_EQ(staged.host_resident(), device().is_cuda());
  EXPECT_EQ(staged.num_batches(), 6);
  for (int epoch = 0; epoch < 2; ++epoch) {
    reference.set_epoch(epoch);
    staged.set_epoch(epoch);
    for (const int stride : {1, 2, 0}) {
      SCOPED_TRACE("epoch " + std::to_string(epoch) + ", stride " + std::to_string(stride));
      for (int64_t i = 0; i < staged.num_batches(); ++i) {
        reference.seek(i);
        staged.seek(i);
        if (stride > 0) data::DataLoaderAccess::stage(staged, i, i + stride);
        const data::Batch want = reference.next(i);
        const data::Batch got = staged.next(i);
        EXPECT_EQ(got.x.device(), device());
        EXPECT_EQ(got.x.to_vector<float>(), want.x.to_vector<float>()) << "batch " << i;
        EXPECT_EQ(got.y.to_vector<int32_t>(), want.y.to_vector<int32_t>()) << "batch " << i;
      }
    }
  }
}

#if CUMULUS_WITH_CUDA
// With host-resident data a captured gather reads the staging slot from the device cursor, so one
// graph replayed after stage(i) delivers batch i every time.
TEST_P(LoaderTest, HostResidentGatherReplaysFromACapturedGraph) {
  if (!device().is_cuda()) GTEST_SKIP() << "CUDA graphs";
  const FashionMnistSplit on_device = make_dataset(40);
  const FashionMnistSplit on_host{on_device.images.to(Device::cpu()), on_device.labels.to(Device::cpu()), 10};
  DataLoader reference(on_device.tensors(), 8, true, 5);
  DataLoader staged(on_host.tensors(), 8, true, 5, device());
  staged.seek(0);
  data::DataLoaderAccess::stage(staged, 0, 1);
  const data::Batch first = staged.next(0);  // eager
  EXPECT_EQ(first.x.to_vector<float>(), batch_at(reference, 0).x.to_vector<float>());
  data::DataLoaderAccess::stage(staged, 1, 2);
  data::Batch captured;
  cuda::Graph graph = cuda::Graph::capture(cuda::context(device().index()), [&] { captured = staged.next(1); });
  for (int64_t i = 1; i < staged.num_batches(); ++i) {
    if (i > 1) data::DataLoaderAccess::stage(staged, i, i + 1);
    graph.launch();
    EXPECT_EQ(captured.x.to_vector<float>(), batch_at(reference, i).x.to_vector<float>()) << "replay for batch " << i;
    EXPECT_EQ(captured.y.to_vector<int32_t>(), batch_at(reference, i).y.to_vector<int32_t>())
        << "replay for batch " << i;
  }
}

// A micro-batch that fails between its stage() and its gather (here: the gather never comes)
// must not set the host's staging slot apart from the one the device gather reads: every later
// batch is still the right one.
TEST_P(LoaderTest, HostResidentStagingSurvivesAStageWithoutItsGather) {
  if (!device().is_cuda()) GTEST_SKIP() << "the staging ring exists on CUDA only";
  const FashionMnistSplit on_device = make_dataset(40);
  const FashionMnistSplit on_host{on_device.images.to(Device::cpu()), on_device.labels.to(Device::cpu()), 10};
  DataLoader reference(on_device.tensors(), 8, true, 5);
  DataLoader staged(on_host.tensors(), 8, true, 5, device());
  staged.seek(0);
  data::DataLoaderAccess::stage(staged, 0, 1);  // its micro-batch fails before next(0)
  for (int64_t i = 1; i < staged.num_batches(); ++i) {
    staged.seek(i);
    data::DataLoaderAccess::stage(staged, i, i + 1);
    EXPECT_EQ(staged.next(i).x.to_vector<float>(), batch_at(reference, i).x.to_vector<float>()) << "batch " << i;
  }
}

// Item 5 of issue 26: the staging ring comes from the compute stream's allocator, which hands out a
// block freed there at once, while the copy stream fills it. Here the block the ring takes is
// still to be written by the compute stream (a memset of 0xFF queued behind some 40 ms of work)
// when the ring is made: the first fill must land after that write, or the first batches read
// 0xFF pixels. Only a GPU can show the race.
TEST_P(LoaderTest, HostResidentFirstFillWaitsForComputeWorkOnTheRingsMemory) {
  if (!device().is_cuda()) GTEST_SKIP() << "the copy stream exists on CUDA only";
  const FashionMnistSplit on_device = make_dataset(40);
  const FashionMnistSplit on_host{on_device.images.to(Device::cpu()), on_device.labels.to(Device::cpu()), 10};
  const int64_t batch = 8;
  DataLoader reference(on_device.tensors(), batch, false, 0);
  const std::vector<float> want0 = batch_at(reference, 0).x.to_vector<float>();
  const std::vector<float> want1 = batch_at(reference, 1).x.to_vector<float>();
  allocator_for(device()).empty_cache();
  const cudaStream_t compute = cuda::stream(device().index());
  {
    // The ring's image block: two slots of `batch` rows, freed below with a write still queued.
    Tensor ring_sized = Tensor::empty(Shape{2 * batch, 784}, DType::u8, device());
    Tensor busy = Tensor::empty(Shape{int64_t{512} << 20}, DType::u8, device());
    for (int k = 0; k < 200; ++k)
      ASSERT_EQ(cudaMemsetAsync(busy.raw_data(), k & 0xFF, busy.nbytes(), compute), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(ring_sized.raw_data(), 0xFF, ring_sized.nbytes(), compute), cudaSuccess);
  }
  DataLoader staged(on_host.tensors(), batch, false, 0, device());
  staged.seek(0);
  data::DataLoaderAccess::stage(staged, 0, 1);
  EXPECT_EQ(staged.next(0).x.to_vector<float>(), want0) << "batch 0 was overwritten by earlier compute work";
  data::DataLoaderAccess::stage(staged, 1, 2);
  EXPECT_EQ(staged.next(1).x.to_vector<float>(), want1) << "batch 1 was overwritten by earlier compute work";
}
#endif

CUMULUS_INSTANTIATE_DEVICES(LoaderTest);

// A host-resident loader needs its CUDA device; a dataset on a GPU does not make CPU batches.
TEST(HostResidentData, IsRefusedWithoutAUsableDeviceAndOnlyFromTheHost) {
  TempDir dir;
  write_split(dir, true, 6, 6, /*gzip=*/false);
  const FashionMnistSplit on_host = models::load_fashion_mnist(dir.str(), true, Device::cpu());
  if (!cuda_available()) {
    EXPECT_THROW(DataLoader(on_host.tensors(), 2, false, 0, Device::cuda(0)), DeviceError);
    return;
  }
  const FashionMnistSplit on_gpu = models::load_fashion_mnist(dir.str(), true, Device::cuda(0));
  try {
    DataLoader loader(on_gpu.tensors(), 2, false, 0, Device::cpu());
    ADD_FAILURE() << "a CUDA dataset with CPU batches was accepted";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("kept on the host"), std::string::npos) << e.what();
  }
}

// ---- TensorDataset and the DataLoader over any tensors ----------------------------------------

class TensorLoaderTest : public DeviceTest {
 protected:
  // n samples: x [n, 2, 3] f32 with x[s, i, j] = s + 0.125 * (3i + j) (exact in f32), y [n] i64 =
  // s * 2^40 + 7 (past i32 and f32's exact range), z [n, 4] u8 = (s * 4 + c) % 256, all on `where`.
  static data::TensorDataset make(int64_t n, Device where) {
    std::vector<float> x;
    std::vector<int64_t> y;
    std::vector<uint8_t> z;
    for (int64_t s = 0; s < n; ++s) {
      for (int e = 0; e < 6; ++e) x.push_back(static_cast<float>(s) + 0.125f * static_cast<float>(e));
      y.push_back(s * (int64_t{1} << 40) + 7);
      for (int c = 0; c < 4; ++c) z.push_back(static_cast<uint8_t>((s * 4 + c) % 256));
    }
    return data::TensorDataset({Tensor::from_vector(x, {n, 2, 3}, where), Tensor::from_vector(y, {n}, where),
                                Tensor::from_vector(z, {n, 4}, where)},
                               {"x", "y", "z"});
  }

  // The samples of every batch of the loader's current epoch (from y), checking that x and z hold
  // the same sample's rows exactly, and each batch's shapes and dtypes.
  static std::vector<int64_t> epoch_samples(DataLoader& loader) {
    std::vector<int64_t> samples;
    loader.seek(0);
    for (int64_t i = 0; i < loader.num_batches(); ++i) {
      const data::Batch b = loader.next(i);
      const int64_t rows = b.x.size(0);
      EXPECT_EQ(b.tensors.size(), 3u);
      EXPECT_EQ(b.x.shape(), Shape({rows, 2, 3}));
      EXPECT_EQ(b.y.shape(), Shape({rows}));
      EXPECT_EQ(b.tensors[2].shape(), Shape({rows, 4}));
      EXPECT_EQ(b.y.dtype(), DType::i64);
      EXPECT_EQ(b.tensors[2].dtype(), DType::u8);
      EXPECT_EQ(b.x.memory_category(), MemoryCategory::data);
      const auto x = b.x.to_vector<float>();
      const auto y = b.y.to_vector<int64_t>();
      const auto z = b.tensors[2].to_vector<uint8_t>();
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t s = (y[static_cast<std::size_t>(r)] - 7) >> 40;
        EXPECT_EQ(y[static_cast<std::size_t>(r)], s * (int64_t{1} << 40) + 7) << "batch " << i << " row " << r;
        samples.push_back(s);
        for (int e = 0; e < 6; ++e)
          EXPECT_EQ(x[static_cast<std::size_t>(r * 6 + e)], static_cast<float>(s) + 0.125f * static_cast<float>(e))
              << "x of sample " << s;
        for (int c = 0; c < 4; ++c)
          EXPECT_EQ(z[static_cast<std::size_t>(r * 4 + c)], static_cast<uint8_t>((s * 4 + c) % 256))
              << "z of sample " << s;
      }
    }
    return samples;
  }
};

// slice: samples [3, 8) of every tensor, names and to_float kept; a loader over it sees exactly them.
TEST_P(TensorLoaderTest, SliceIsASplitOfEveryTensor) {
  data::TensorDataset ds = make(10, device());
  ds.to_float(2, 4.0f);
  const data::TensorDataset part = ds.slice(3, 5);
  EXPECT_EQ(part.size(), 5);
  EXPECT_EQ(part.describe(1), "tensor 1 ('y')");
  EXPECT_EQ(part.divisor(2), 4.0f);
  data::DataLoader loader(make(10, device()).slice(3, 5), 2);
  EXPECT_EQ(epoch_samples(loader), (std::vector<int64_t>{3, 4, 5, 6, 7}));
  EXPECT_EQ(ds.slice(10, 0).size(), 0);
  EXPECT_THROW(ds.slice(8, 3), InvalidArgument);
  EXPECT_THROW(ds.slice(-1, 2), InvalidArgument);
}

TEST_P(TensorLoaderTest, AnyShapeF32I64AndU8RowsInOrderWithThePartialLastBatch) {
  const data::TensorDataset ds = make(10, device());
  EXPECT_EQ(ds.size(), 10);
  DataLoader loader(ds, 4);
  EXPECT_EQ(loader.num_batches(), 3);
  EXPECT_EQ(batch_at(loader, 2).x.size(0), 2) << "the partial last batch";
  std::vector<int64_t> in_order(10);
  std::iota(in_order.begin(), in_order.end(), 0);
  EXPECT_EQ(epoch_samples(loader), in_order);
  EXPECT_EQ(epoch_samples(loader), in_order) << "a second pass, from seek(0)";
  EXPECT_EQ(DataLoader(ds, 5).num_batches(), 2) << "exact division has no partial batch";
}

TEST_P(TensorLoaderTest, ShuffleFromASeedIsAReproduciblePermutation) {
  const data::TensorDataset ds = make(37, device());
  DataLoader loader(ds, 8, /*shuffle=*/true, /*seed=*/11);
  const std::vector<int64_t> e0 = epoch_samples(loader);
  std::vector<int64_t> sorted = e0, all(37);
  std::sort(sorted.begin(), sorted.end());
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(sorted, all) << "every sample exactly once";
  EXPECT_NE(e0, all) << "a shuffle changes the order";
  EXPECT_EQ(epoch_samples(loader), e0) << "a second pass gathers the same batches";
  DataLoader again(ds, 8, true, 11);
  EXPECT_EQ(epoch_samples(again), e0) << "the same seed, the same order";
  loader.set_epoch(1);
  const std::vector<int64_t> e1 = epoch_samples(loader);
  EXPECT_NE(e1, e0) << "epochs differ";
  again.set_epoch(1);
  EXPECT_EQ(epoch_samples(again), e1);
  DataLoader other_seed(ds, 8, true, 12);
  EXPECT_NE(epoch_samples(other_seed), e0) << "seeds differ";
  // The order is the image loader's for the same (seed, epoch, n): one shuffle rule.
  std::vector<uint8_t> pixels(37);
  std::iota(pixels.begin(), pixels.end(), 0);
  const FashionMnistSplit images{Tensor::from_vector(pixels, {37, 1, 1}, device()),
                                 Tensor::from_vector(std::vector<int32_t>(37, 0), {37}, device()), 10};
  DataLoader image_loader(images.tensors(), 8, true, 11);
  std::vector<int64_t> image_order;
  for (int64_t i = 0; i < image_loader.num_batches(); ++i)
    for (const float p : batch_at(image_loader, i).x.to_vector<float>()) image_order.push_back(std::lround(p * 255.0f));
  EXPECT_EQ(image_order, e0);
}

// A dataset kept on the host and one on the device give the same batches, bit for bit, epoch after
// epoch and pass after pass (on CUDA the host one is staged through pinned memory; on the CPU both
// are the same).
TEST_P(TensorLoaderTest, HostAndDeviceResidencyGiveTheSameBatches) {
  const data::TensorDataset on_device = make(23, device()), on_host = make(23, Device::cpu());
  DataLoader reference(on_device, 4, true, 3);
  DataLoader staged(on_host, 4, true, 3, device());
  EXPECT_EQ(staged.host_resident(), device().is_cuda());
  for (int epoch = 0; epoch < 2; ++epoch) {
    reference.set_epoch(epoch);
    staged.set_epoch(epoch);
    const std::vector<int64_t> want = epoch_samples(reference);
    EXPECT_EQ(epoch_samples(staged), want) << "epoch " << epoch;
    EXPECT_EQ(epoch_samples(staged), want) << "a second pass, epoch " << epoch;
  }
}

// set_dtype makes the floating tensors (f32, and to_float ones) bf16 or f16 and leaves integer
// ones alone: f32 rounded once to nearest even, u8 / 4 exact.
TEST_P(TensorLoaderTest, FloatingTensorsTakeTheBatchDtypeIntegersKeepTheirs) {
  const std::vector<float> x = {1.0f + 1.0f / 256.0f, 3.0f, -2.5f, 1.0f + 3.0f / 256.0f};
  data::TensorDataset ds({Tensor::from_vector(x, {4}, device()),
                          Tensor::from_vector(std::vector<uint8_t>{0, 1, 2, 255}, {4}, device()),
                          Tensor::from_vector(std::vector<int32_t>{5, 6, 7, 8}, {4}, device())});
  ds.to_float(1, 4.0f);
  EXPECT_TRUE(ds.floating(0));
  EXPECT_TRUE(ds.floating(1));
  EXPECT_FALSE(ds.floating(2));
  DataLoader loader(ds, 4);
  loader.set_dtype(DType::bf16);
  const data::Batch b = batch_at(loader, 0);
  EXPECT_EQ(b.x.dtype(), DType::bf16);
  EXPECT_EQ(b.y.dtype(), DType::bf16);
  EXPECT_EQ(b.tensors[2].dtype(), DType::i32);
  EXPECT_EQ(b.x.to(DType::f32).to_vector<float>(), (std::vector<float>{1.0f, 3.0f, -2.5f, 1.0f + 4.0f / 256.0f}))
      << "round to nearest even: 1 + 2^-8 down, 1 + 3 * 2^-8 up";
  EXPECT_EQ(b.y.to(DType::f32).to_vector<float>(), (std::vector<float>{0.0f, 0.25f, 0.5f, 63.75f}));
  EXPECT_EQ(b.tensors[2].to_vector<int32_t>(), (std::vector<int32_t>{5, 6, 7, 8}));
  loader.set_dtype(DType::f32);
  EXPECT_EQ(batch_at(loader, 0).x.to_vector<float>(), x) << "f32 rows are copied as they are";
}

TEST_P(TensorLoaderTest, OneKernelPerBatchForEveryTensor) {
  DataLoader loader(make(20, device()), 8, true, 1);
  loader.seek(1);
  const int64_t before = cuda_kernel_launches();
  const data::Batch b = loader.next(1);
  EXPECT_EQ(cuda_kernel_launches() - before, device().is_cuda() ? 1 : 0) << "three tensors, one launch";
  (void)b;
}

CUMULUS_INSTANTIATE_DEVICES(TensorLoaderTest);

// Mismatched first dimensions name both tensors and their sizes; other misuse names the tensor.
TEST(TensorDataset, ErrorsNameTheTensorAndTheSizes) {
  const Tensor x = Tensor::zeros({100, 3}), y = Tensor::zeros({99}, DType::i32);
  try {
    data::TensorDataset ds({x, y}, {"x", "labels"});
    ADD_FAILURE() << "first dimensions 100 and 99 were accepted";
  } catch (const ShapeError& e) {
    for (const char* part : {"tensor 1 ('labels')", "99 samples", "[99]", "tensor 0 ('x')", "has 100", "[100, 3]"})
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "'" << part << "' not in: " << e.what();
  }
  expect_error([&] { data::TensorDataset ds({x, y}); }, {"tensor 1 has 99 samples", "tensor 0 has 100"});
  expect_error(
      [&] {
        data::TensorDataset ds({x, Tensor::zeros({100}, DType::bf16)});
      },
      {"tensor 1 is bf16", "f32, i32, i64 or u8"});
  expect_error([&] { data::TensorDataset ds({Tensor::full({}, 1.0f)}, {"scalar"}); }, {"tensor 0 ('scalar') is 0-d"});
  expect_error([&] { data::TensorDataset ds({x}, {"x", "y"}); }, {"2 names for 1 tensors"});
  expect_error([&] { data::TensorDataset({x}).to_float(1); }, {"no tensor 1"});
  expect_error([&] { data::TensorDataset({x}).to_float(0, 0.0f); }, {"tensor 0", "divisor", "non-zero"});
  EXPECT_THROW(DataLoader(data::TensorDataset(), 4), InvalidArgument);
  expect_error([&] { DataLoader(data::TensorDataset(std::vector<Tensor>(9, x)), 4); }, {"9 tensors", "at most 8"});
}

// ---- the real Fashion-MNIST, when present ----------------------------------------------------

std::string find_fashion_mnist() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("CUMULUS_DATA")) candidates.push_back(env);
  // The project's convention: ../shared/data/fashion-mnist from the repository root.
  const fs::path repo = fs::path(__FILE__).parent_path().parent_path();
  candidates.push_back((repo / ".." / "shared" / "data" / "fashion-mnist").string());
  candidates.push_back("/work/shared/data/fashion-mnist");
  candidates.push_back("../shared/data/fashion-mnist");
  for (const auto& c : candidates) {
    std::error_code ec;
    if (fs::exists(fs::path(c) / "train-labels-idx1-ubyte.gz", ec) ||
        fs::exists(fs::path(c) / "train-labels-idx1-ubyte", ec))
      return c;
  }
  return "";
}

TEST(FashionMnist, KnownFacts) {
  const std::string dir = find_fashion_mnist();
  if (dir.empty()) GTEST_SKIP() << "Fashion-MNIST not found (set CUMULUS_DATA)";
  const FashionMnistSplit train = models::load_fashion_mnist(dir, true, Device::cpu());
  const FashionMnistSplit test = models::load_fashion_mnist(dir, false, Device::cpu());
  ASSERT_EQ(train.size(), 60000);
  ASSERT_EQ(test.size(), 10000);

  // From the dataset's README: the first ten training labels, and 6000 / 1000 images per class.
  const auto ytrain = train.labels.to_vector<int32_t>();
  const auto ytest = test.labels.to_vector<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(ytrain.begin(), ytrain.begin() + 10),
            (std::vector<int32_t>{9, 0, 0, 3, 0, 2, 7, 2, 5, 5}))
      << "the first training image is an ankle boot (class 9)";
  EXPECT_EQ(std::vector<int32_t>(ytest.begin(), ytest.begin() + 10),
            (std::vector<int32_t>{9, 2, 1, 1, 6, 1, 4, 6, 5, 7}));
  std::array<int, 10> train_counts{}, test_counts{};
  for (int32_t y : ytrain) ++train_counts[static_cast<std::size_t>(y)];
  for (int32_t y : ytest) ++test_counts[static_cast<std::size_t>(y)];
  for (int c = 0; c < 10; ++c) {
    EXPECT_EQ(train_counts[static_cast<std::size_t>(c)], 6000) << "class " << c;
    EXPECT_EQ(test_counts[static_cast<std::size_t>(c)], 1000) << "class " << c;
  }
  // Pixels: mean 0.2860 on a 0..1 scale (README); the first image's pixel sum (read with Python's
  // gzip module when this test was written).
  const uint8_t* px = train.images.data<uint8_t>();
  const int64_t n = train.images.numel();
  const double sum = std::accumulate(px, px + n, 0.0);
  EXPECT_NEAR(sum / double(n) / 255.0, 0.2860, 5e-5);
  EXPECT_EQ(std::accumulate(px, px + 784, 0), 76247);
}

}  // namespace
}  // namespace cumulus
