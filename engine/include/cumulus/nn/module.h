// Module: a node of the model tree, with PyTorch-style dotted parameter names
// ("linear_relu_stack.0.weight"), so state dicts move between cumulus and PyTorch.
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

 protected:
  // Makes a parameter from initial values: copied to `device` in category parameters, requires
  // grad, with its persistent gradient buffer allocated now (category gradients).
  Tensor register_parameter(const std::string& name, const Tensor& initial, Device device);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    children_.emplace_back(name, module);
    return module;
  }

 private:
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const;
  std::vector<std::pair<std::string, Tensor>> parameters_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

}  // namespace cumulus::nn
