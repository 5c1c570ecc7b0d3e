// CSV reader (cumulus/data/csv.h). zlib's gz* calls read plain and gzip files alike. Written here
// rather than taken from a library: none on the approved list reads CSV, and a numeric table needs
// only strtof and a line loop.
#include "cumulus/data/csv.h"

#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cumulus/core/error.h"
#include "cumulus/io/file.h"
#include "cumulus/memory/category.h"

namespace cumulus::data {

namespace {

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzHandle = std::unique_ptr<gzFile_s, GzCloser>;

GzHandle open_csv(const std::string& path) {
  uint64_t size = 0;
  const int fd = io::open_regular_file(path, path, size);  // refuses FIFOs and devices, names the file
  gzFile file = gzdopen(fd, "rb");
  if (file == nullptr) ::close(fd);
  CUMULUS_CHECK(file != nullptr, Error, path, ": cannot open: out of memory");
  return GzHandle(file);
}

// One line without its end, or false at the end of the file. Lines may be of any length.
bool read_line(gzFile file, const std::string& path, std::string& line) {
  line.clear();
  char chunk[4096];
  while (gzgets(file, chunk, sizeof chunk) != nullptr) {
    line += chunk;
    if (!line.empty() && line.back() == '\n') break;
  }
  int err = Z_OK;
  const char* message = gzerror(file, &err);
  CUMULUS_CHECK(err == Z_OK || err == Z_STREAM_END, Error, path, ": cannot read: ", message);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  return !line.empty() || !gzeof(file);
}

// The values of one line, appended to `out`; returns how many.
int64_t parse_row(const std::string& line, const std::string& path, int64_t line_number, std::vector<float>& out) {
  int64_t count = 0;
  const char* p = line.c_str();
  while (true) {
    char* end = nullptr;
    errno = 0;
    const float v = std::strtof(p, &end);
    while (*end == ' ' || *end == '\t') ++end;
    CUMULUS_CHECK(end != p && (*end == ',' || *end == '\0') && errno != ERANGE, Error, path, ": line ", line_number,
                  ", column ", count + 1, ": not a number: '", std::string(p, line.c_str() + line.size()).substr(0, 32),
                  "'");
    out.push_back(v);
    ++count;
    if (*end == '\0') return count;
    p = end + 1;
  }
}

bool blank(const std::string& line) { return line.find_first_not_of(" \t") == std::string::npos; }

}  // namespace

Tensor read_csv(const std::string& path, Device device) {
  GzHandle file = open_csv(path);
  std::vector<float> values;
  std::string line;
  int64_t rows = 0, columns = 0;
  for (int64_t line_number = 1; read_line(file.get(), path, line); ++line_number) {
    if (blank(line)) continue;
    const int64_t n = parse_row(line, path, line_number, values);
    CUMULUS_CHECK(rows == 0 || n == columns, Error, path, ": line ", line_number, " has ", n,
                  " values, the rows before it ", columns);
    columns = n;
    ++rows;
  }
  CUMULUS_CHECK(rows > 0, Error, path, ": no rows");
  MemoryCategoryScope scope(MemoryCategory::data);
  return Tensor::from_vector(values, {rows, columns}, device);
}

LabelledTable read_csv_classification(const std::string& path, Device device) {
  const Tensor table = read_csv(path);
  const int64_t rows = table.size(0), columns = table.size(1);
  CUMULUS_CHECK(columns >= 2, Error, path, ": a classification table needs features and a label column, got ",
                columns, " column");
  const std::vector<float> values = table.to_vector<float>();
  std::vector<float> features;
  std::vector<int32_t> labels;
  features.reserve(static_cast<std::size_t>(rows * (columns - 1)));
  for (int64_t r = 0; r < rows; ++r) {
    const auto row = values.begin() + r * columns;
    features.insert(features.end(), row, row + columns - 1);
    const float label = row[columns - 1];
    CUMULUS_CHECK(label >= 0.0f && label < 2147483648.0f && label == std::floor(label), Error, path, ": row ", r + 1,
                  ": the label ", label, " is not a class index (an integer >= 0)");
    labels.push_back(static_cast<int32_t>(label));
  }
  MemoryCategoryScope scope(MemoryCategory::data);
  return {Tensor::from_vector(features, {rows, columns - 1}, device), Tensor::from_vector(labels, {rows}, device)};
}

}  // namespace cumulus::data
