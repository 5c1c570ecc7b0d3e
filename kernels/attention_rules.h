// The geometry of fused attention (engine/ops/attention.cpp, Note [Fused attention] there), shared
// by the CPU and CUDA launchers: q [batch, heads, tq, d], k and v [batch, heads, tk, d], each read
// at its own element strides (the last dimension's is 1), so the heads of a qkv projection are read
// where they lie, with no copy. The output is written at its own strides too (the op lays a 4-D
// output out as [batch, tq, heads, d], PyTorch's layout, so that merging the heads back is a view);
// the log-sum-exp, the upstream gradient and the three gradients are dense, row-major over
// [batch * heads, t, d] (the LSE over [batch * heads, tq]).
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace cumulus::kernels {

struct AttentionGeometry {
  int64_t batch = 1, heads = 1;  // the leading dimensions, merged into (at most) two
  int64_t tq = 0, tk = 0, d = 0;
  // Element strides of the batch, head and time dimensions (q_stride[0] for batch, ...).
  int64_t q_stride[3] = {}, k_stride[3] = {}, v_stride[3] = {}, o_stride[3] = {};
  float scale = 1.0f;
  bool causal = false;  // query i sees keys j <= i (tq == tk)

  CUMULUS_HOST_DEVICE int64_t bh() const { return batch * heads; }
  // The element offset of row t of head bh (bh = b * heads + h) in q, k or v.
  CUMULUS_HOST_DEVICE int64_t q_row(int64_t bh, int64_t t) const {
    return (bh / heads) * q_stride[0] + (bh % heads) * q_stride[1] + t * q_stride[2];
  }
  CUMULUS_HOST_DEVICE int64_t k_row(int64_t bh, int64_t t) const {
    return (bh / heads) * k_stride[0] + (bh % heads) * k_stride[1] + t * k_stride[2];
  }
  CUMULUS_HOST_DEVICE int64_t v_row(int64_t bh, int64_t t) const {
    return (bh / heads) * v_stride[0] + (bh % heads) * v_stride[1] + t * v_stride[2];
  }
  CUMULUS_HOST_DEVICE int64_t o_row(int64_t bh, int64_t t) const {
    return (bh / heads) * o_stride[0] + (bh % heads) * o_stride[1] + t * o_stride[2];
  }
  // The keys query row i sees: [0, key_end(i)).
  CUMULUS_HOST_DEVICE int64_t key_end(int64_t i) const { return causal ? (i + 1 < tk ? i + 1 : tk) : tk; }
};

}  // namespace cumulus::kernels
