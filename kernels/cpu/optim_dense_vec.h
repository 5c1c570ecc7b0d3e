// The f32 updates (SGD, AdamW) over whole vectors of Ops::kLanes floats: included only by
// optim_8bit_avx2.cpp and optim_8bit_avx512.cpp, compiled for their instruction sets without
// contraction. kernels/optim_rules.h's rules instantiated on the lane type F do each lane's
// operations in the scalar rule's order, and IEEE division and square root round as the scalar
// ones do, so every element gets the scalar loop's bits (and the CUDA kernel's: Note [CUDA bit
// parity]). The caller runs the tail of fewer than kLanes elements through the scalar loop.
#pragma once

#include <cstdint>

#include "kernels/cpu/lane_access.h"
#include "kernels/cpu/optim_8bit_blocks.h"
#include "kernels/optim_rules.h"

namespace cumulus::kernels {
namespace {

template <typename Ops>
struct DenseVectors {
  using F = typename Ops::F;
  static constexpr int64_t kLanes = Ops::kLanes;

  static F load(const float* p) { return load_lanes<F>(p); }
  static void store(float* p, F v) { store_lanes(p, v); }

  // Elements [0, n rounded down to kLanes) updated; returns how many.
  static int64_t adamw(float* w, const float* grad, float* m, float* v, int64_t n, const AdamWBlockArgs& a) {
    const int64_t whole = n / kLanes * kLanes;
    for (int64_t i = 0; i < whole; i += kLanes) {
      F wi = load(w + i), mi = load(m + i), vi = load(v + i);
      rules::adamw(wi, load(grad + i), mi, vi, a.grad_scale, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay,
                   a.step_size, a.bc2_sqrt);
      store(w + i, wi);
      store(m + i, mi);
      store(v + i, vi);
    }
    return whole;
  }

  // The same for SGD; `buf` null without momentum.
  static int64_t sgd(float* w, const float* grad, float* buf, int64_t n, const SgdBlockArgs& a) {
    const int64_t whole = n / kLanes * kLanes;
    for (int64_t i = 0; i < whole; i += kLanes) {
      F wi = load(w + i), bi = buf != nullptr ? load(buf + i) : F{};
      rules::sgd(wi, load(grad + i), buf != nullptr ? &bi : nullptr, a.grad_scale, a.lr, a.momentum, a.dampening,
                 a.nesterov, a.weight_decay, a.first);
      store(w + i, wi);
      if (buf != nullptr) store(buf + i, bi);
    }
    return whole;
  }
};

}  // namespace
}  // namespace cumulus::kernels
