// data::read_csv: plain and gzip files, and every refusal naming the file and the place.
#include <gtest/gtest.h>
#include <zlib.h>

#include <fstream>

#include "cumulus/core/error.h"
#include "cumulus/data/csv.h"
#include "test_util.h"

namespace cumulus::testing {
namespace {

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

void write_gzip(const std::string& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())), static_cast<int>(text.size()));
  gzclose(f);
}

std::string error_of(const std::string& path) {
  try {
    data::read_csv(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Csv, ReadsPlainAndGzipAlike) {
  TempDir dir;
  const std::string text = "0,1.5,-2\n\n3e2, 4 ,5\r\n6,7,8";  // a blank line, spaces, CRLF, no final newline
  write_text(dir.file("t.csv"), text);
  write_gzip(dir.file("t.csv.gz"), text);
  for (const char* name : {"t.csv", "t.csv.gz"}) {
    const Tensor t = data::read_csv(dir.file(name));
    EXPECT_EQ(t.shape(), Shape({3, 3})) << name;
    EXPECT_EQ(t.memory_category(), MemoryCategory::data);
    EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0, 1.5f, -2, 300, 4, 5, 6, 7, 8})) << name;
  }
}

TEST(Csv, RefusalsNameTheFileAndThePlace) {
  TempDir dir;
  write_text(dir.file("ragged.csv"), "1,2,3\n4,5\n");
  EXPECT_NE(error_of(dir.file("ragged.csv")).find("ragged.csv: line 2 has 2 values, the rows before it 3"),
            std::string::npos)
      << error_of(dir.file("ragged.csv"));
  write_gzip(dir.file("word.csv.gz"), "1,2\n3,x4\n");
  EXPECT_NE(error_of(dir.file("word.csv.gz")).find("word.csv.gz: line 2, column 2: not a number: 'x4'"),
            std::string::npos)
      << error_of(dir.file("word.csv.gz"));
  write_text(dir.file("empty.csv"), "\n\n");
  EXPECT_NE(error_of(dir.file("empty.csv")).find("empty.csv: no rows"), std::string::npos);
  write_text(dir.file("trailing.csv"), "1,2,\n");
  EXPECT_NE(error_of(dir.file("trailing.csv")).find("line 1, column 3: not a number"), std::string::npos)
      << error_of(dir.file("trailing.csv"));
  EXPECT_NE(error_of(dir.file("missing.csv")).find("missing.csv"), std::string::npos);
  EXPECT_NE(error_of(dir.str()).find("directory"), std::string::npos) << error_of(dir.str());
}

TEST(Csv, CorruptGzipIsAnError) {
  TempDir dir;
  write_gzip(dir.file("c.csv.gz"), std::string(20000, '1') + "\n");
  std::fstream f(dir.file("c.csv.gz"), std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(40);
  f.write("garbage!garbage!", 16);
  f.close();
  EXPECT_NE(error_of(dir.file("c.csv.gz")).find("c.csv.gz: cannot read"), std::string::npos)
      << error_of(dir.file("c.csv.gz"));
}

TEST(Csv, AClassificationTableSplitsOffItsLabels) {
  TempDir dir;
  write_gzip(dir.file("digits.csv.gz"), "0,16,3\n4,5,9\n");
  const data::LabelledTable t = data::read_csv_classification(dir.file("digits.csv.gz"));
  EXPECT_EQ(t.features.shape(), Shape({2, 2}));
  EXPECT_EQ(t.features.to_vector<float>(), (std::vector<float>{0, 16, 4, 5}));
  EXPECT_EQ(t.labels.to_vector<int32_t>(), (std::vector<int32_t>{3, 9}));
  EXPECT_EQ(t.labels.memory_category(), MemoryCategory::data);
  for (const char* bad : {"1,2.5\n", "1,-1\n"}) {
    write_text(dir.file("bad.csv"), std::string("1,2\n") + bad);
    std::string message = "(no error)";
    try {
      data::read_csv_classification(dir.file("bad.csv"));
    } catch (const Error& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("bad.csv: row 2: the label"), std::string::npos) << message;
  }
  write_text(dir.file("one.csv"), "1\n2\n");
  EXPECT_THROW(data::read_csv_classification(dir.file("one.csv")), Error);
}

}  // namespace
}  // namespace cumulus::testing
