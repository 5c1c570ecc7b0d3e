// Must not compile: Tensor::from_vector has no int16_t element type (before issue 28 an unsupported
// type compiled and failed only at link time; int64_t has been one since issue 29).
// expected error: Tensor::from_vector: the element type must be float \(f32\), int32_t \(i32\), int64_t
#include <cumulus/tensor/tensor.h>

cumulus::Tensor make() { return cumulus::Tensor::from_vector(std::vector<int16_t>{1, 2, 3}, cumulus::Shape{3}); }
