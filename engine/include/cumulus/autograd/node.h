// Node: one recorded op in the define-by-run graph. It holds what its backward needs (saved
// tensors, released as soon as it has run) and one Edge per input: to the Node that made the
// input, to a leaf that wants a gradient, or to nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cumulus/tensor/tensor.h"

namespace cumulus {

class Node;
namespace detail {
struct DeferredGradientAdds;  // engine/autograd/walk.h
}

struct Edge {
  std::shared_ptr<Node> node;        // the input was made by this op
  std::shared_ptr<TensorImpl> leaf;  // or: the input is a leaf that requires grad
  bool needs_grad() const { return node != nullptr || leaf != nullptr; }
};

// How an op writes a gradient into its target (tiny-cuda-nn's GradientMode; an input that needs no
// gradient gets no target at all). Kernels take it as the GEMM-style beta: 0 overwrites without
// reading the destination, 1 adds to it.
enum class GradientMode : uint8_t { overwrite, accumulate };

// Note [Gradient sinks]
// The backward engine hands each op one GradSink per input, saying where that input's gradient
// goes. For a leaf it is the leaf's persistent buffer: the op overwrites it if the buffer is stale
// (first backward after a step) and accumulates into it otherwise, so a Linear's weight
// gradient is accumulated inside its GEMM and zeroing costs nothing. For an inner node it is the
// engine's pending gradient: the first contribution allocates it (or hands over a tensor, no
// copy), later ones (an input used twice) add into it. A tensor handed over may be shared (add
// gives its dy to both operands as is): the first add into a shared one copies it. Ops never
// allocate parameter-sized temporaries for gradients.
class GradSink {
 public:
  struct Target {
    Tensor tensor;      // write the gradient here
    GradientMode mode;  // overwrite, or add to what is there
    float beta() const { return mode == GradientMode::accumulate ? 1.0f : 0.0f; }
  };

  static GradSink none() { return GradSink(); }
  // A leaf's persistent buffer; `deferred`: the backward's list of pending adds, where it allows
  // them (Note [Deferred gradient adds] in engine/autograd/engine.cpp).
  static GradSink leaf(TensorImpl* leaf, detail::DeferredGradientAdds* deferred = nullptr) {
    GradSink s(leaf, nullptr);
    s.deferred_ = deferred;
    return s;
  }
  // An inner node's pending gradient.
  static GradSink pending(Tensor* slot) { return GradSink(nullptr, slot); }

  bool needed() const { return leaf_ != nullptr || slot_ != nullptr; }
  // The buffer to write into and how. The buffer must be written (in stream order) before the
  // next call on a sink of the same target, which then gets GradientMode::accumulate. `dtype` is
  // the input's: a gradient is stored in its tensor's type (a leaf's buffer is f32, as the leaf).
  Target begin(const Shape& shape, const Device& device, DType dtype = DType::f32);
  // Delivers a finished gradient tensor: taken as is when nothing is there yet for an inner node,
  // otherwise copied or added into the target.
  void give(const Tensor& grad);
  // Whether, after begin() gave GradientMode::accumulate, the op may hand its finished contribution
  // to defer_add() instead of adding it itself: the engine then adds it at the end of the backward,
  // with the others in one launch (Note [Deferred gradient adds]). Only some leaf sinks can.
  bool can_defer_add() const { return deferred_ != nullptr; }
  // `partial` (the target's shape, written in stream order before this call, not written after)
  // is added into the target before run_backward returns.
  void defer_add(Tensor partial);

 private:
  GradSink() = default;
  GradSink(TensorImpl* leaf, Tensor* slot) : leaf_(leaf), slot_(slot) {}
  TensorImpl* leaf_ = nullptr;
  Tensor* slot_ = nullptr;
  detail::DeferredGradientAdds* deferred_ = nullptr;
};

// What a node's output is to its input's values, as far as Trainer::backward needs to know to
// refuse a loss it would normalize twice (Note [Mean-reduced losses] in
// engine/train/trainer_accumulation.cpp, Note [Loss normalized once] in engine/train/loss_checks.cpp).
enum class OutputReduction : uint8_t {
  unknown,  // the default: any other op, custom ops included
  // The input's values, unreduced: reshape, flatten, cast, a sum or mean of one element, and what
  // leaves a loss's gradient as it is (x + s, x - s, x * 1, -x).
  none,
  sum,     // a sum over elements: ops::sum, cross_entropy and mlp_cross_entropy with Reduction::Sum
  mean,    // a mean over elements: ops::mean, cross_entropy and mlp_cross_entropy with Reduction::Mean
  scaled,  // a constant multiple of its one input with a gradient: x * s, x / s, x * t, x / t (t: no gradient)
  added,   // the sum of its inputs: a + b, a - b
};

class Node {
 public:
  explicit Node(const char* name) : name_(name) {}
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const char* name() const { return name_; }
  // grad_output: gradient of the loss w.r.t. this op's output. grad_inputs[i] is input i's sink
  // (GradSink::none() for an input that needs no gradient: skip its work).
  virtual void backward(const Tensor& grad_output, std::vector<GradSink>& grad_inputs) = 0;
  // Drops saved tensors; called by the engine right after backward().
  virtual void release_saved() {}
  // How the output reduces the input (set by the op; a custom loss op may declare its own).
  OutputReduction output_reduction() const { return output_reduction_; }
  void set_output_reduction(OutputReduction reduction) { output_reduction_ = reduction; }
  // OutputReduction::scaled, for the Trainer's message: by a number (x / 2048: 2048, divides), or
  // by a tensor with no gradient (its value unread: it may be on a device).
  void set_scaled_by(float constant, bool divides) {
    set_scaled_by_tensor(divides);
    scale_constant_ = constant;
    scale_is_tensor_ = false;
  }
  void set_scaled_by_tensor(bool divides) {
    output_reduction_ = OutputReduction::scaled;
    scale_is_tensor_ = true;
    scale_divides_ = divides;
  }
  bool scale_is_tensor() const { return scale_is_tensor_; }
  float scale_constant() const { return scale_constant_; }  // a number's (scale_is_tensor() false)
  bool scale_divides() const { return scale_divides_; }
  // How many positions this op's output adds up (cross_entropy: its labels that are not
  // ignore_index), for the Trainer's units check (Note [Units checked against the loss] in
  // engine/train/loss_checks.cpp): kNoPositions where the op counts none; with `read_device`
  // false, kPositionsOnDevice where only a read of the device would tell (labels on a GPU). A
  // custom loss op may say too.
  static constexpr int64_t kNoPositions = -1;
  static constexpr int64_t kPositionsOnDevice = -2;
  virtual int64_t summed_positions(bool read_device) const {
    (void)read_device;
    return kNoPositions;
  }

  std::vector<Edge>& next_edges() { return next_edges_; }
  bool consumed() const { return consumed_; }
  void set_consumed() { consumed_ = true; }

 private:
  const char* name_;
  std::vector<Edge> next_edges_;
  bool consumed_ = false;
  OutputReduction output_reduction_ = OutputReduction::unknown;
  float scale_constant_ = 1.0f;
  bool scale_is_tensor_ = true;
  bool scale_divides_ = false;
};

// An Edge to `t`'s gradient path (node, leaf, or nothing).
Edge edge_to(const Tensor& t);
// Whether ops should record a node for these inputs (grad mode on and some input requires grad).
bool should_record(std::initializer_list<const Tensor*> inputs);
// Makes `out` the output of `node`, with one edge per input (in order).
void attach_node(Tensor& out, std::shared_ptr<Node> node,
                 std::initializer_list<const Tensor*> inputs);
// The same for an op whose number of inputs is known only at run time (ops::mlp_cross_entropy).
bool should_record(const std::vector<const Tensor*>& inputs);
void attach_node(Tensor& out, std::shared_ptr<Node> node, const std::vector<const Tensor*>& inputs);

// Called during a backward for each leaf whose gradient this backward has finished writing (every
// edge to it delivered), in the order they finish: data parallel training starts reducing a
// gradient bucket there while the rest of backward runs (Note [Data parallel accumulation] in
// engine/dist/communicator.cpp).
using LeafGradientDone = std::function<void(const TensorImpl* leaf)>;
// Called during a backward for a leaf that has no gradient buffer when its first gradient arrives:
// sets `leaf.autograd.grad` (its shape and type, marked stale). Without it, the leaf gets a buffer
// of its own (Note [Persistent gradient buffers]).
using LeafGradientBuffer = std::function<void(TensorImpl& leaf)>;

// What every backward on a thread does beside its walk while a BackwardHooksScope lives there,
// unless it is given its own on_leaf_done: ZeRO stage 2 keeps a parameter's gradient in its
// bucket's buffer, made when the bucket's first gradient arrives and reduced across the ranks and
// freed once the bucket is final (Note [ZeRO stage 2] in engine/dist/sharded_gradients.cpp), for
// the Trainer's backward and for the planner's probes, which run a caller's plain backward.
struct BackwardHooks {
  LeafGradientDone on_leaf_done;
  LeafGradientBuffer buffer_for_leaf;
  std::function<void()> after;      // once the walk has finished
  std::function<void()> abandoned;  // when the walk throws, before the exception leaves run_backward
};
class BackwardHooksScope {
 public:
  explicit BackwardHooksScope(BackwardHooks hooks);
  ~BackwardHooksScope();
  BackwardHooksScope(const BackwardHooksScope&) = delete;
  BackwardHooksScope& operator=(const BackwardHooksScope&) = delete;

 private:
  BackwardHooks hooks_;
  const BackwardHooks* outer_;
};

// Runs reverse-mode from `root` (a scalar), seeding its gradient with `seed` (a fill: one launch
// on CUDA).
void run_backward(const Tensor& root, float seed = 1.0f, const LeafGradientDone& on_leaf_done = nullptr);
// The same with the seed given as an f32 tensor of the root's shape on its device, which the
// engine reads and never writes: the Trainer keeps its seeds on the device, so a backward
// launches no fill. Here the root may have any shape (the seed is its upstream gradient).
void run_backward(const Tensor& root, const Tensor& seed, const LeafGradientDone& on_leaf_done = nullptr);

}  // namespace cumulus
