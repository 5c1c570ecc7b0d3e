// Must not compile: Tensor::to_vector has no double element type.
// expected error: Tensor::to_vector: the element type must be float \(f32\), int32_t \(i32\), int64_t
#include <cumulus/tensor/tensor.h>

std::vector<double> read(const cumulus::Tensor& t) { return t.to_vector<double>(); }
