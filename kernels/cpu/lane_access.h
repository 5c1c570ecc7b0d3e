// Unaligned loads and stores of a whole GCC vector of floats, of any width: one source for the
// vectorized kernels' structs (optim_dense_vec.h, optim_8bit_vec.h, rms_norm_vec.h). memcpy
// compiles to one unaligned move. In an anonymous namespace, as the structs are: each
// instruction-set file gets its own copy, so a linker can never hand the AVX2 file the AVX-512
// file's instructions.
#pragma once

namespace cumulus::kernels {
namespace {

template <typename F>
inline F load_lanes(const float* p) {
  F v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

template <typename F>
inline void store_lanes(float* p, F v) {
  __builtin_memcpy(p, &v, sizeof v);
}

}  // namespace
}  // namespace cumulus::kernels
