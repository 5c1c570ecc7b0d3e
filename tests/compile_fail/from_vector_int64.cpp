// Must not compile: Tensor::from_vector has no int64_t element type (before issue 28 this compiled
// and failed only at link time).
// expected error: Tensor::from_vector: the element type must be float \(f32\), int32_t \(i32\) or uint8_t \(u8\)
#include <cumulus/tensor/tensor.h>

cumulus::Tensor make() { return cumulus::Tensor::from_vector(std::vector<int64_t>{1, 2, 3}, cumulus::Shape{3}); }
