// The precision policy of a training run (Note [Mixed precision] in engine/ops/linear.cpp).
//   fp32: everything f32.
//   bf16, fp16: activations, their gradients and the GEMMs' weight copies in 16 bits; parameters
//     (the master weights), gradient buffers, optimizer state, losses, softmax and normalization
//     statistics in f32. Every op of the seed MLP and the CNN computes in bf16 and f16. A run opts in by making its
//     batches in compute_dtype() (DataLoader::set_dtype): ops compute in their input's type.
//   fp16 also needs dynamic loss scaling (AccumulationOptions::loss_scaling): its range ends at
//   65504 and small gradients underflow below 2^-24; bf16 has f32's range and needs none.
#pragma once

#include <string>

#include "cumulus/core/device.h"
#include "cumulus/tensor/dtype.h"

namespace cumulus {

enum class Precision : uint8_t { fp32, bf16, fp16 };

const char* precision_name(Precision p);                  // "fp32", "bf16", "fp16"
Precision parse_precision(const std::string& text);       // throws InvalidArgument naming the text
DType compute_dtype(Precision p);                         // f32, bf16, f16
inline bool needs_loss_scaling(Precision p) { return p == Precision::fp16; }

// Why `device` cannot train in `p`, or empty where it can. The CPU can in every precision (16-bit
// storage, f32 arithmetic); a CUDA device needs 16-bit tensor-core GEMMs: compute capability 8.0
// for bf16, 7.0 for fp16.
std::string precision_unsupported_reason(Precision p, const Device& device);

}  // namespace cumulus
