// CPU launchers of the comparison and mask ops (kernels/cpu/compare.cpp), by the rules of
// kernels/compare_rules.h (shared with the CUDA kernels). Bool outputs and conditions are bytes, 0 or
// 1. T is a storage type (float, BFloat16, Half, int32_t, int64_t, uint8_t for u8 and bool); E an
// element's bits (uint8_t to uint64_t), for the ops that only select or copy elements. Every
// launcher that writes a gradient takes a beta: 0 overwrites without reading the destination, 1 adds.
#pragma once

#include <cstdint>

#include "kernels/compare_rules.h"

namespace cumulus::kernels {

// y[i] = a[ia] op b[ib] over the output of g (two operands, Note [Nary geometry]).
template <typename T>
void compare_forward_cpu(const NaryGeometry& g, CompareOp op, const T* a, const T* b, uint8_t* y);
// y[i] = x[i] op s, n elements.
template <typename T>
void compare_scalar_cpu(CompareOp op, const T* x, CompareScalar s, uint8_t* y, int64_t n);

// y[i] = cond ? a : b over the output of g (three operands: cond, a, b); a null a or b reads `fill`.
template <typename E>
void where_forward_cpu(const NaryGeometry& g, const uint8_t* cond, const E* a, const E* b, E fill, E* y);
// dx = the gradient of where's a (operand 1) or b (operand 2) + beta * dx; dy has g's output shape.
template <typename T>
void where_backward_cpu(const NaryGeometry& g, int operand, const uint8_t* cond, const T* dy, float beta, T* dx);

// y = x where triangle_keeps, else 0 (every dtype's zero is all-zero bits).
template <typename E>
void triangle_forward_cpu(const Triangle& t, const E* x, E* y);
// dx = (dy where triangle_keeps, else 0) + beta * dx.
template <typename T>
void triangle_backward_cpu(const Triangle& t, const T* dy, float beta, T* dx);

// y[i] = arange_value(a, i), n elements.
template <typename T>
void arange_cpu(const Arange& a, T* y, int64_t n);
// y[i] = bool_value(x[i]): a bool tensor as 0 and 1 of T.
template <typename T>
void bool_to_cpu(const uint8_t* x, T* y, int64_t n);

}  // namespace cumulus::kernels
