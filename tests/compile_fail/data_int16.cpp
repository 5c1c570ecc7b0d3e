// Must not compile: Tensor::data has no int16_t element type.
// expected error: Tensor::data: the element type must be float, int32_t, int64_t, uint8_t, BFloat16 or Half
#include <cumulus/tensor/tensor.h>

int16_t* pointer(const cumulus::Tensor& t) { return t.data<int16_t>(); }
