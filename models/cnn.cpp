#include "cumulus/models/cnn.h"

#include <utility>

#include "cumulus/nn/activation_layers.h"
#include "cumulus/nn/norm_layers.h"
#include "cumulus/ops/shape.h"

namespace cumulus::models {

CNN::CNN(Generator& gen, Device device) {
  add(std::make_shared<nn::Conv2d>(1, kChannels1, 3, gen, device, /*stride=*/1, /*padding=*/1));
  add(std::make_shared<nn::BatchNorm2d>(kChannels1, device));
  add(std::make_shared<nn::ReLU>());
  add(std::make_shared<nn::MaxPool2d>(2));
  add(std::make_shared<nn::Conv2d>(kChannels1, kChannels2, 3, gen, device, /*stride=*/1, /*padding=*/1));
  add(std::make_shared<nn::BatchNorm2d>(kChannels2, device));
  add(std::make_shared<nn::ReLU>());
  add(std::make_shared<nn::MaxPool2d>(2));
  add(std::make_shared<nn::Flatten>());
  add(std::make_shared<nn::Linear>(kFlat, kHidden, gen, device));
  add(std::make_shared<nn::ReLU>());
  add(std::make_shared<nn::Linear>(kHidden, kClasses, gen, device));
}

void CNN::add(std::shared_ptr<nn::Module> layer) {
  register_module(std::to_string(layers_.size()), layer);
  layers_.add(std::move(layer));
}

Tensor CNN::forward(const Tensor& x) {
  CUMULUS_CHECK(x.defined(), InvalidArgument, "CNN: input is undefined");
  const bool ok = (x.ndim() == 2 && x.size(1) == kSide * kSide) ||
                  (x.ndim() == 3 && x.size(1) == kSide && x.size(2) == kSide) ||
                  (x.ndim() == 4 && x.size(1) == 1 && x.size(2) == kSide && x.size(3) == kSide);
  CUMULUS_CHECK(ok, ShapeError,
                "CNN: input must be [B, 784], [B, 28, 28] or [B, 1, 28, 28], got ", x.shape().str());
  // A view (no copy): the loader's [B, 784] rows are already NCHW with one channel.
  const Tensor images = x.ndim() == 4 ? x : ops::reshape(x, Shape{x.size(0), 1, kSide, kSide});
  return layers_.forward(images);
}

// Note [CNN recompute segments]
// What bounds the peak is not the forward's footprint but the working set of one op's backward:
// the op's saved tensors, its output gradient and its input gradient are alive together. Write
// c1 for one [B, 32, 28, 28] tensor (the first block's conv, batch-norm and ReLU outputs all have
// that size; 24.5 MiB at B = 256). Stored, the peak is reached in relu1's backward: c1 (saved by
// bn1) + r1 (saved by relu1) + its output gradient + its input gradient = 4 c1 above the fixed
// costs (4.25 c1 measured: a pool-output-sized tensor besides). Checkpointing [conv, batch norm] drops bn1's saved c1 from the forward, so relu1's
// backward holds 3 c1, and the recomputation then holds c1 + its output + the incoming gradient,
// bn1's backward c1 + dy + dx: 3 c1 again, the floor for out-of-place backward kernels.
// Checkpointing whole blocks [conv, BN, ReLU, pool] keeps less after forward (only the pool
// outputs) but recomputes relu1's output too, so relu1's backward holds 4 c1 as before: the peak
// does not move. Nesting [conv, BN] inside the blocks gets 3 c1 too, plus the block's incoming
// gradient (alive while the whole block recomputes and back-propagates), and runs conv1 and bn1
// three times. Measured by bench/bench_recompute.cpp (CPU, B = 256; peak without the dataset):
// stored 107.4 MiB, blocks 107.4 MiB, blocks with [conv, BN] nested 82.9 MiB, [conv, BN] 76.7 MiB,
// and [conv, BN] the cheapest of the recomputing choices in time. Below 3 c1 would need backward
// kernels that write the input gradient over their output gradient (in place).
const std::vector<nn::LayerRange>& CNN::recompute_segments_default() {
  static const std::vector<nn::LayerRange> segments{{0, 2}, {4, 6}};
  return segments;
}

CNN& CNN::set_recompute(bool on) {
  return set_recompute(on ? recompute_segments_default() : std::vector<nn::LayerRange>{});
}

std::vector<std::string> CNN::recompute_segment_names() const { return {"conv1+bn1", "conv2+bn2"}; }

CNN& CNN::set_recompute_segments(uint32_t mask) {
  const std::vector<nn::LayerRange>& all = recompute_segments_default();
  CUMULUS_CHECK(mask >> all.size() == 0, InvalidArgument, "CNN: recompute segment mask ", mask,
                " names segments past its ", all.size());
  std::vector<nn::LayerRange> chosen;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (mask & (uint32_t{1} << i)) chosen.push_back(all[i]);
  return set_recompute(std::move(chosen));
}

CNN& CNN::set_recompute(std::vector<nn::LayerRange> segments) {
  layers_.set_recompute(std::move(segments));
  return *this;
}

}  // namespace cumulus::models
