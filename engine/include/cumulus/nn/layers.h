// The layers of the seed MLP.
#pragma once

#include <memory>
#include <vector>

#include "cumulus/nn/module.h"
#include "cumulus/ops/linear.h"

namespace cumulus::nn {

// y = x W^T + b, W: [out, in]. Initialized as PyTorch's nn.Linear: W and b uniform in
// +-1/sqrt(in_features) (kaiming_uniform with a = sqrt(5) reduces to that bound).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, Generator& gen, Device device = Device::cpu(),
         bool bias = true);
  Tensor forward(const Tensor& x) override;
  // activation(x W^T + b) as one fused op (ops::linear with an Activation): what Sequential runs
  // for a Linear followed by a ReLU.
  Tensor forward(const Tensor& x, ops::Activation activation);
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }

 private:
  int64_t in_features_, out_features_;
  Tensor weight_, bias_;
};

// Merges every dimension after the first: [B, 28, 28] -> [B, 784]. A view, no copy.
class Flatten : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

// A run of layers [begin, end) of a Sequential.
struct LayerRange {
  std::size_t begin = 0, end = 0;
  bool operator==(const LayerRange& o) const { return begin == o.begin && end == o.end; }
};

// Children named "0", "1", ... as torch.nn.Sequential names them. A Linear immediately followed
// by a ReLU runs as one fused op (ops::linear with Activation::relu: the same values, one node,
// fewer launches on CUDA) unless a recompute segment starts or ends between them; the modules,
// their names and the state dict are those of the two layers.
class Sequential : public Module {
 public:
  Sequential() = default;
  Sequential& add(std::shared_ptr<Module> module);
  Tensor forward(const Tensor& x) override;
  std::size_t size() const { return layers_.size(); }
  Module& operator[](std::size_t i) const { return *layers_.at(i); }

  // Activation checkpointing (Note [Recompute] in engine/autograd/checkpoint.cpp): in a forward
  // that records the graph, each segment keeps only its input for backward and runs again when
  // backward reaches it. Segments are non-empty ranges of layers; any two are disjoint or one
  // lies strictly inside the other (a nested segment recomputes again within its parent's
  // recomputation). An empty list (the default) stores every activation. Names, parameters and
  // state dicts do not change.
  Sequential& set_recompute(std::vector<LayerRange> segments);
  const std::vector<LayerRange>& recompute_segments() const { return segments_; }

 private:
  // Layers [begin, end); segments from index `first` on (sorted) may start checkpoints.
  Tensor run_layers(std::size_t begin, std::size_t end, const Tensor& x, std::size_t first);
  // Whether layers i and i + 1 (< end) are a Linear and a ReLU that run as one fused op.
  bool fuses_with_next(std::size_t i, std::size_t end) const;
  std::vector<std::shared_ptr<Module>> layers_;
  std::vector<LayerRange> segments_;  // sorted by begin, then by end descending (parents first)
};

}  // namespace cumulus::nn
