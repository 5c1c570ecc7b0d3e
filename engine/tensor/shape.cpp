#include "cumulus/tensor/shape.h"

#include "cumulus/core/error.h"
#include "cumulus/tensor/dtype.h"

namespace cumulus {

Shape::Shape(std::initializer_list<int64_t> dims) {
  for (int64_t d : dims) push_back(d);
}

void Shape::push_back(int64_t d) {
  CUMULUS_CHECK(ndim_ < kMaxDims, ShapeError, "shapes have at most ", kMaxDims, " dimensions");
  CUMULUS_CHECK(d >= 0, ShapeError, "negative dimension ", d);
  dims_[static_cast<std::size_t>(ndim_++)] = d;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i)
    CUMULUS_CHECK(!__builtin_mul_overflow(n, dims_[static_cast<std::size_t>(i)], &n), ShapeError, "shape ", str(),
                  " has more elements than fit in 64 bits");
  return n;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < ndim_; ++i) s += (i ? ", " : "") + std::to_string(dims_[static_cast<std::size_t>(i)]);
  return s + "]";
}

bool Shape::operator==(const Shape& o) const {
  if (ndim_ != o.ndim_) return false;
  for (int i = 0; i < ndim_; ++i)
    if (dims_[static_cast<std::size_t>(i)] != o.dims_[static_cast<std::size_t>(i)]) return false;
  return true;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::i32: return "i32";
    case DType::u8: return "u8";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i64: return "i64";
    case DType::boolean: return "bool";
  }
  return "unknown";
}

}  // namespace cumulus
