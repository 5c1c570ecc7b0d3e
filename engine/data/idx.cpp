// IDX reader: a byte source (plain file, or a zlib inflate stream over a gzip file), a header
// check, then the payload read in chunks.
//
// Note [Allocate only what arrived]: the header's dimensions are a claim, not a fact. A plain
// file's payload size is compared with the file size before anything is allocated. A gzip file's
// decompressed size is unknown until it has been inflated, so the claim is bounded first, from the
// header alone: deflate cannot expand data more than kMaxDeflateRatio times, so a claim of more
// than that many times the file's size is refused at once (a 17 MB file claiming 2^31 images was
// inflated to 4 GB before), and nothing past kMaxDataBytes is ever read into memory. The bounded
// claim is then reserved once (address space: no copies as the data grows; growing by a fixed step
// was quadratic) and filled a chunk at a time, so memory is touched only as data arrives: a false
// claim costs what the file really holds. Output beyond the claim is refused within one small read.
//
// Note [Reading a prefix]: with a limit, only the header and the first `limit` items are read;
// inflating stops there. A plain file is still checked against its size; in a gzip file, damage
// after the prefix goes unnoticed (the CRC is at the end), which is the price of not inflating it.
#include "cumulus/data/idx.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "cumulus/core/error.h"
#include "cumulus/io/file.h"

namespace cumulus::data {

namespace {

constexpr std::size_t kChunk = std::size_t(4) << 20;  // 4 MiB
constexpr uint8_t kTypeUnsignedByte = 0x08;
// Deflate's densest encoding: a 258-byte match in about 2 bits, so at most ~1032 bytes out per byte
// in (gzip headers and trailers only lower the ratio of a whole file).
constexpr uint64_t kMaxDeflateRatio = 1032;
// The most one array may take in memory: far beyond any IDX dataset in use (Fashion-MNIST's
// training images are 47 MB), far below what a hostile header can claim (near 2^96 bytes).
constexpr uint64_t kMaxDataBytes = uint64_t(16) << 30;

std::string where(const std::string& path) { return "IDX file '" + path + "': "; }

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

// A stream of the file's (decompressed) bytes.
class Source {
 public:
  virtual ~Source() = default;
  // Reads up to n bytes; fewer only at the end of the data. Throws on read errors.
  virtual std::size_t read(uint8_t* dst, std::size_t n) = 0;
};

class PlainSource final : public Source {
 public:
  PlainSource(std::FILE* f, const std::string& path) : f_(f), path_(path) {}
  std::size_t read(uint8_t* dst, std::size_t n) override {
    const std::size_t got = std::fread(dst, 1, n, f_);
    if (got < n && std::ferror(f_)) throw Error(where(path_) + "read error: " + std::strerror(errno));
    return got;
  }

 private:
  std::FILE* f_;
  const std::string& path_;
};

// Inflates gzip members one after another (as gzip -d does with concatenated members). Anything
// after the last member that is not another member is corrupt data.
class GzipSource final : public Source {
 public:
  GzipSource(std::FILE* f, const std::string& path) : f_(f), path_(path) {
    std::memset(&z_, 0, sizeof(z_));
    if (inflateInit2(&z_, 16 + MAX_WBITS) != Z_OK)  // 16: expect a gzip wrapper
      throw Error(where(path_) + "cannot initialize zlib");
  }
  ~GzipSource() override { inflateEnd(&z_); }
  GzipSource(const GzipSource&) = delete;
  GzipSource& operator=(const GzipSource&) = delete;

  std::size_t read(uint8_t* dst, std::size_t n) override {
    std::size_t done = 0;
    while (done < n && !finished_) {
      if (z_.avail_in == 0 && !refill()) {
        if (!member_ended_) throw corrupt("truncated gzip stream (the file ends inside compressed data)");
        finished_ = true;  // clean end after a complete member
        break;
      }
      if (member_ended_) {  // more input after a complete member: another member must start
        if (z_.next_in[0] != 0x1f) throw corrupt("trailing garbage after the gzip stream");
        if (inflateReset(&z_) != Z_OK) throw corrupt("inflateReset failed");
        member_ended_ = false;
      }
      const std::size_t want = std::min<std::size_t>(n - done, std::numeric_limits<uInt>::max());
      z_.next_out = dst + done;
      z_.avail_out = static_cast<uInt>(want);
      const int rc = inflate(&z_, Z_NO_FLUSH);
      done += want - z_.avail_out;
      if (rc == Z_STREAM_END) {
        member_ended_ = true;
      } else if (rc == Z_BUF_ERROR) {
        // No progress possible: needs more input (handled by the refill above) or more output.
        if (z_.avail_in != 0 && z_.avail_out != 0) throw corrupt("inflate made no progress");
      } else if (rc != Z_OK) {
        throw corrupt(z_.msg ? z_.msg : zError(rc));
      }
    }
    return done;
  }

 private:
  bool refill() {
    const std::size_t got = std::fread(in_.data(), 1, in_.size(), f_);
    if (got == 0 && std::ferror(f_)) throw Error(where(path_) + "read error: " + std::strerror(errno));
    z_.next_in = in_.data();
    z_.avail_in = static_cast<uInt>(got);
    return got > 0;
  }
  Error corrupt(const std::string& detail) const { return Error(where(path_) + "corrupt gzip data (" + detail + ")"); }

  std::FILE* f_;
  const std::string& path_;
  z_stream z_;
  std::array<uint8_t, 1 << 16> in_{};
  bool member_ended_ = false;
  bool finished_ = false;
};

std::string dims_str(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// a * b, saturating at int64 max (a header's dims can multiply past 2^63).
int64_t mul_saturating(int64_t a, int64_t b) {
  if (a != 0 && b > std::numeric_limits<int64_t>::max() / a) return std::numeric_limits<int64_t>::max();
  return a * b;
}

// The payload's buffer, or an Error (not std::bad_alloc) when the host has too little memory.
void reserve(std::vector<uint8_t>& v, std::size_t bytes, const std::string& path) {
  try {
    v.reserve(bytes);
  } catch (const std::bad_alloc&) {
    throw Error(where(path) + "cannot allocate " + std::to_string(bytes) + " bytes for the data");
  } catch (const std::length_error&) {
    throw Error(where(path) + "cannot allocate " + std::to_string(bytes) + " bytes for the data");
  }
}

// An IDX file opened and its header read and checked, the source positioned at the data.
struct OpenIdx {
  File file;
  std::unique_ptr<Source> source;
  bool gzip = false;
  std::size_t header_size = 0;
  IdxArray out;                   // dims and count_in_file; no values yet
  int64_t payload = 1, item = 1;  // bytes in all, bytes per item (the product of dims after the first)
  std::string expectation() const {
    return detail::concat("the header's dimensions ", dims_str(out.dims), " need ", payload,
                          " bytes of data after the ", header_size, "-byte header");
  }
};

// The file opened into o.file and o.source (gzip recognized by its magic, not by the file name);
// returns its size in bytes.
int64_t open_source(const std::string& path, OpenIdx& o) {
  uint64_t size = 0;
  const int fd = io::open_regular_file(path, where(path), size);  // a FIFO or a device is refused, not waited on
  o.file.reset(::fdopen(fd, "rb"));
  if (!o.file) {
    const int saved = errno;
    ::close(fd);
    throw Error(where(path) + "cannot open: " + std::strerror(saved));
  }
  CUMULUS_CHECK(size <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), Error, where(path), "file size ",
                size, " is out of range");
  uint8_t magic2[2] = {0, 0};
  const std::size_t got_magic = std::fread(magic2, 1, 2, o.file.get());
  o.gzip = got_magic == 2 && magic2[0] == 0x1f && magic2[1] == 0x8b;
  std::rewind(o.file.get());
  if (o.gzip) o.source = std::make_unique<GzipSource>(o.file.get(), path);
  else o.source = std::make_unique<PlainSource>(o.file.get(), path);
  return static_cast<int64_t>(size);
}

// The header: 0x00 0x00, type, ndim, then ndim big-endian u32 dimensions, into o.out.dims,
// o.payload and o.item.
void read_dims(const std::string& path, int expected_ndim, OpenIdx& o) {
  const char* kind = o.gzip ? " (decompressed)" : "";
  const std::size_t header_size = o.header_size = 4 + 4 * static_cast<std::size_t>(expected_ndim);
  std::vector<uint8_t> header(header_size);
  std::size_t got = o.source->read(header.data(), 4);
  CUMULUS_CHECK(got == 4, Error, where(path), "truncated header: ", got, " bytes", kind,
                ", an IDX header needs at least 4");
  char magic[16];
  std::snprintf(magic, sizeof(magic), "0x%02x%02x%02x%02x", header[0], header[1], header[2], header[3]);
  CUMULUS_CHECK(header[0] == 0 && header[1] == 0, Error, where(path), "wrong magic ", magic,
                ": an IDX file starts with two zero bytes (expected 0x000008", expected_ndim < 16 ? "0" : "", std::hex,
                expected_ndim, ")");
  CUMULUS_CHECK(header[2] == kTypeUnsignedByte, Error, where(path), "wrong magic ", magic, ": data type 0x", std::hex,
                int(header[2]), " is not unsigned byte (0x08)");
  CUMULUS_CHECK(header[3] == expected_ndim, Error, where(path), "dimension mismatch: the header (magic ", magic,
                ") has ", int(header[3]), " dimensions, expected ", expected_ndim);
  got += o.source->read(header.data() + 4, header_size - 4);
  CUMULUS_CHECK(got == header_size, Error, where(path), "truncated header: ", got, " bytes", kind, ", ", expected_ndim,
                " dimensions need ", header_size);
  IdxArray& out = o.out;
  for (int d = 0; d < expected_ndim; ++d) {
    const uint8_t* p = header.data() + 4 + 4 * d;
    const int64_t dim = (int64_t(p[0]) << 24) | (int64_t(p[1]) << 16) | (int64_t(p[2]) << 8) | int64_t(p[3]);
    out.dims.push_back(dim);
    o.payload = mul_saturating(o.payload, dim);
    if (d > 0) o.item = mul_saturating(o.item, dim);
  }
  for (int d = 0; d < expected_ndim; ++d)
    CUMULUS_CHECK(out.dims[d] > 0, Error, where(path), "invalid dimensions ", dims_str(out.dims), ": dimension ", d,
                  " is 0");
  out.count_in_file = out.dims[0];
}

void read_header(const std::string& path, int expected_ndim, OpenIdx& o) {
  const int64_t file_size = open_source(path, o);
  read_dims(path, expected_ndim, o);
  // ---- the claim against the file: its size, or the most a gzip file inflates to (Note above) ----
  if (!o.gzip) {
    const int64_t data_bytes = file_size - static_cast<int64_t>(o.header_size);
    CUMULUS_CHECK(data_bytes >= o.payload, Error, where(path), "truncated: ", o.expectation(), ", the file has ",
                  data_bytes);
    CUMULUS_CHECK(data_bytes == o.payload, Error, where(path), "unexpected trailing data: ", o.expectation(),
                  ", the file has ", data_bytes);
    return;
  }
  const uint64_t most = static_cast<uint64_t>(mul_saturating(file_size, static_cast<int64_t>(kMaxDeflateRatio)));
  CUMULUS_CHECK(static_cast<uint64_t>(o.payload) + o.header_size <= most, Error, where(path),
                "truncated or corrupt: ", o.expectation(), ", but ", file_size,
                " bytes of gzip data inflate to at most ", most, " (deflate expands at most ", kMaxDeflateRatio,
                " times)");
}

}  // namespace

std::vector<int64_t> read_idx_dims(const std::string& path, int expected_ndim) {
  CUMULUS_CHECK(expected_ndim >= 1 && expected_ndim <= 255, InvalidArgument, where(path),
                "expected_ndim must be in [1, 255], got ", expected_ndim);
  OpenIdx o;
  read_header(path, expected_ndim, o);
  return o.out.dims;
}

void check_idx_pair(const std::string& images_path, const std::string& labels_path) {
  const std::vector<int64_t> images = read_idx_dims(images_path, 3);
  const std::vector<int64_t> labels = read_idx_dims(labels_path, 1);
  CUMULUS_CHECK(images[0] == labels[0], Error, "image and label counts differ: '", images_path, "' has ", images[0],
                " images, '", labels_path, "' has ", labels[0], " labels (from their headers; nothing was inflated)");
}

IdxArray read_idx_u8(const std::string& path, int expected_ndim, int64_t limit) {
  CUMULUS_CHECK(expected_ndim >= 1 && expected_ndim <= 255, InvalidArgument, where(path),
                "expected_ndim must be in [1, 255], got ", expected_ndim);
  CUMULUS_CHECK(limit >= 0, InvalidArgument, where(path), "limit must be >= 0 (0 reads everything), got ", limit);
  OpenIdx o;
  read_header(path, expected_ndim, o);
  IdxArray& out = o.out;
  const int64_t item = o.item;
  const auto expectation = [&] { return o.expectation(); };
  Source* const source = o.source.get();
  // What is read: everything, or the first `limit` items (Note [Reading a prefix]).
  const int64_t items = limit > 0 ? std::min(limit, out.dims[0]) : out.dims[0];
  const int64_t wanted = mul_saturating(items, item);
  const auto check_cap = [&] {
    CUMULUS_CHECK(
        static_cast<uint64_t>(wanted) <= kMaxDataBytes, Error, where(path), "too large: ",
        items == out.dims[0] ? expectation() : detail::concat(items, " items of ", item, " bytes need ", wanted),
        ", more than the reader's limit of ", kMaxDataBytes >> 30, " GiB (a corrupt or hostile header?)");
  };

  // ---- payload: a plain file's size was checked against the header before allocating (Note above) ----
  if (!o.gzip) {
    check_cap();
    reserve(out.values, static_cast<std::size_t>(wanted), path);
    out.values.resize(static_cast<std::size_t>(wanted));
    const std::size_t n = source->read(out.values.data(), out.values.size());
    CUMULUS_CHECK(n == out.values.size(), Error, where(path), "truncated while reading: ", expectation(), ", read ", n);
    out.dims[0] = items;
    return out;
  }

  // gzip: the claim is bounded by what the file can inflate to, then the buffer grows with the
  // data that arrives (Note [Allocate only what arrived]).
  check_cap();
  const auto expected = static_cast<std::size_t>(wanted);
  reserve(out.values, expected, path);
  while (out.values.size() < expected) {
    const std::size_t have = out.values.size();
    const std::size_t chunk = std::min(kChunk, expected - have);
    out.values.resize(have + chunk);
    const std::size_t n = source->read(out.values.data() + have, chunk);
    if (n < chunk) {
      out.values.resize(have + n);
      break;
    }
  }
  CUMULUS_CHECK(out.values.size() == expected, Error, where(path), "truncated: ", expectation(),
                ", the decompressed data has ", out.values.size());
  out.dims[0] = items;
  if (items < out.count_in_file) return out;  // a prefix: the rest is not inflated
  // Anything more is an error, found within one small read. Reading to the end also verifies the
  // gzip CRC: corrupted data is reported as corruption rather than as a size mismatch.
  std::vector<uint8_t> scratch(1 << 16);
  const std::size_t extra = source->read(scratch.data(), scratch.size());
  CUMULUS_CHECK(extra == 0, Error, where(path), "unexpected trailing data: ", expectation(),
                ", the decompressed data has ", extra == scratch.size() ? "more than " : "", expected + extra);
  return out;
}

}  // namespace cumulus::data
