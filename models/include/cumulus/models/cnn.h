// The convolutional model for Fashion-MNIST, as this PyTorch nn.Sequential (indices are the names):
//   0 Conv2d(1, 32, 3, padding=1)   1 BatchNorm2d(32)   2 ReLU   3 MaxPool2d(2)
//   4 Conv2d(32, 64, 3, padding=1)  5 BatchNorm2d(64)   6 ReLU   7 MaxPool2d(2)
//   8 Flatten   9 Linear(3136, 128)   10 ReLU   11 Linear(128, 10)
// state_dict() keys equal PyTorch's for that nn.Sequential: 0.weight, 0.bias, 1.weight, 1.bias,
// 1.running_mean, 1.running_var, 1.num_batches_tracked, 4.*, 5.*, 9.weight, 9.bias, 11.weight,
// 11.bias (num_batches_tracked: i32 here, int64 in PyTorch). Layers are created, and drawn from the
// generator, in that order.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "cumulus/nn/conv_layers.h"
#include "cumulus/nn/layers.h"
#include "cumulus/nn/model.h"

namespace cumulus::models {

class CNN : public nn::Model {
 public:
  static constexpr int64_t kSide = 28, kChannels1 = 32, kChannels2 = 64, kHidden = 128, kClasses = 10;
  static constexpr int64_t kFlat = kChannels2 * (kSide / 4) * (kSide / 4);  // 3136

  explicit CNN(Generator& gen, Device device = Device::cpu());
  // x: [B, 784], [B, 28, 28] or [B, 1, 28, 28] f32 -> logits [B, 10]
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "cnn"; }
  // Batch norm: in training, each micro-batch is normalized with its own statistics.
  bool uses_batch_statistics() const override { return true; }
  // The layers by index, as nn::Sequential gives them (the CNN runs one without being one).
  std::size_t size() const { return layers_.size(); }
  nn::Module& operator[](std::size_t i) const { return layers_[i]; }

  // Activation checkpointing (Note [Recompute] in engine/autograd/checkpoint.cpp), off by
  // default: on, the segments are recompute_segments_default(); set_recompute(segments) takes any
  // other choice (as nn::Sequential::set_recompute). Gradients and running statistics are
  // unchanged, bit for bit on the CPU.
  bool offers_recompute() const override { return true; }
  CNN& set_recompute(bool on) override;
  CNN& set_recompute(std::vector<nn::LayerRange> segments);
  bool recompute() const override { return !recompute_segments().empty(); }
  const std::vector<nn::LayerRange>& recompute_segments() const { return layers_.recompute_segments(); }
  // [conv, batch norm] of each block: the conv outputs (the batch norms' inputs, the largest
  // activations with the ReLU outputs) are not kept; see Note [CNN recompute segments] in
  // models/cnn.cpp for why these and not whole blocks.
  static const std::vector<nn::LayerRange>& recompute_segments_default();
  // Per segment of the default: "conv1+bn1" and "conv2+bn2"; mask bit i takes segment i.
  std::vector<std::string> recompute_segment_names() const override;
  CNN& set_recompute_segments(uint32_t mask) override;

 private:
  void add(std::shared_ptr<nn::Module> layer);
  // Runs the layers (Linear + ReLU fusion, recompute segments). The layers are registered on the
  // CNN itself, not through this Sequential, so the state dict's keys are those of PyTorch's
  // nn.Sequential ("0.weight"), not "layers.0.weight".
  nn::Sequential layers_;
};

}  // namespace cumulus::models
