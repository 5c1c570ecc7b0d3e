// CPU launcher of the strided copy (kernels/strided_layout.h): contiguous() and the backward of the
// views. T: float, BFloat16, Half (dst = src + beta * dst, f32 arithmetic, one rounding), or the
// integer types int32_t, int64_t, uint8_t (beta must be 0: a copy).
#pragma once

#include "kernels/float16.h"
#include "kernels/strided_layout.h"

namespace cumulus::kernels {

template <typename T>
void strided_copy_cpu(const T* src, T* dst, const StridedLayout& layout, float beta);

}  // namespace cumulus::kernels
