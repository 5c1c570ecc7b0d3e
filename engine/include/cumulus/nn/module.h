// Module: a node of the model tree, with PyTorch-style dotted parameter names
// ("linear_relu_stack.0.weight"), so state dicts move between cumulus and PyTorch.
// Besides parameters a module may hold buffers: state that is saved with the model but is not
// trained (BatchNorm2d's running_mean, running_var, num_batches_tracked). Buffers get no gradient
// and are not part of named_parameters() (so FlatParameters and the optimizers never see them).
// A buffer registered as not persistent (rotary tables, causal masks: state recomputed from the
// configuration) is one of named_buffers() but not of state_dict(), as PyTorch's
// register_buffer(name, tensor, persistent=False), so a PyTorch checkpoint without it loads.
// A module is in training mode (the default) or evaluation mode; train()/eval() set the mode of
// the module and all its children, as in PyTorch.
//
// Note [Forward with any arguments]
// forward(const Tensor&) is the one-tensor interface Sequential calls. A module whose forward takes
// other arguments (a transformer block given x and the rotary tables) derives from
// CustomModule<Itself> and defines its own forward; block(x, cos, sin) then calls it, as PyTorch's
// __call__ calls forward. Such a module has no one-tensor forward unless it defines one too:
// Module::forward says so when a Sequential (or anyone) calls it.
//
// Note [Shared parameters]
// One tensor may be a parameter under several names (weight tying: a GPT's transformer.wte.weight
// is its lm_head.weight). share_parameter makes it so, as PyTorch's `lm_head.weight = wte.weight`
// does. Then, as in PyTorch, parameters() and named_parameters() list it once (under the first
// name in registration order), so FlatParameters and the optimizers hold and step it once, and
// the allocator (so the memory tracker) counts one allocation; state_dict() lists it under every
// name, so a checkpoint has both keys, as PyTorch's does. Its gradient is the sum over its uses:
// autograd accumulates both into its one gradient buffer.
//
// Note [Tied after the optimizer]
// PyTorch ties before making the optimizer; tied later, its optimizer still lists the dropped
// tensor, and skips it only because no gradient reaches it. Here the dropped tensor is frozen
// (requires_grad false) unless it is still a parameter of the module under another name, so a
// FlatParameters made before the tie leaves its slot alone at every update (Note [Frozen
// parameters] in kernels/optim_rules.h) and steps the shared tensor once: the same weights as
// tying first. The slot's bytes stay in the flat buffers until a new FlatParameters is made.
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

  // The one-tensor forward (Note [Forward with any arguments]); a module that does not define it
  // throws InvalidArgument when it is called.
  virtual Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }

  // Parameters of this module and its children, in registration order, with dotted names. A
  // tensor registered under several names (Note [Shared parameters]) is listed once, under its
  // first name, unless remove_duplicate is false (PyTorch's argument of the same name).
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool remove_duplicate = true) const;
  std::vector<Tensor> parameters() const;  // each tensor once
  int64_t num_parameters() const;
  // Every parameter's gradient buffer is marked stale (the next backward overwrites it).
  void zero_grad() const;

  // Buffers of this module and its children, in registration order, with dotted names (the
  // persistent ones and the others, as PyTorch's).
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;
  // Everything a checkpoint of the model holds, in PyTorch's state_dict order: for each module its
  // parameters, then its persistent buffers (both in registration order), then its children's entries. The
  // tensors are the module's own handles (copy_from into them to load values). A shared parameter
  // is there under each of its names.
  std::vector<std::pair<std::string, Tensor>> state_dict() const;

  // PyTorch's `module.<name> = tensor` for an existing parameter (Note [Shared parameters]): the
  // parameter `name` (dotted through children: "lm_head.weight") becomes `tensor` itself, a leaf
  // that requires grad (another module's parameter) of the same shape, dtype and device, and the
  // tensor it held is dropped (and frozen: Note [Tied after the optimizer]), so ties made before
  // or after FlatParameters or an optimizer took the parameters train alike.
  // Only parameters registered with a slot (register_parameter(name, slot, ...)) can be replaced,
  // since the module reads its parameter through that member.
  void share_parameter(const std::string& name, const Tensor& tensor);

  // Training (true, the default) or evaluation mode, for this module and every child.
  Module& train(bool on = true);
  Module& eval() { return train(false); }
  bool is_training() const { return training_; }

 protected:
  // Makes a parameter from initial values: copied to `device` in category parameters, requires
  // grad, with its persistent gradient buffer allocated now (category gradients).
  Tensor register_parameter(const std::string& name, const Tensor& initial, Device device);
  // The same, stored in the member `slot` the module reads it through: share_parameter can then
  // replace it (the pointer to the member stays valid: modules are neither copied nor moved).
  void register_parameter(const std::string& name, Tensor& slot, const Tensor& initial, Device device);
  // Registers `tensor` itself as a buffer (the module keeps this handle; no copy, no grad);
  // persistent false keeps it out of state_dict().
  Tensor register_buffer(const std::string& name, const Tensor& tensor, bool persistent = true);
  // Makes a buffer from initial values: copied to `device` in category parameters (model state
  // that lives as long as the model), requires no grad.
  Tensor register_buffer(const std::string& name, const Tensor& initial, Device device, bool persistent = true);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    children_.emplace_back(name, module);
    return module;
  }

 private:
  enum class What { parameters, buffers, state };  // state: parameters and persistent buffers
  void collect(const std::string& prefix, What what, std::vector<std::pair<std::string, Tensor>>& out) const;
  struct Parameter {
    std::string name;
    Tensor tensor;
    Tensor* slot;  // the subclass's member holding it, or null (then it cannot be replaced)
  };
  std::vector<Parameter> parameters_;
  struct Buffer {
    std::string name;
    Tensor tensor;
    bool persistent;
  };
  std::vector<Buffer> buffers_;
  bool training_ = true;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

// A module whose forward takes its own arguments (Note [Forward with any arguments]):
//   struct Block : nn::CustomModule<Block> {
//     Tensor forward(const Tensor& x, const Tensor& cos, const Tensor& sin);
//   };
//   y = (*block)(x, cos, sin);
template <typename Derived>
class CustomModule : public Module {
 public:
  using Module::forward;
  template <typename... Args>
  decltype(auto) operator()(Args&&... args) {
    return static_cast<Derived&>(*this).forward(std::forward<Args>(args)...);
  }
};

// PyTorch's nn.ModuleList: modules held in order under the names "0", "1", ... (state-dict names
// "layers.3.attn.weight" when registered as "layers"), with no forward of its own: a model
// iterates over it, calling each module with its own arguments.
class ModuleList : public Module {
 public:
  ModuleList() = default;
  // Appends `module` under the name of its index; returns it, typed as given.
  template <typename M>
  std::shared_ptr<M> add(std::shared_ptr<M> module) {
    append(module);
    return module;
  }
  std::size_t size() const { return modules_.size(); }
  Module& operator[](std::size_t i) const;
  // The module at i as its own type M (InvalidArgument when it is not one), to call with M's
  // arguments: layers.at<Block>(i)(x, cos, sin).
  template <typename M>
  M& at(std::size_t i) const {
    auto* m = dynamic_cast<M*>(&(*this)[i]);
    if (m == nullptr) wrong_type(i);
    return *m;
  }
  std::vector<std::shared_ptr<Module>>::const_iterator begin() const { return modules_.begin(); }
  std::vector<std::shared_ptr<Module>>::const_iterator end() const { return modules_.end(); }

 private:
  void append(std::shared_ptr<Module> module);
  [[noreturn]] void wrong_type(std::size_t i) const;
  std::vector<std::shared_ptr<Module>> modules_;
};

}  // namespace cumulus::nn
