// Custom ops with their own backward, as PyTorch's torch.autograd.Function: the user writes the
// forward (inputs -> output, saving what backward needs in a context) and the backward (the
// output's gradient -> one gradient per input, as plain tensors). The engine does the rest (Note
// [Custom functions] in engine/autograd/function.cpp): the op's name on everything it allocates
// (the memory tracker's and the out-of-memory report's "<name>" and "<name> backward"), the output
// and what the forward saves counted as activations, the gradients written into their sinks
// (overwritten or accumulated, Note [Gradient sinks]), inputs that need no gradient skipped, and
// the gradients' number, shapes and types checked against the inputs with errors naming the op.
//
//   struct ScaledTanh : autograd::Function<ScaledTanh> {
//     static constexpr const char* name = "scaled_tanh";
//     static Tensor forward(autograd::FunctionContext& ctx, const std::vector<Tensor>& in, float a) {
//       Tensor y = ...;                     // a * tanh(in[0]), with any ops or the tensors' data
//       ctx.save_for_backward({y});
//       ctx.saved_data["a"] = a;
//       return y;
//     }
//     static std::vector<Tensor> backward(autograd::FunctionContext& ctx, const Tensor& dy) {
//       const Tensor& y = ctx.saved_tensors()[0];
//       return {...};                       // dy * a * (1 - (y / a)^2)
//     }
//   };
//   Tensor y = ScaledTanh::apply({x}, 2.0f);
//
// docs/custom_ops.md walks through it. One output per op (a Node has one); an input may be an
// undefined Tensor (an optional bias), which gets no gradient.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cumulus/tensor/tensor.h"

namespace cumulus::autograd {

// What the forward hands its backward. Made by apply() for each call.
class FunctionContext {
 public:
  // Tensors the backward reads (inputs, the output, or tensors the forward made: those count as
  // activations until the backward has run). Kept detached; released right after the backward.
  void save_for_backward(std::vector<Tensor> tensors);
  const std::vector<Tensor>& saved_tensors() const { return saved_; }
  // Values that are not tensors (a scale, a flag), by name.
  std::map<std::string, double> saved_data;

  // Whether input i takes a gradient: the backward may return an undefined Tensor for one that
  // does not (and skip its work).
  bool needs_input_grad(std::size_t i) const { return i < needs_grad_.size() && needs_grad_[i]; }
  std::size_t num_inputs() const { return needs_grad_.size(); }
  const char* name() const { return name_; }

 private:
  friend Tensor apply_function(const std::string&, const std::vector<Tensor>&,
                               const std::function<Tensor(FunctionContext&, const std::vector<Tensor>&)>&,
                               std::function<std::vector<Tensor>(FunctionContext&, const Tensor&)>);
  friend class FunctionNode;
  std::vector<Tensor> saved_;
  std::vector<bool> needs_grad_;
  const char* name_ = "";
};

using ForwardFunction = std::function<Tensor(FunctionContext&, const std::vector<Tensor>&)>;
using BackwardFunction = std::function<std::vector<Tensor>(FunctionContext&, const Tensor& grad_output)>;

// The custom op `name` applied to `inputs`: runs `forward` (with gradient recording off inside it,
// as PyTorch's), then, when grad mode is on and an input requires grad, records a node whose
// backward calls `backward`. Returns the forward's output (a new floating tensor; never one of the
// inputs themselves). Errors name the op.
Tensor apply_function(const std::string& name, const std::vector<Tensor>& inputs, const ForwardFunction& forward,
                      BackwardFunction backward);

// The class form: Derived has `static constexpr const char* name`, `static Tensor
// forward(FunctionContext&, const std::vector<Tensor>&, Args...)` and `static std::vector<Tensor>
// backward(FunctionContext&, const Tensor&)`; Derived::apply(inputs, args...) runs it.
template <class Derived>
struct Function {
  template <class... Args>
  static Tensor apply(const std::vector<Tensor>& inputs, Args&&... args) {
    return apply_function(
        Derived::name, inputs,
        [&](FunctionContext& ctx, const std::vector<Tensor>& in) {
          return Derived::forward(ctx, in, std::forward<Args>(args)...);
        },
        [](FunctionContext& ctx, const Tensor& grad_output) { return Derived::backward(ctx, grad_output); });
  }
};

}  // namespace cumulus::autograd
