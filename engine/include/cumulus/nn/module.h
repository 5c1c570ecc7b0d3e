// Module: a node of the model tree, with PyTorch-style dotted parameter names
// ("linear_relu_stack.0.weight"), so state dicts move between cumulus and PyTorch.
// Besides parameters a module may hold buffers: state that is saved with the model but is not
// trained (BatchNorm2d's running_mean, running_var, num_batches_tracked). Buffers get no gradient
// and are not part of named_parameters() (so FlatParameters and the optimizers never see them).
// A module is in training mode (the default) or evaluation mode; train()/eval() set the mode of
// the module and all its children, as in PyTorch.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cumulus/tensor/random.h"
#include "cumulus/tensor/tensor.h"

namespace cumulus::nn {

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }

  // Parameters of this module and its children, in registration order, with dotted names.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  int64_t num_parameters() const;
  // Every parameter's gradient buffer is marked stale (the next backward overwrites it).
  void zero_grad() const;

  // Buffers of this module and its children, in registration order, with dotted names.
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;
  // Everything a checkpoint of the model holds, in PyTorch's state_dict order: for each module its
  // parameters, then its buffers (both in registration order), then its children's entries. The
  // tensors are the module's own handles (copy_from into them to load values).
  std::vector<std::pair<std::string, Tensor>> state_dict() const;

  // Training (true, the default) or evaluation mode, for this module and every child.
  Module& train(bool on = true);
  Module& eval() { return train(false); }
  bool is_training() const { return training_; }

 protected:
  // Makes a parameter from initial values: copied to `device` in category parameters, requires
  // grad, with its persistent gradient buffer allocated now (category gradients).
  Tensor register_parameter(const std::string& name, const Tensor& initial, Device device);
  // Registers `tensor` itself as a buffer (the module keeps this handle; no copy, no grad).
  Tensor register_buffer(const std::string& name, const Tensor& tensor);
  // Makes a buffer from initial values: copied to `device` in category parameters (model state
  // that lives as long as the model), requires no grad.
  Tensor register_buffer(const std::string& name, const Tensor& initial, Device device);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    children_.emplace_back(name, module);
    return module;
  }

 private:
  enum class What { parameters, buffers, both };
  void collect(const std::string& prefix, What what, std::vector<std::pair<std::string, Tensor>>& out) const;
  std::vector<std::pair<std::string, Tensor>> parameters_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  bool training_ = true;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

}  // namespace cumulus::nn
