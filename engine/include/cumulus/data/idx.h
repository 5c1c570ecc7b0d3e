// IDX files (the MNIST / Fashion-MNIST format), plain or gzip-compressed (detected by the gzip
// magic, read through zlib). Everything is checked before anything large is allocated: the magic
// (0x0000 then type 0x08 = unsigned byte, then the number of dimensions), the dimensions, and the
// element count against the file's size (a gzip file's claim against the most it can inflate to,
// then against the data that arrives). Each fault is an Error naming the file and the fault:
// missing, not a regular file (a FIFO, a directory, a device: refused, never waited on),
// unreadable, truncated, trailing data, corrupt gzip, wrong magic, dimension mismatch, more than
// 16 GiB of data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cumulus::data {

struct IdxArray {
  std::vector<int64_t> dims;  // of `values`, e.g. {60000, 28, 28}; dims[0] is less with a limit
  std::vector<uint8_t> values;
  int64_t count_in_file = 0;  // the first dimension as the header gives it
};

// Reads an unsigned-byte IDX array with `expected_ndim` dimensions. `limit` > 0 reads only the
// first `limit` items along the first dimension (all of them if the file has fewer): a gzip file
// is inflated only that far, so damage after them goes unnoticed; a plain file is still checked
// against its size.
IdxArray read_idx_u8(const std::string& path, int expected_ndim, int64_t limit = 0);

// The dimensions an IDX file's header gives, checked as read_idx_u8 checks them (magic, dimensions,
// the claim against the file's size or against the most a gzip file can inflate to). Only the
// header is read: a gzip file is inflated no further than its first bytes.
std::vector<int64_t> read_idx_dims(const std::string& path, int expected_ndim);

// An images file (3 dimensions) and its labels file (1 dimension) checked against each other from
// their headers alone, before either is inflated: a 2 MB gzip claiming two million images beside a
// labels file of 512 is refused without inflating anything (issue 30 item 12). Throws
// cumulus::Error naming both files and both counts.
void check_idx_pair(const std::string& images_path, const std::string& labels_path);

}  // namespace cumulus::data
