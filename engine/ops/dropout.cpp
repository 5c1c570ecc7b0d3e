// dropout with a counter-based mask (Note [Dropout mask] in kernels/pointwise_rules.h).
//
// Note [Dropout recomputes its mask]
// The backward recomputes the mask from (seed, offset, element index) instead of saving it: the
// node holds the offset (one 8-byte value on the device) and a probability, no mask, so a dropout
// costs no activation memory beyond its output and that value (a saved mask would be one byte, or
// a T, per element until the backward). The recomputation is a hash per element inside a kernel
// that streams dy anyway, so it costs no extra memory traffic. The same rule gives the same bits on
// the CPU and CUDA.
//
// Note [Dropout offsets on the device]
// A CUDA graph replays its kernels with the arguments of its capture and runs no host code, so an
// offset passed by value would give every replayed micro-batch the capture's mask. The offset is
// therefore read by the kernels from device memory: nn::Dropout keeps a counter there, and each
// training call takes the counter's value into a one-element tensor of its own and advances the
// counter in one launch (take_dropout_offset), at every replay too. The forward and the backward
// read that call's value, so a module called twice before its backward keeps both masks apart.
// The by-value form copies its offset to the device and is refused while a graph is captured.
#include <cmath>

#include "cumulus/autograd/node.h"
#include "cumulus/ops/pointwise.h"
#include "engine/ops/pointwise_internal.h"

namespace cumulus::ops {

namespace {

class DropoutBackward final : public Node {
 public:
  DropoutBackward(Shape shape, uint64_t seed, Tensor offset, float p, float scale)
      : Node("dropout"), shape_(shape), seed_(seed), offset_(std::move(offset)), p_(p), scale_(scale) {}

  void backward(const Tensor& dy, std::vector<GradSink>& grads) override {
    if (!grads[0].needed()) return;
    GradSink::Target dx = grads[0].begin(shape_, dy.device(), dy.dtype());
    const int64_t* offset = offset_.data<int64_t>();
    CUMULUS_DISPATCH_FLOAT(dy.dtype(), T,
                           CUMULUS_DISPATCH_POINTWISE(dy.device(), dropout_backward, seed_, offset, p_, scale_,
                                                      dy.data<T>(), dx.beta(), dx.tensor.data<T>(), shape_.numel()));
  }

 private:
  Shape shape_;
  uint64_t seed_;
  Tensor offset_;
  float p_, scale_;
};

void check_offset(const Tensor& offset, const Tensor& x) {
  CUMULUS_CHECK(offset.defined() && offset.dtype() == DType::i64 && offset.numel() == 1, InvalidArgument,
                "dropout: the offset must be a one-element i64 tensor, got ",
                offset.defined() ? offset.str() : std::string("an undefined tensor"));
  CUMULUS_CHECK(offset.device() == x.device(), DeviceError, "dropout: the offset is on ", offset.device().str(),
                ", the input on ", x.device().str());
}

}  // namespace

bool dropout_keeps(uint64_t seed, uint64_t offset, int64_t index, float p) {
  return kernels::dropout_keep(kernels::dropout_key(seed, offset), index, p);
}

Tensor dropout(const Tensor& x_in, float p, bool training, uint64_t seed, const Tensor& offset) {
  OpScope op_scope("dropout");
  const Tensor x = detail::contiguous(x_in);
  detail::check_floating("dropout", "input", x);
  CUMULUS_CHECK(p >= 0.0f && p <= 1.0f, InvalidArgument, "dropout: p must be in [0, 1], got ", p);
  if (!training || p == 0.0f) return x;
  check_offset(offset, x);
  const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;  // p = 1 keeps nothing: the scale is never applied
  Tensor y = detail::new_output(x.shape(), x.dtype(), x.device());
  const int64_t* at = offset.data<int64_t>();
  CUMULUS_DISPATCH_FLOAT(
      x.dtype(), T,
      CUMULUS_DISPATCH_POINTWISE(x.device(), dropout_forward, seed, at, p, scale, x.data<T>(), y.data<T>(), x.numel()));
  if (should_record({&x})) attach_node(y, std::make_shared<DropoutBackward>(x.shape(), seed, offset, p, scale), {&x});
  return y;
}

Tensor dropout(const Tensor& x, float p, bool training, uint64_t seed, uint64_t offset) {
  if (!training || p == 0.0f) return dropout(x, p, training, seed, Tensor());
  OpScope op_scope("dropout");  // the offset's copy is the op's
  CUMULUS_CHECK(!detail::graph_capturing(x.device()), InvalidArgument,
                "dropout: an offset given by value would repeat its mask in every replay of the CUDA graph being "
                "captured; give the offset as a device tensor (take_dropout_offset), as nn::Dropout does");
  return dropout(x, p, true, seed,
                 Tensor::from_vector(std::vector<int64_t>{static_cast<int64_t>(offset)}, Shape{1}, x.device()));
}

Tensor take_dropout_offset(const Tensor& counter) {
  CUMULUS_CHECK(counter.defined() && counter.dtype() == DType::i64 && counter.numel() == 1, InvalidArgument,
                "take_dropout_offset: the counter must be a one-element i64 tensor, got ",
                counter.defined() ? counter.str() : std::string("an undefined tensor"));
  Tensor taken = Tensor::empty(Shape{1}, DType::i64, counter.device());
  CUMULUS_DISPATCH_POINTWISE(counter.device(), dropout_take_offset, counter.data<int64_t>(), taken.data<int64_t>());
  return taken;
}

}  // namespace cumulus::ops
