// CPU launchers of the pointwise ops (kernels/cpu/pointwise.cpp): broadcast arithmetic, scalar
// arithmetic, tanh / sigmoid / gelu, softmax and log_softmax over rows, dropout. Templated over the
// storage type T (float, BFloat16, Half), computing in f32. Every launcher that writes a gradient
// takes a beta: 0 overwrites without reading the destination, 1 adds to it (Note [Gradient sinks]).
// The element rules are kernels/pointwise_rules.h, shared with the CUDA kernels.
#pragma once

#include <cstdint>

#include "kernels/pointwise_rules.h"

namespace cumulus::kernels {

// y[i] = a[ia] op b[ib] over the output of `g` (Note [Broadcast geometry]).
template <typename T>
void binary_forward_cpu(const BroadcastGeometry& g, BinaryOp op, const T* a, const T* b, T* y);
// d(operand) = sum over its broadcast of binary_grad(...) + beta * d(operand); operand 0 is a, 1 is b.
// a or b may be null where the op's gradient does not read it (add, sub; mul reads the other one).
template <typename T>
void binary_backward_cpu(const BroadcastGeometry& g, BinaryOp op, int operand, const T* a, const T* b, const T* dy,
                         float beta, T* dx);

// y = x op s (s op x when reversed), n elements.
template <typename T>
void scalar_forward_cpu(BinaryOp op, bool reversed, float s, const T* x, T* y, int64_t n);
// dx = scalar_grad(dy, x) + beta * dx; x may be null unless the op is a reversed div.
template <typename T>
void scalar_backward_cpu(BinaryOp op, bool reversed, float s, const T* x, const T* dy, float beta, T* dx, int64_t n);

template <typename T>
void unary_forward_cpu(UnaryOp op, const T* x, T* y, int64_t n);
// dx = unary_grad(dy, saved) + beta * dx (saved: y for tanh and sigmoid, x for the gelus).
template <typename T>
void unary_backward_cpu(UnaryOp op, const T* saved, const T* dy, float beta, T* dx, int64_t n);

// Each row of x [rows, cols]: y = softmax(row), or log_softmax(row) when `log`, around the row
// maximum.
template <typename T>
void softmax_forward_cpu(bool log, const T* x, T* y, int64_t rows, int64_t cols);
// From the saved output y: softmax dx = y (dy - sum(dy y)); log_softmax dx = dy - exp(y) sum(dy).
template <typename T>
void softmax_backward_cpu(bool log, const T* y, const T* dy, float beta, T* dx, int64_t rows, int64_t cols);

// y = x * keep * scale with keep = dropout_keep(dropout_key(seed, *offset), i, p) (Note [Dropout
// mask]); the backward is the same with dy for x and a beta. The offset is read from memory when
// the kernel runs (Note [Dropout offsets on the device] in engine/ops/dropout.cpp).
template <typename T>
void dropout_forward_cpu(uint64_t seed, const int64_t* offset, float p, float scale, const T* x, T* y, int64_t n);
template <typename T>
void dropout_backward_cpu(uint64_t seed, const int64_t* offset, float p, float scale, const T* dy, float beta, T* dx,
                          int64_t n);
// *taken = *counter, then *counter += 1.
void dropout_take_offset_cpu(int64_t* counter, int64_t* taken);

}  // namespace cumulus::kernels
