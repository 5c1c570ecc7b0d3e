// The geometry of fused attention (engine/ops/attention.cpp, Note [Fused attention] there), shared
// by the CPU and CUDA launchers: q [batch, heads, tq, d], k and v [batch, heads, tk, d], each read
// at its own element strides (the last dimension's is 1), so the heads of a qkv projection are read
// where they lie, with no copy. The output is written at its own strides too (the op lays a 4-D
// output out as [batch, tq, heads, d], PyTorch's layout, so that merging the heads back is a view);
// the upstream gradient is read and the three gradients written at their own strides as well (the
// op reads the upstream gradient where the output's consumer left it, and the packed-qkv op writes
// the gradients into one [batch, t, 3 * heads * d] gradient of the projection, at q's, k's and v's
// places). The log-sum-exp is dense, [batch * heads, tq] f32.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace cumulus::kernels {

struct AttentionGeometry {
  int64_t batch = 1, heads = 1;  // the leading dimensions, merged into (at most) two
  int64_t tq = 0, tk = 0, d = 0;
  // Element strides of the batch, head and time dimensions (q_stride[0] for batch, ...).
  int64_t q_stride[3] = {}, k_stride[3] = {}, v_stride[3] = {}, o_stride[3] = {};
  // The backward's: the upstream gradient dout (as the output, [.., tq, d]) and dq, dk, dv.
  int64_t do_stride[3] = {}, dq_stride[3] = {}, dk_stride[3] = {}, dv_stride[3] = {};
  float scale = 1.0f;
  bool causal = false;  // query i sees keys j <= i (tq == tk)

  CUMULUS_HOST_DEVICE int64_t bh() const { return batch * heads; }
  // The element offset of row t of head bh (bh = b * heads + h) in a tensor of strides s.
  CUMULUS_HOST_DEVICE int64_t row(const int64_t (&s)[3], int64_t bh, int64_t t) const {
    return (bh / heads) * s[0] + (bh % heads) * s[1] + t * s[2];
  }
  CUMULUS_HOST_DEVICE int64_t q_row(int64_t bh, int64_t t) const { return row(q_stride, bh, t); }
  CUMULUS_HOST_DEVICE int64_t k_row(int64_t bh, int64_t t) const { return row(k_stride, bh, t); }
  CUMULUS_HOST_DEVICE int64_t v_row(int64_t bh, int64_t t) const { return row(v_stride, bh, t); }
  CUMULUS_HOST_DEVICE int64_t o_row(int64_t bh, int64_t t) const { return row(o_stride, bh, t); }
  CUMULUS_HOST_DEVICE int64_t do_row(int64_t bh, int64_t t) const { return row(do_stride, bh, t); }
  CUMULUS_HOST_DEVICE int64_t dq_row(int64_t bh, int64_t t) const { return row(dq_stride, bh, t); }
  CUMULUS_HOST_DEVICE int64_t dk_row(int64_t bh, int64_t t) const { return row(dk_stride, bh, t); }
  CUMULUS_HOST_DEVICE int64_t dv_row(int64_t bh, int64_t t) const { return row(dv_stride, bh, t); }
  // Sets the backward's strides dense: dout and dq [batch * heads, tq, d], dk and dv over tk.
  CUMULUS_HOST_DEVICE void set_dense_gradients() {
    dense(do_stride, tq);
    dense(dq_stride, tq);
    dense(dk_stride, tk);
    dense(dv_stride, tk);
  }
  CUMULUS_HOST_DEVICE void dense(int64_t (&s)[3], int64_t t) const {
    s[2] = d;
    s[1] = t * d;
    s[0] = heads * t * d;
  }
  // The keys query row i sees: [0, key_end(i)).
  CUMULUS_HOST_DEVICE int64_t key_end(int64_t i) const { return causal ? (i + 1 < tk ? i + 1 : tk) : tk; }
};

}  // namespace cumulus::kernels
