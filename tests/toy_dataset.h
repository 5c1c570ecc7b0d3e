// A learnable toy in the Fashion-MNIST format, for the tests that run the app: class c lights up
// row band c of the image. Written as gzip IDX files, as the real dataset is shipped.
#pragma once

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <string>

namespace cumulus::testing {

inline void put_be32(std::string& s, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) s.push_back(static_cast<char>((v >> shift) & 0xff));
}

inline void write_gz(const std::filesystem::path& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  gzclose(f);
}

// `prefix` is "train" or "t10k"; n samples drawn from `seed`.
inline void write_toy_split(const std::filesystem::path& dir, const std::string& prefix, int n, uint32_t seed) {
  std::string images, labels;
  put_be32(images, 0x803);
  put_be32(images, static_cast<uint32_t>(n));
  put_be32(images, 28);
  put_be32(images, 28);
  put_be32(labels, 0x801);
  put_be32(labels, static_cast<uint32_t>(n));
  uint32_t state = seed;
  auto rnd = [&] { return (state = state * 1664525u + 1013904223u) >> 24; };
  for (int i = 0; i < n; ++i) {
    const int c = static_cast<int>(rnd() % 10);
    labels.push_back(static_cast<char>(c));
    for (int r = 0; r < 28; ++r)
      for (int col = 0; col < 28; ++col) images.push_back(static_cast<char>(r / 3 == c ? 150 + rnd() % 100 : rnd() % 60));
  }
  write_gz(dir / (prefix + "-images-idx3-ubyte.gz"), images);
  write_gz(dir / (prefix + "-labels-idx1-ubyte.gz"), labels);
}

}  // namespace cumulus::testing
