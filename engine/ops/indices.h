// Integer index and label tensors as the kernels read them: i32. Ops taking indices or labels accept
// i32 and i64 (PyTorch's index type) and pass them through as_i32_indices.
#pragma once

#include "cumulus/tensor/tensor.h"

namespace cumulus::ops::detail {

// `indices` itself when it is i32; an i64 tensor converted to i32 (on its device, in the op's
// output category: ops save it for their backward), a value outside i32's range becoming
// INT32_MIN: out of every dimension's range, so the op rejects it (CPU) or gives its documented NaN
// (CUDA) as for any other bad index. Any other dtype is an InvalidArgument naming `op` and `what`.
Tensor as_i32_indices(const char* op, const char* what, const Tensor& indices);

}  // namespace cumulus::ops::detail
