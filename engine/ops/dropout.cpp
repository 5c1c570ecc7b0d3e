// dropout with a counter-based mask (Note [Dropout mask] in kernels/pointwise_rules.h).
//
// Note [Dropout recomputes its mask]
// The backward recomputes the mask from (seed, offset, element index) instead of saving it: the
// node holds two integers and a probability, no tensor, so a dropout costs no activation memory
// beyond its output (a saved mask would be one byte, or a T, per element until the backward). The
// recomputation is a hash per element inside a kernel that streams dy anyway, so it costs no
// extra memory traffic. The same rule gives the same bits on the CPU and CUDA.
#include <cmath>

#include "cumulus/autograd/node.h"
#include "cumulus/ops/pointwise.h"
#include "engine/ops/pointwise_internal.h"

namespace cumulus::ops {

namespace {

class DropoutBackward final : public Node {
 public:
  DropoutBackward(Shape shape, uint64_t seed, uint64_t offset, float p, float scale)
      : Node("dropout"), shape_(shape), seed_(seed), offset_(offset), p_(p), scale_(scale) {}

  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    if (!grads[0].needed()) return;
    GradSink::Target dx = grads[0].begin(shape_, dy.device(), dy.dtype());
    CUMULUS_DISPATCH_FLOAT(dy.dtype(), T,
                           CUMULUS_DISPATCH_POINTWISE(dy.device(), dropout_backward, seed_, offset_, p_, scale_,
                                                      dy.data<T>(), dx.beta(), dx.tensor.data<T>(), shape_.numel()));
  }

 private:
  Shape shape_;
  uint64_t seed_, offset_;
  float p_, scale_;
};

}  // namespace

bool dropout_keeps(uint64_t seed, uint64_t offset, int64_t index, float p) {
  return kernels::dropout_keep(kernels::dropout_key(seed, offset), index, p);
}

Tensor dropout(const Tensor& x, float p, bool training, uint64_t seed, uint64_t offset) {
  OpScope op_scope("dropout");
  detail::check_floating("dropout", "input", x);
  CUMULUS_CHECK(p >= 0.0f && p < 1.0f, InvalidArgument, "dropout: p must be in [0, 1), got ", p);
  if (!training || p == 0.0f) return x;
  const float scale = 1.0f / (1.0f - p);
  Tensor y = detail::new_output(x.shape(), x.dtype(), x.device());
  CUMULUS_DISPATCH_FLOAT(x.dtype(), T,
                         CUMULUS_DISPATCH_POINTWISE(x.device(), dropout_forward, seed, offset, p, scale, x.data<T>(),
                                                    y.data<T>(), x.numel()));
  if (should_record({&x})) attach_node(y, std::make_shared<DropoutBackward>(x.shape(), seed, offset, p, scale), {&x});
  return y;
}

}  // namespace cumulus::ops
