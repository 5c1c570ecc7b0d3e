// The seed model: PyTorch quickstart's NeuralNetwork for Fashion-MNIST.
//   flatten -> linear_relu_stack = Sequential(Linear(784, 512), ReLU, Linear(512, 512), ReLU,
//                                             Linear(512, 10))
// Parameter names equal PyTorch's state_dict keys: linear_relu_stack.{0,2,4}.{weight,bias}.
#pragma once

#include <memory>

#include "cumulus/nn/layers.h"

namespace cumulus::models {

class SeedMLP : public nn::Module {
 public:
  static constexpr int64_t kInputs = 28 * 28, kHidden = 512, kClasses = 10;

  explicit SeedMLP(Generator& gen, Device device = Device::cpu());
  // x: [B, 28, 28] or [B, 784] f32 -> logits [B, 10]
  Tensor forward(const Tensor& x) override;
  nn::Sequential& stack() { return *linear_relu_stack_; }

  // Activation checkpointing (Note [Recompute] in engine/autograd/checkpoint.cpp), off by
  // default: on, linear_relu_stack's first two Linear + ReLU pairs are one segment, so the first
  // ReLU's output [B, 512] is recomputed instead of kept (the second's is the last Linear's input
  // and stays). Gradients are unchanged, bit for bit on the CPU.
  SeedMLP& set_recompute(bool on);
  bool recompute() const { return !linear_relu_stack_->recompute_segments().empty(); }

 private:
  std::shared_ptr<nn::Flatten> flatten_;
  std::shared_ptr<nn::Sequential> linear_relu_stack_;
};

}  // namespace cumulus::models
