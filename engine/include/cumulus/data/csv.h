// Numeric tables in CSV (comma-separated, one row per line), plain or gzip-compressed (zlib tells
// them apart): scikit-learn's bundled datasets (digits.csv.gz) and what numpy.savetxt writes. The
// C++ side of numpy.loadtxt(..., delimiter=","), for the examples and a user's own data.
#pragma once

#include <string>

#include "cumulus/tensor/tensor.h"

namespace cumulus::data {

// Every row of the file at `path` as an f32 tensor [rows, columns] on `device` (category data).
// Blank lines are skipped. An Error names the file, the line and, for a bad value, the column:
// missing, not a regular file, corrupt gzip, a value that is not a number, rows of different
// lengths, no rows at all.
Tensor read_csv(const std::string& path, Device device = Device::cpu());

// A classification table (scikit-learn's layout): every column but the last as f32 features
// [rows, columns - 1] and the last as i32 class labels [rows], on `device` (category data). A label
// that is not an integer in [0, 2^31) is an Error naming the file and its line.
struct LabelledTable {
  Tensor features;
  Tensor labels;
};
LabelledTable read_csv_classification(const std::string& path, Device device = Device::cpu());

}  // namespace cumulus::data
