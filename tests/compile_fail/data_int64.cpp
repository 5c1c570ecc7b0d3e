// Must not compile: Tensor::data has no int64_t element type.
// expected error: Tensor::data: the element type must be float, int32_t, uint8_t, BFloat16 or Half
#include <cumulus/tensor/tensor.h>

int64_t* pointer(const cumulus::Tensor& t) { return t.data<int64_t>(); }
