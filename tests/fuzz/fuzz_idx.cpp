// Fuzzes cumulus::data::read_idx_u8 (engine/data/idx.cpp), plain and gzip paths.
//
// Input: one mode byte, then the file. Mode bit 0 set: the rest is gzip-compressed here before it
// is written, so the fuzzer explores IDX headers and sizes behind the gzip path, not only corrupt
// deflate streams; clear: the rest is the file as is (plain IDX, or a gzip file mutated directly).
// Bits 1-2: the number of dimensions the reader expects, minus one (1 = labels, 3 = images).
// Bit 3 set: read with a limit of 1 + (mode >> 4) items (1 to 16), the --train-limit path.
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "cumulus/core/error.h"
#include "cumulus/data/idx.h"
#include "fuzz_input.h"

namespace {

std::string gzip(const uint8_t* data, std::size_t size) {
  z_stream z;
  std::memset(&z, 0, sizeof z);
  if (deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) __builtin_trap();
  std::string out(deflateBound(&z, static_cast<uLong>(size)), '\0');
  z.next_in = const_cast<Bytef*>(data);
  z.avail_in = static_cast<uInt>(size);
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) __builtin_trap();
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  static cumulus::fuzz::InputFile file("fuzz_idx");
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const int ndim = 1 + ((mode >> 1) & 3);
  const int64_t limit = (mode & 8) ? 1 + (mode >> 4) : 0;
  if (mode & 1) {
    const std::string gz = gzip(data + 1, size - 1);
    file.write(gz.data(), gz.size());
  } else {
    file.write(data + 1, size - 1);
  }
  try {
    const cumulus::data::IdxArray a = cumulus::data::read_idx_u8(file.path(), ndim, limit);
    // Whatever is accepted is consistent: the dimensions asked for, positive, as many values as
    // they multiply to, and no more items than the file has or the limit allows.
    if (a.dims.size() != static_cast<std::size_t>(ndim)) __builtin_trap();
    if (a.dims[0] > a.count_in_file || (limit > 0 && a.dims[0] != std::min(limit, a.count_in_file))) __builtin_trap();
    if (limit == 0 && a.dims[0] != a.count_in_file) __builtin_trap();
    std::size_t n = 1;
    for (int64_t d : a.dims) {
      if (d <= 0) __builtin_trap();
      n *= static_cast<std::size_t>(d);
    }
    if (n != a.values.size()) __builtin_trap();
  } catch (const cumulus::Error&) {
    // The expected outcome for malformed input.
  }
  return 0;
}
