// The seed model: PyTorch quickstart's NeuralNetwork for Fashion-MNIST.
//   flatten -> linear_relu_stack = Sequential(Linear(784, 512), ReLU, Linear(512, 512), ReLU,
//                                             Linear(512, 10))
// Parameter names equal PyTorch's state_dict keys: linear_relu_stack.{0,2,4}.{weight,bias}.
#pragma once

#include <memory>
#include <string>

#include "cumulus/nn/layers.h"
#include "cumulus/nn/model.h"

namespace cumulus::models {

// The kernel choice moved to the engine with nn::Model; these names stay for code written
// against them.
using nn::KernelChoice;
using nn::kernel_choice_name;
using nn::parse_kernel_choice;

class SeedMLP : public nn::Model {
 public:
  static constexpr int64_t kInputs = 28 * 28, kHidden = 512, kClasses = 10;

  explicit SeedMLP(Generator& gen, Device device = Device::cpu());
  // x: [B, 28, 28] or [B, 784] f32 -> logits [B, 10]
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "seed_mlp"; }
  nn::Sequential& stack() { return *linear_relu_stack_; }

  // Activation checkpointing (Note [Recompute] in engine/autograd/checkpoint.cpp), off by
  // default: on, linear_relu_stack's first two Linear + ReLU pairs are one segment, so the first
  // ReLU's output [B, 512] is recomputed instead of kept (the second's is the last Linear's input
  // and stays). Gradients are unchanged, bit for bit on the CPU.
  bool offers_recompute() const override { return true; }
  SeedMLP& set_recompute(bool on) override;
  bool recompute() const override { return !linear_relu_stack_->recompute_segments().empty(); }

  // The fused op's kernels have no tensor cores and sum each weight gradient over the rows in one
  // thread, so past small micro-batches cuBLASLt should win: the automatic choice takes them up to
  // this size, the two the fused path was built for (16, 64), as measured on a GPU
  // (ops::kFusedMlpMeasuredOnGpu; bench_step_vs_accumulate's *_fused families against the generic).
  static constexpr int64_t kFusedAutoMaxBatch = 64;
  SeedMLP& set_kernels(KernelChoice choice) override;
  KernelChoice kernels() const { return kernels_; }
  // cross_entropy(forward(x), labels, reduction), recorded for backward, through the fused op when
  // fuses(x) says so. The fused choice with recompute on, or with an input the fused op does not
  // take (ops::mlp_cross_entropy_unsupported_reason), is an InvalidArgument.
  Tensor loss(const Tensor& x, const Tensor& labels, ops::Reduction reduction) override;
  // Whether loss(x, ...) runs the fused op: always with KernelChoice::fused, never with generic;
  // automatic: on CUDA, f32, at most kFusedAutoMaxBatch samples, recompute off (while
  // ops::kFusedMlpMeasuredOnGpu holds).
  bool fuses(const Tensor& x) const { return fuses(x.device(), x.dtype(), x.ndim() > 0 ? x.size(0) : 0); }
  // The same for an input on `device` of `dtype` with `batch` samples.
  bool fuses(Device device, DType dtype, int64_t batch) const;
  KernelChoice kernels_for(Device device, DType dtype, int64_t batch) const override {
    return fuses(device, dtype, batch) ? KernelChoice::fused : KernelChoice::generic;
  }

 private:
  std::shared_ptr<nn::Flatten> flatten_;
  std::shared_ptr<nn::Sequential> linear_relu_stack_;
  KernelChoice kernels_ = KernelChoice::automatic;
};

}  // namespace cumulus::models
