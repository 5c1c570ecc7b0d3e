// What engine/ops/compare.cpp lends the other ops: the conversions to and from bool that ops::cast
// (engine/ops/shape.cpp) delegates.
#pragma once

#include "cumulus/tensor/tensor.h"

namespace cumulus::ops::detail {

// x converted to `dtype` where one of the two is bool: to bool, nonzero (NaN included) is true; from
// bool, true is 1 and false 0 in any dtype. Not recorded (a bool tensor carries no gradient).
Tensor cast_bool(const Tensor& x, DType dtype);

}  // namespace cumulus::ops::detail
