// Shape: the sizes of up to 8 dimensions. A 0-d shape is a scalar (numel 1).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace cumulus {

class Shape {
 public:
  static constexpr int kMaxDims = 8;

  Shape() = default;  // scalar
  Shape(std::initializer_list<int64_t> dims);
  template <typename It>
  Shape(It begin, It end) {
    for (auto it = begin; it != end; ++it) push_back(*it);
  }

  int ndim() const { return ndim_; }
  int64_t operator[](int i) const { return dims_[static_cast<std::size_t>(i)]; }
  int64_t numel() const;
  void push_back(int64_t d);
  std::string str() const;  // "[64, 784]"

  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

}  // namespace cumulus
