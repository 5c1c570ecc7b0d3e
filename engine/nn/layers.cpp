#include "cumulus/nn/layers.h"

#include <algorithm>
#include <cmath>
#include <typeinfo>

#include "cumulus/autograd/checkpoint.h"
#include "cumulus/nn/activation_layers.h"
#include "cumulus/ops/linear.h"
#include "cumulus/ops/shape.h"

namespace cumulus::nn {

Linear::Linear(int64_t in_features, int64_t out_features, Generator& gen, Device device, bool bias)
    : in_features_(in_features), out_features_(out_features) {
  CUMULUS_CHECK(in_features > 0 && out_features > 0, InvalidArgument, "Linear(", in_features, ", ",
                out_features, "): feature counts must be positive");
  // PyTorch: kaiming_uniform_(W, a = sqrt(5)) has bound sqrt(6 / ((1 + a^2) fan_in)) = 1/sqrt(fan_in);
  // the bias is uniform in the same bound. Values are drawn on the host (see tensor/random.h).
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_features));
  register_parameter("weight", weight_, uniform(Shape{out_features, in_features}, -bound, bound, gen), device);
  if (bias) register_parameter("bias", bias_, uniform(Shape{out_features}, -bound, bound, gen), device);
}

Tensor Linear::forward(const Tensor& x) { return ops::linear(x, weight_, bias_); }

Tensor Linear::forward(const Tensor& x, ops::Activation activation) {
  return ops::linear(x, weight_, bias_, activation);
}

Tensor Flatten::forward(const Tensor& x) { return ops::flatten(x, 1); }

Sequential& Sequential::add(std::shared_ptr<Module> module) {
  register_module(std::to_string(layers_.size()), module);
  layers_.push_back(std::move(module));
  return *this;
}

Tensor Sequential::forward(const Tensor& x) { return run_layers(0, layers_.size(), x, 0); }

bool Sequential::fuses_with_next(std::size_t i, std::size_t end) const {
  if (i + 1 >= end) return false;
  // Exactly these classes: a subclass may change what forward does.
  const Module &first = *layers_[i], &second = *layers_[i + 1];
  if (typeid(first) != typeid(Linear) || typeid(second) != typeid(ReLU)) return false;
  // A segment boundary between the two would put the Linear and the ReLU in different
  // checkpoints (or one in none): never fuse across it.
  for (const LayerRange& r : segments_)
    if (r.begin == i + 1 || r.end == i + 1) return false;
  return true;
}

Sequential& Sequential::set_recompute(std::vector<LayerRange> segments) {
  for (const LayerRange& r : segments)
    CUMULUS_CHECK(r.begin < r.end && r.end <= layers_.size(), InvalidArgument, "Sequential::set_recompute: segment [",
                  r.begin, ", ", r.end, ") is not a non-empty range of the ", layers_.size(), " layers");
  std::sort(segments.begin(), segments.end(), [](const LayerRange& a, const LayerRange& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end > b.end;
  });
  for (std::size_t i = 0; i < segments.size(); ++i)
    for (std::size_t j = i + 1; j < segments.size(); ++j) {
      const LayerRange &a = segments[i], &b = segments[j];  // a.begin <= b.begin
      const bool disjoint = a.end <= b.begin, nested = b.end <= a.end;
      CUMULUS_CHECK(!(a == b), InvalidArgument, "Sequential::set_recompute: segment [", a.begin, ", ", a.end,
                    ") is given twice");
      CUMULUS_CHECK(disjoint || nested, InvalidArgument, "Sequential::set_recompute: segments [", a.begin, ", ", a.end,
                    ") and [", b.begin, ", ", b.end, ") overlap without one containing the other");
    }
  segments_ = std::move(segments);
  return *this;
}

Tensor Sequential::run_layers(std::size_t begin, std::size_t end, const Tensor& x, std::size_t first) {
  Tensor h = x;
  std::size_t i = begin;
  while (i < end) {
    // The outermost segment starting here that fits in [begin, end) and is not already running.
    std::size_t s = first;
    while (s < segments_.size() && !(segments_[s].begin == i && segments_[s].end <= end)) ++s;
    if (s == segments_.size()) {
      if (fuses_with_next(i, end)) {
        h = static_cast<Linear&>(*layers_[i]).forward(h, ops::Activation::relu);
        i += 2;
      } else {
        h = layers_[i]->forward(h);
        ++i;
      }
      continue;
    }
    const LayerRange r = segments_[s];
    std::vector<Tensor> parameters;
    for (std::size_t k = r.begin; k < r.end; ++k)
      for (const Tensor& p : layers_[k]->parameters()) parameters.push_back(p);
    h = checkpoint([this, r, s](const Tensor& in) { return run_layers(r.begin, r.end, in, s + 1); }, h, parameters);
    i = r.end;
  }
  return h;
}

}  // namespace cumulus::nn
