// safetensors: writing builds the whole file in memory (8-byte length, header JSON padded with
// spaces to a multiple of 8 as the reference implementation does, data in the given order) and
// hands it to write_file_atomic. Reading checks the header completely before allocating tensors:
// the reference implementation's rules (known dtypes, shapes matching byte ranges, ranges that
// tile the data section exactly: no gap, no overlap, nothing left over), plus unique names.
//
// Note [Checksum]: a file whose metadata has "checksum_crc32" is verified on load, so a truncated
// or bit-flipped file is an error rather than silently wrong numbers. The value is 8 lowercase
// hex digits: zlib's CRC-32 over a canonical form of the header (for each tensor in data order
// its name, dtype, shape; then every other metadata key and value, sorted by key; each string
// followed by a NUL byte), then the data section. save_safetensors computes it when the metadata
// it is given has the key (the given value is replaced), so callers opt in by naming it
// (apps/fashion_mnist's checkpoints do). Files without the key, PyTorch's among them, load as before.
// The checksum covers the bytes as stored, under the dtype name the file gives (F64, not F32).
//
// Note [Hostile headers]: the header is untrusted text of up to 100 MB. Before it is parsed, its
// nesting depth is counted (brackets outside strings) and refused past kMaxJsonDepth: a valid
// header nests 3 deep, and the JSON library's dump, used in messages, recurses once per level (a
// value 100,000 levels deep overflowed the stack). Whatever a message quotes from the file (names,
// values) goes through excerpt(), so no message grows with the file.
//
// Note [Dtypes read]: F32, I32, U8, BF16 and F16 load as they are stored. Wider types the engine
// does not hold are converted on load: F64 to f32 rounded to nearest (as a cast does; beyond the f32
// range that is +-inf), I64 to i32 with every value range-checked (an error names the tensor, the
// index and the value). BOOL loads as bool, every byte checked to be 0 or 1 (what a bool tensor
// holds, Note [Bool tensors] in engine/ops/compare.cpp).
// A state-dict loader converts further to the model's dtype.
#include "cumulus/io/safetensors.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "cumulus/core/error.h"
#include "cumulus/io/file.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; so is every host we build for");

namespace cumulus::io {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the reference rejects headers past 100 MB
constexpr const char* kMetadataKey = "__metadata__";
constexpr const char* kChecksumKey = "checksum_crc32";  // Note [Checksum]
constexpr int kMaxJsonDepth = 8;                        // Note [Hostile headers]: a valid header needs 3

std::string where(const std::string& path) { return "safetensors file '" + path + "': "; }
std::string where(const std::string& path, const std::string& name) {
  return where(path) + "tensor '" + excerpt(name) + "': ";
}

// A JSON value from the file, shortened for a message (Note [Hostile headers]).
std::string quote(const nlohmann::json& j) {
  return excerpt(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

const char* file_dtype(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::i32: return "I32";
    case DType::u8: return "U8";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i64: return "I64";
    case DType::boolean: return "BOOL";
  }
  return nullptr;
}

// A dtype as stored, and the engine dtype it loads as (Note [Dtypes read]).
enum class Decode { none, f64, i64, boolean };  // none: the bytes are the tensor's as they are
struct StoredDtype {
  const char* name;
  std::size_t size;  // bytes per element in the file
  DType loads_as;
  Decode decode;
};
constexpr StoredDtype kStoredDtypes[] = {
    {"F32", 4, DType::f32, Decode::none}, {"I32", 4, DType::i32, Decode::none},
    {"U8", 1, DType::u8, Decode::none},   {"BF16", 2, DType::bf16, Decode::none},
    {"F16", 2, DType::f16, Decode::none}, {"F64", 8, DType::f32, Decode::f64},
    {"I64", 8, DType::i32, Decode::i64},  {"BOOL", 1, DType::boolean, Decode::boolean},
};

const StoredDtype* parse_dtype(const std::string& s) {
  for (const StoredDtype& d : kStoredDtypes)
    if (s == d.name) return &d;
  return nullptr;
}

// Refuses a header nested deeper than kMaxJsonDepth before the parser sees it (Note [Hostile
// headers]). Brackets count only outside strings; inside one, a backslash escapes the next byte.
void check_json_depth(const std::string& path, const std::string& text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      CUMULUS_CHECK(++depth <= kMaxJsonDepth, Error, where(path), "the header nests arrays and objects more than ",
                    kMaxJsonDepth, " deep (at byte ", 8 + i, "; a safetensors header needs 3): corrupt or hostile");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

// Closes the descriptor on every path out.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads exactly n bytes at `offset`; false on a short read (errno set on an error).
bool read_at(int fd, void* dst, std::size_t n, uint64_t offset) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<std::size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return true;
}

// CRC-32 (zlib's) of a byte stream fed in pieces (Note [Checksum]).
class Checksum {
 public:
  void add(const void* data, std::size_t n) {
    const auto* p = static_cast<const Bytef*>(data);
    while (n > 0) {
      const auto piece = static_cast<uInt>(std::min<std::size_t>(n, std::numeric_limits<uInt>::max()));
      crc_ = ::crc32(crc_, p, piece);
      p += piece;
      n -= piece;
    }
  }
  void add_field(const std::string& s) { add(s.c_str(), s.size() + 1); }  // with its NUL
  // One tensor's header fields, in data order.
  void add_tensor(const std::string& name, const char* dtype, const Shape& shape) {
    add_field(name);
    add_field(dtype);
    add_field(shape.str());
  }
  // The metadata but the checksum itself, in key order.
  void add_metadata(const std::map<std::string, std::string>& metadata) {
    for (const auto& [k, v] : metadata) {
      if (k == kChecksumKey) continue;
      add_field(k);
      add_field(v);
    }
  }
  std::string hex() const {
    char buf[9];
    std::snprintf(buf, sizeof buf, "%08lx", static_cast<unsigned long>(crc_ & 0xffffffffu));
    return buf;
  }

 private:
  uLong crc_ = ::crc32(0L, Z_NULL, 0);
};

struct Entry {
  std::string name;
  const StoredDtype* dtype;
  Shape shape;
  uint64_t begin, end;
};

// One tensor's header entry: {"dtype": str, "shape": [u64...], "data_offsets": [u64, u64]}.
Entry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& j) {
  const std::string at = where(path, name);
  CUMULUS_CHECK(j.is_object(), Error, at, "header entry is not an object");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    CUMULUS_CHECK(j.contains(key), Error, at, "header entry has no \"", key, "\"");
  Entry e;
  e.name = name;
  CUMULUS_CHECK(j["dtype"].is_string(), Error, at, "dtype is not a string: ", quote(j["dtype"]));
  const std::string dtype = j["dtype"].get<std::string>();
  e.dtype = parse_dtype(dtype);
  CUMULUS_CHECK(e.dtype != nullptr, Error, at, "unsupported dtype \"", excerpt(dtype),
                "\" (cumulus reads F32, F16, BF16, F64, I64, I32 and U8)");
  const auto& shape = j["shape"];
  CUMULUS_CHECK(shape.is_array(), Error, at, "shape is not an array: ", quote(shape));
  CUMULUS_CHECK(shape.size() <= static_cast<std::size_t>(Shape::kMaxDims), Error, at, "shape ", quote(shape),
                " has more than ", Shape::kMaxDims, " dimensions");
  uint64_t bytes = e.dtype->size;
  bool overflow = false;
  for (const auto& d : shape) {
    CUMULUS_CHECK(d.is_number_unsigned(), Error, at, "shape ", quote(shape), " must hold non-negative integers");
    const auto v = d.get<uint64_t>();
    CUMULUS_CHECK(v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), Error, at, "shape ", quote(shape),
                  " is too large");
    if (v != 0 && bytes > std::numeric_limits<uint64_t>::max() / v) overflow = true;
    else bytes *= v;
    e.shape.push_back(static_cast<int64_t>(v));
  }
  // An overflow stays an error even when a later dimension is 0, as in the reference (a checked
  // product taken in order): Shape::numel() would overflow on such a shape (found by fuzz_safetensors).
  const auto& off = j["data_offsets"];
  CUMULUS_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(), Error,
                at, "data_offsets must be [begin, end] with non-negative integers, got ", quote(off));
  e.begin = off[0].get<uint64_t>();
  e.end = off[1].get<uint64_t>();
  CUMULUS_CHECK(e.begin <= e.end, Error, at, "invalid data_offsets [", e.begin, ", ", e.end, "]: begin is past end");
  CUMULUS_CHECK(!overflow && bytes == e.end - e.begin, Error, at, "size mismatch: shape ", quote(shape), " of ", dtype,
                " needs ", overflow ? std::string("more than 2^64") : std::to_string(bytes), " bytes, data_offsets [",
                e.begin, ", ", e.end, "] hold ", e.end - e.begin);
  return e;
}

}  // namespace

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata, OutputLinks links) {
  // ordered_json keeps "__metadata__" first and the tensors in the given order (any order is valid).
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  const bool with_checksum = metadata.count(kChecksumKey) != 0;
  Checksum checksum;
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    if (with_checksum) meta[kChecksumKey] = "00000000";  // a placeholder of the value's width, patched below
    header[kMetadataKey] = std::move(meta);
  }
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    CUMULUS_CHECK(name != kMetadataKey, InvalidArgument, where(path), "\"", kMetadataKey,
                  "\" is reserved and cannot name a tensor");
    CUMULUS_CHECK(seen.insert(name).second, InvalidArgument, where(path, name), "duplicate tensor name");
    CUMULUS_CHECK(t.defined(), InvalidArgument, where(path, name), "undefined tensor");
    const char* dtype = file_dtype(t.dtype());
    CUMULUS_CHECK(dtype != nullptr, InvalidArgument, where(path, name), "dtype ", dtype_name(t.dtype()),
                  " cannot be saved (F32, I32, U8, BF16 and F16 can)");
    nlohmann::ordered_json shape = nlohmann::ordered_json::array();
    for (int d = 0; d < t.ndim(); ++d) shape.push_back(t.shape()[d]);
    const uint64_t end = offset + t.nbytes();
    header[name] = {{"dtype", dtype}, {"shape", std::move(shape)}, {"data_offsets", {offset, end}}};
    offset = end;
    checksum.add_tensor(name, dtype, t.shape());
  }
  checksum.add_metadata(metadata);

  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string content;
  content.reserve(8 + json.size() + offset);
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) content.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  content += json;
  const std::size_t data_start = content.size();
  content.resize(data_start + offset);
  char* dst = content.data() + data_start;
  for (const auto& [name, t] : tensors) {
    copy_bytes(dst, Device::cpu(), t.raw_data(), t.device(), t.nbytes());  // synchronizes for CUDA
    dst += t.nbytes();
  }
  if (with_checksum) {
    // The placeholder is in "__metadata__", the first object of the header; keys and values are
    // JSON-escaped, so no other text there can read as this key followed by a string.
    checksum.add(content.data() + data_start, offset);
    const std::string key = std::string("\"") + kChecksumKey + "\":\"";
    const std::size_t at = content.find(key, 8);
    CUMULUS_CHECK(at != std::string::npos && at < data_start, Error, where(path),
                  "internal: checksum placeholder not found");
    content.replace(at + key.size(), 8, checksum.hex());
  }
  write_file_atomic(path, content, links);
}

namespace {

// A validated header: its entries sorted by data offset (they tile the data section) and its
// metadata; the file stays open for the data.
struct Header {
  Fd file;
  uint64_t data_start = 0;
  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;
};

// The header's JSON text: the 8-byte little-endian length first, checked against the file's size.
std::string read_header_text(const std::string& path, int fd, uint64_t file_size) {
  CUMULUS_CHECK(file_size >= 8, Error, where(path), "file too short: ", file_size,
                " bytes, a safetensors file starts with an 8-byte header length");
  unsigned char len[8];
  CUMULUS_CHECK(read_at(fd, len, 8, 0), Error, where(path), "cannot read the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  CUMULUS_CHECK(n <= kMaxHeaderBytes, Error, where(path), "header length ", n, " is absurd (limit ", kMaxHeaderBytes,
                " bytes): not a safetensors file, or a corrupt one");
  CUMULUS_CHECK(8 + n <= file_size, Error, where(path), "header length ", n, " runs past the end of the file (",
                file_size, " bytes): truncated or corrupt");
  std::string text(n, '\0');
  errno = 0;
  CUMULUS_CHECK(read_at(fd, text.data(), n, 8), Error, where(path), "cannot read the ", n,
                "-byte header: ", std::strerror(errno));
  return text;
}

// The header parsed: a JSON object of no repeated top-level key.
nlohmann::json parse_header(const std::string& path, const std::string& text) {
  const std::size_t n = text.size();
  // JSON has no raw NUL byte (one in a string is escaped), but the parser stops at one as at the end
  // of its input: "{...}\0garbage" would pass, and a flipped bit in the padding go unnoticed.
  CUMULUS_CHECK(text.find('\0') == std::string::npos, Error, where(path), "the ", n,
                "-byte header contains a NUL byte at offset ", 8 + text.find('\0'), ": not valid JSON (corrupt)");
  check_json_depth(path, text);
  // Top-level keys are recorded as they are parsed: a JSON object may legally repeat a key (the
  // parser keeps one), but a file that names two tensors alike is corrupt.
  int depth = 0;
  std::string duplicate;
  std::set<std::string> keys;
  auto callback = [&](int d, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    (void)d;
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start || event == E::array_start) ++depth;
    else if (event == E::object_end || event == E::array_end) --depth;
    else if (event == E::key && depth == 1 && !keys.insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  nlohmann::json header = nlohmann::json::parse(text, callback, /*allow_exceptions=*/false);
  CUMULUS_CHECK(!header.is_discarded(), Error, where(path), "the ", n, "-byte header is not valid JSON");
  CUMULUS_CHECK(header.is_object(), Error, where(path), "the header is not a JSON object");
  CUMULUS_CHECK(duplicate.empty(), Error, where(path, duplicate), "duplicate tensor name in the header");
  return header;
}

// The byte ranges tile the data section: sorted, each starts where the last ended.
void check_tiling(const std::string& path, std::vector<Entry>& entries, uint64_t data_size) {
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    CUMULUS_CHECK(e.end <= data_size, Error, where(path, e.name), "data_offsets [", e.begin, ", ", e.end,
                  "] out of range: the data section has ", data_size, " bytes (truncated or corrupt)");
    CUMULUS_CHECK(e.begin >= covered, Error, where(path, e.name), "data_offsets [", e.begin, ", ", e.end,
                  "] overlap tensor '", previous ? previous->name : "", "' (which ends at ", covered, ")");
    CUMULUS_CHECK(e.begin == covered, Error, where(path, e.name), "data_offsets [", e.begin, ", ", e.end,
                  "] leave a gap: bytes [", covered, ", ", e.begin, ") belong to no tensor");
    covered = e.end;
    previous = &e;
  }
  CUMULUS_CHECK(covered == data_size, Error, where(path), "the tensors cover ", covered,
                " bytes but the data section has ", data_size, ": trailing bytes belong to no tensor");
}

void read_header(const std::string& path, Header& out) {
  uint64_t file_size = 0;
  out.file.fd = open_regular_file(path, where(path), file_size);  // a FIFO or a device is refused, not waited on
  const std::string text = read_header_text(path, out.file.fd, file_size);
  const nlohmann::json header = parse_header(path, text);
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      if (value.is_null()) continue;  // the reference writes no key, but reads null as none
      CUMULUS_CHECK(value.is_object(), Error, where(path), "\"", kMetadataKey, "\" is not an object");
      for (const auto& [k, v] : value.items()) {
        CUMULUS_CHECK(v.is_string(), Error, where(path), "metadata \"", excerpt(k), "\" is not a string: ", quote(v));
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    out.entries.push_back(parse_entry(path, name, value));
  }
  out.data_start = 8 + text.size();
  check_tiling(path, out.entries, file_size - out.data_start);
}

// A converted tensor's values from the file's bytes `in` into `host` (Note [Dtypes read]): F64 rounded
// to f32, I64 narrowed to i32, BOOL bytes to 0 or 1. The first value out of range is kept in
// `range_error`, reported after the checksum so that a corrupt file is named as such first.
void decode_tensor(const std::string& path, const Entry& e, const char* in, void* host, std::size_t count,
                   std::string& range_error) {
  if (e.dtype->decode == Decode::f64) {
    auto* dst = static_cast<float*>(host);
    for (std::size_t i = 0; i < count; ++i) {
      double d;
      std::memcpy(&d, in + 8 * i, 8);
      dst[i] = static_cast<float>(d);  // round to nearest, as the FPU's default mode does
    }
  } else if (e.dtype->decode == Decode::i64) {
    auto* dst = static_cast<int32_t*>(host);
    for (std::size_t i = 0; i < count; ++i) {
      int64_t v;
      std::memcpy(&v, in + 8 * i, 8);
      if ((v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) && range_error.empty())
        range_error = detail::concat(where(path, e.name), "I64 value ", v, " at index ", i,
                                     " does not fit in i32 (cumulus holds I64 tensors as i32)");
      dst[i] = static_cast<int32_t>(v);
    }
  } else if (e.dtype->decode == Decode::boolean) {
    auto* dst = static_cast<uint8_t*>(host);
    for (std::size_t i = 0; i < count; ++i) {
      const auto v = static_cast<uint8_t>(in[i]);
      if (v > 1 && range_error.empty())
        range_error = detail::concat(where(path, e.name), "BOOL byte ", static_cast<int>(v), " at index ", i,
                                     " is neither 0 nor 1");
      dst[i] = v != 0;
    }
  }
}

}  // namespace

SafetensorsHeader read_safetensors_header(const std::string& path) {
  Header h;
  read_header(path, h);
  SafetensorsHeader out;
  out.metadata = std::move(h.metadata);
  for (const Entry& e : h.entries) out.tensors.push_back({e.name, e.dtype->loads_as, e.shape});
  return out;
}

SafetensorsContents load_safetensors(const std::string& path, Device device) {
  check_device_available(device);
  Header h;
  read_header(path, h);
  const Fd& file = h.file;
  const std::vector<Entry>& entries = h.entries;
  const uint64_t data_start = h.data_start;
  SafetensorsContents out;
  out.metadata = std::move(h.metadata);

  // ---- the checksum, when the file has one (Note [Checksum]) ----
  std::string stored_checksum;
  Checksum checksum;
  if (auto it = out.metadata.find(kChecksumKey); it != out.metadata.end()) {
    stored_checksum = it->second;
    CUMULUS_CHECK(
        stored_checksum.size() == 8 && stored_checksum.find_first_not_of("0123456789abcdef") == std::string::npos,
        Error, where(path), "corrupt: metadata \"", kChecksumKey, "\" is \"", excerpt(stored_checksum),
        "\", not 8 lowercase hex digits");
    for (const Entry& e : entries) checksum.add_tensor(e.name, e.dtype->name, e.shape);
    checksum.add_metadata(out.metadata);
  }

  // ---- the tensors, in data order (Note [Dtypes read]) ----
  std::vector<char> stored;   // the file's bytes of a tensor that is converted
  std::vector<char> staging;  // the tensor's bytes on the host, bound for CUDA
  std::string range_error;    // an I64 value past i32 or a BOOL byte not 0 or 1, reported after the checksum
  for (const Entry& e : entries) {
    Tensor t;
    try {
      t = Tensor::empty(e.shape, e.dtype->loads_as, device);
    } catch (const OutOfMemory& oom) {
      throw OutOfMemory(where(path, e.name) + "shape " + e.shape.str() + " does not fit in memory: " + oom.what());
    }
    const std::size_t bytes = t.nbytes(), file_bytes = e.end - e.begin;
    const std::size_t count = static_cast<std::size_t>(t.numel());
    void* host = t.raw_data();
    if (device.is_cuda()) {
      staging.resize(bytes);
      host = staging.data();
    }
    void* src = host;
    if (e.dtype->decode != Decode::none) {
      stored.resize(file_bytes);
      src = stored.data();
    }
    errno = 0;
    CUMULUS_CHECK(read_at(file.fd, src, file_bytes, data_start + e.begin), Error, where(path, e.name), "cannot read ",
                  file_bytes, " bytes of data: ", errno ? std::strerror(errno) : "file shrank");
    if (!stored_checksum.empty()) checksum.add(src, file_bytes);
    decode_tensor(path, e, static_cast<const char*>(src), host, count, range_error);
    if (device.is_cuda()) copy_bytes(t.raw_data(), device, staging.data(), Device::cpu(), bytes);
    out.tensors.emplace_back(e.name, std::move(t));
  }
  CUMULUS_CHECK(stored_checksum.empty() || checksum.hex() == stored_checksum, Error, where(path),
                "corrupt: checksum mismatch (", kChecksumKey, " ", stored_checksum, " stored, ", checksum.hex(),
                " computed): the file changed after it was written (a flipped bit, a partial copy)");
  if (!range_error.empty()) throw Error(range_error);
  return out;
}

}  // namespace cumulus::io
