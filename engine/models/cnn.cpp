#include "cumulus/models/cnn.h"

#include "cumulus/ops/ops.h"

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

Tensor CNN::forward(const Tensor& x) {
  CUMULUS_CHECK(x.defined(), InvalidArgument, "CNN: input is undefined");
  const bool ok = (x.ndim() == 2 && x.size(1) == kSide * kSide) ||
                  (x.ndim() == 3 && x.size(1) == kSide && x.size(2) == kSide) ||
                  (x.ndim() == 4 && x.size(1) == 1 && x.size(2) == kSide && x.size(3) == kSide);
  CUMULUS_CHECK(ok, ShapeError,
                "CNN: input must be [B, 784], [B, 28, 28] or [B, 1, 28, 28], got ", x.shape().str());
  // A view (no copy): the loader's [B, 784] rows are already NCHW with one channel.
  const Tensor images = x.ndim() == 4 ? x : ops::reshape(x, Shape{x.size(0), 1, kSide, kSide});
  return Sequential::forward(images);
}

const std::vector<nn::LayerRange>& CNN::recompute_segments_default() {
  static const std::vector<nn::LayerRange> segments{{0, 4}, {0, 2}, {4, 8}, {4, 6}};
  return segments;
}

CNN& CNN::set_recompute(bool on) {
  Sequential::set_recompute(on ? recompute_segments_default() : std::vector<nn::LayerRange>{});
  return *this;
}

}  // namespace cumulus::models
