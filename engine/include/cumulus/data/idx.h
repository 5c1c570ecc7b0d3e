// IDX files (the MNIST / Fashion-MNIST format), plain or gzip-compressed (detected by the gzip
// magic, read through zlib). Everything is checked before anything large is allocated: the magic
// (0x0000 then type 0x08 = unsigned byte, then the number of dimensions), the dimensions, and the
// element count against the file's (decompressed) size. Each fault is an Error naming the file and
// the fault: missing, unreadable, truncated, corrupt gzip, wrong magic, dimension mismatch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cumulus::data {

struct IdxArray {
  std::vector<int64_t> dims;  // e.g. {60000, 28, 28}
  std::vector<uint8_t> values;
};

// Reads an unsigned-byte IDX array with `expected_ndim` dimensions.
IdxArray read_idx_u8(const std::string& path, int expected_ndim);

}  // namespace cumulus::data
